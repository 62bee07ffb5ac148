"""Cluster mode: real NATS servers (JetStream), real streamtx hosts, SIGKILLed hosts and NATS nodes.

Every host runs every entry of the input log in log order; the checks are
that every host ends with the same tables, equal to a plain count of the
batches acknowledged (each exactly once), whatever was killed meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import SCRIPT, batch, cluster, expected, start_host, tables, wait_for
from support.processes import Launched

from streamtx import errors, wire
from streamtx.client import Client
from streamtx.server.cluster.natsd import NatsCluster
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.wire import encode_rowdata

pytestmark = pytest.mark.slow


def test_every_host_runs_the_log_in_one_order_and_a_killed_host_catches_up(tmp_path: Path) -> None:
    with NatsCluster(tmp_path / "nats", 1) as nats:
        a, b = start_host(tmp_path, "a", nats), start_host(tmp_path, "b", nats)
        try:
            with Client(a.target, producer_id="p") as c:
                c.deploy(SCRIPT)  # through the log: b gets the catalog too
                futures = [c.push("s", batch(k), batch_id=k) for k in range(1, 301)]
                assert {f.result().outcome for f in futures[:100]} == {"committed"}
                b.proc.kill()  # SIGKILL, mid-stream
                b.proc.wait()
                assert {f.result().outcome for f in futures} == {"committed"}
                futures = [c.push("s", batch(k), batch_id=k) for k in range(301, 401)]
                assert {f.result().outcome for f in futures} == {"committed"}
            b = start_host(tmp_path, "b", nats)  # same data directory: recovers, then reads the log on
            acked = set(range(1, 401))
            wait_for([a, b], expected(acked))
            assert tables(a.target) == tables(b.target)

            with Client(b.target, producer_id="p") as c:
                # a re-sent batch is DUPLICATE on any host; the producer goes on where it was, on another host
                again = c.push_one("s", batch(5), batch_id=5)
                assert (again.outcome, again.original) == ("duplicate", "committed")
                futures = [c.push("s", batch(k), batch_id=k) for k in range(401, 451)]
                assert {f.result().outcome for f in futures} == {"committed"}
                c.call("add_to", g=3, amount=1000)  # a call goes through the log as well
                # a batch ahead of its producer's order is refused at once, the same way on every host
                early = c.push_one("s", batch(999), batch_id=460)
                assert (early.outcome, early.code) == ("rejected", errors.FailedPrecondition.code)
            # a staged (two-phase, Spark's) batch commits through the log as one push; re-committed: DUPLICATE
            rows = encode_rowdata(pa.table({"k": [451], "v": [451 % 5]}))
            a.stub.Stage(pb.StageRequest(stream="s", staging_id="st", part="p0", chunk=0, data=rows))
            commit = pb.CommitStagedRequest(
                stream="s",
                staging_id="st",
                producer_id="p",
                batch_id=451,
                parts=[pb.StagedPart(part="p0", chunks=1, rows=1)],
            )
            assert a.stub.CommitStaged(commit).outcome == pb.COMMITTED
            assert a.stub.CommitStaged(commit).outcome == pb.DUPLICATE
            acked |= set(range(401, 452))
            wait_for([a, b], expected(acked, {3: 1000}))
            assert tables(a.target) == tables(b.target)
            assert [k for k, _ in tables(a.target)[1]] == sorted(acked)

            verified = cluster(nats, "verify")  # a digest of every host's tables at one log position
            assert verified["differences"] == [] and verified["missing"] == []
            assert sorted(verified["hosts"]) == ["a", "b"]
            assert len({r["state"] for r in verified["hosts"].values()}) == 1

            status = cluster(nats, "status")
            assert [h["host"] for h in status["hosts"]] == ["a", "b"]
            assert status["log"]["entries"] == status["log"]["last"] > 4  # pushes go packed: fewer entries than batches
            deadline = time.monotonic() + 10
            while any(h["lag"] for h in status["hosts"]) and time.monotonic() < deadline:
                time.sleep(0.5)
                status = cluster(nats, "status")
            assert [(h["lag"], h["applied"]) for h in status["hosts"]] == [(0, status["log"]["last"])] * 2
            with Client(b.target) as c:  # a host's own Status says how far it has run the log
                assert c.status()["counters"]["cluster_applied"] == status["log"]["last"]

            c = start_host(tmp_path, "c", nats)  # a new host, empty: runs the log from its first entry
            try:
                wait_for([c], expected(acked, {3: 1000}))
                assert tables(c.target) == tables(a.target)
                verified = cluster(nats, "verify")
                assert sorted(verified["hosts"]) == ["a", "b", "c"] and verified["differences"] == []
            finally:
                c.close()
        finally:
            a.close()
            b.close()


CHECKPOINTS = ("--checkpoint-every", "1")
RESUME_WITHIN_S = 15.0
"""The longest a producer may go without an acknowledgement while a host and then a NATS node die."""


def test_acknowledged_batches_survive_a_killed_host_and_a_killed_nats_node(tmp_path: Path) -> None:
    """Three NATS nodes keep the log (R3), three hosts run it; the producer's client names every host and fails
    over by itself when its host dies; then a NATS node dies; the dead host comes back and catches up. Every
    host checkpoints each second meanwhile, so snapshots are shared and the log trimmed throughout."""
    rng = random.Random(7)
    with NatsCluster(tmp_path / "nats", 3) as nats:
        hosts = [start_host(tmp_path, name, nats, 3, 1, *CHECKPOINTS) for name in "abc"]
        first = hosts[0]
        try:
            with Client(",".join(h.target for h in hosts), producer_id="p") as c:
                c.deploy(SCRIPT)
                futures: list = []
                acked_at: list[float] = []

                def produce() -> None:
                    for k in range(1, 2401):
                        future = c.push("s", batch(k), batch_id=k)
                        future.add_done_callback(lambda _: acked_at.append(time.monotonic()))
                        futures.append(future)

                producer = threading.Thread(target=produce)
                started = time.monotonic()
                producer.start()
                time.sleep(rng.uniform(0.3, 0.8))
                unanswered = sum(not f.done() for f in list(futures))
                first.proc.kill()  # the client re-sends what it had not acknowledged to the next host, same ids
                first.proc.wait()
                time.sleep(rng.uniform(0.3, 0.8))
                nats.kill(rng.randrange(3))  # the log keeps a majority: appends go on after an election
                producer.join(timeout=120)
                outcomes = [f.result(timeout=90) for f in futures]
                assert c.target != first.target
            assert unanswered > 0  # the kill came while batches were in flight
            assert [r.batch_id for r in outcomes] == list(range(1, 2401))
            assert {r.outcome for r in outcomes} <= {"committed", "duplicate"}
            assert all(r.original in (None, "committed") for r in outcomes)
            gaps = [b - a for a, b in zip([started, *sorted(acked_at)], sorted(acked_at), strict=False)]
            assert max(gaps) < RESUME_WITHIN_S, max(gaps)
            hosts[0] = start_host(tmp_path, "a", nats, 3, 1, *CHECKPOINTS)  # the killed host comes back, catches up
            wait_for(hosts, expected(set(range(1, 2401))), timeout=90)
            assert tables(hosts[0].target) == tables(hosts[1].target) == tables(hosts[2].target)
            assert len(tables(hosts[2].target)[1]) == 2400
            verified = cluster(nats, "verify")
            assert sorted(verified["hosts"]) == ["a", "b", "c"] and verified["differences"] == []
        finally:
            for h in hosts:
                h.close()


PROCEDURE = """
from streamtx.procedure import Tx, procedure


@procedure
def tally(tx: Tx) -> None:
    tx.sql("INSERT INTO t SELECT k, v * $factor FROM s", {"factor": FACTOR})
"""


def test_hosts_whose_states_differ_are_reported_loudly(tmp_path: Path) -> None:
    """Every host needs the same procedures; a host with other code diverges, and `cluster verify` says where."""
    with NatsCluster(tmp_path / "nats", 1) as nats:
        hosts = []
        for name, factor in (("a", 1), ("b", 2)):
            code = tmp_path / f"procedures-{name}"
            code.mkdir()
            (code / "app.py").write_text(PROCEDURE.replace("FACTOR", str(factor)))
            extra = ["--cluster", nats.urls[0], "--host-id", name, "--procedures-path", str(code)]
            hosts.append(Launched(tmp_path / name, 1, extra))
        try:
            with Client(hosts[0].target) as c:
                c.deploy(
                    "CREATE TABLE t (k BIGINT, v BIGINT); CREATE STREAM s (k BIGINT, v BIGINT);"
                    "CREATE PROCEDURE p ON STREAM s AS PYTHON 'app:tally';"
                )
                for k in range(1, 21):
                    assert c.push_one("s", {"k": [k], "v": [k]}).outcome == "committed"
            verified = cluster(nats, "verify", returncode=1)
            assert sorted(verified["hosts"]) == ["a", "b"]
            [line] = verified["differences"]
            assert line.startswith("table t: a 20 rows") and "b 20 rows" in line
            deadline = time.monotonic() + 30
            while not all("hold different states" in h.stderr() for h in hosts):  # each host says so too
                assert time.monotonic() < deadline, [h.stderr() for h in hosts]
                time.sleep(0.2)
        finally:
            for h in hosts:
                h.close()


def test_a_host_refuses_a_log_made_anew_since_it_last_ran(tmp_path: Path) -> None:
    """Positions name entries of one log: a host that ran a deleted log must not read a new one from its position."""
    from streamtx.server.cluster.inputlog import InputLog

    async def delete_log(urls: str) -> None:
        log = InputLog(urls, "main", 1)
        await log.open(create=False)
        await log.delete()
        await log.close()

    with NatsCluster(tmp_path / "nats", 1) as nats:
        host = start_host(tmp_path, "a", nats, partitions=1)
        with Client(host.target) as c:
            c.deploy(SCRIPT)
            assert c.push_one("s", batch(1)).outcome == "committed"
        time.sleep(1.0)  # the position is saved every 0.5 s
        host.proc.terminate()
        host.proc.wait(timeout=30)
        asyncio.run(delete_log(nats.urls[0]))
        with pytest.raises(AssertionError, match="was created anew"):
            start_host(tmp_path, "a", nats, partitions=1)


def test_pushes_larger_than_a_nats_message_go_as_several_entries_or_beside_the_log(tmp_path: Path) -> None:
    """NATS takes 1 MB a message by default; a packed message of 8 batches, 1.3 MB of rows, is split between them;
    a single batch of 1.3 MB goes beside the log (its body in an object store, its entry naming it), and the
    trim that drops its entry deletes it."""
    with NatsCluster(tmp_path / "nats", 1) as nats:
        a, b = start_host(tmp_path, "a", nats, partitions=1), start_host(tmp_path, "b", nats, partitions=1)
        try:
            with Client(a.target) as c:
                c.deploy(SCRIPT)
            keys = pa.array(range(1, 80_001), pa.int64())
            rows = pa.table({"k": keys, "v": pc.remainder(keys, 5)})
            request = pb.PushRequest(
                stream="s", producer_id="big", batch_id=1, data=encode_rowdata(rows), batch_rows=[10_000] * 8
            )
            assert request.ByteSize() > 1_048_576
            acks = list(a.stub.PushStream(iter([request])))
            assert sum(max(ack.count, 1) for ack in acks) == 8 and {ack.outcome for ack in acks} == {pb.COMMITTED}
            assert [ack.batch_id for ack in acks][0] == 1
            wait_for([a, b], expected(set(range(1, 80_001))), timeout=60)
            status = cluster(nats, "status")
            assert status["log"]["entries"] >= 3 and status["log"]["beside"]["bodies"] == 0  # deploy, 2+ parts

            keys = pa.array(range(80_001, 160_001), pa.int64())
            one = pb.PushRequest(
                stream="s", producer_id="big", batch_id=9, data=encode_rowdata(pa.table({"k": keys, "v": keys}))
            )
            assert one.ByteSize() > 1_048_576
            assert [ack.outcome for ack in a.stub.PushStream(iter([one]))] == [pb.COMMITTED]
            again = [ack.outcome for ack in b.stub.PushStream(iter([one]))]  # re-sent to the other host
            assert again == [pb.DUPLICATE]
            deadline = time.monotonic() + 60
            while any(len(tables(h.target)[1]) < 160_000 for h in (a, b)):
                assert time.monotonic() < deadline, "the large batch did not reach both hosts"
                time.sleep(0.2)
            assert tables(a.target) == tables(b.target)
            beside = cluster(nats, "status")["log"]["beside"]
            assert beside["bodies"] == 2 and beside["bytes"] > 2 * 1_048_576  # the batch, and its re-sent copy
            time.sleep(1.5)  # each host has said how far it applied the log

            deadline = time.monotonic() + 60
            while cluster(nats, "status")["log"]["beside"]["bodies"]:
                with Client(a.target) as c:
                    c.checkpoint()
                time.sleep(1.0)
                assert time.monotonic() < deadline, "trimming the log left its bodies beside it"
        finally:
            a.close()
            b.close()


def test_a_call_runs_once_on_a_host_that_dies_around_it(tmp_path: Path) -> None:
    """A call has no dedup mark. A host killed just after running one has saved its position past it already
    (not within SAVE_EVERY); and at the worst moment, the call committed and the position past it not saved, its
    position file names the call as running and its recovered state reaches the call's timestamp. Either way the
    host does not run the call again when it comes back."""
    with NatsCluster(tmp_path / "nats", 1) as nats:
        a, b = start_host(tmp_path, "a", nats, partitions=1), start_host(tmp_path, "b", nats, partitions=1)

        def call(amount: int) -> tuple[int, int]:
            """add_to through host a; its log position and timestamp, once host b has run it too."""
            request = pb.CallRequest(procedure="add_to", params=wire.params_to_proto({"g": 3, "amount": amount}))
            ts = a.stub.Call(request).timestamp
            with Client(a.target) as c:
                position = c.status()["counters"]["cluster_applied"]  # the call's entry: nothing came after it
            with Client(b.target) as c:
                while c.status()["counters"].get("cluster_applied", 0) < position:
                    time.sleep(0.01)
            return position, ts

        def converged(added: int) -> None:
            want = expected({1}, {3: added})
            wait_for([a, b], want)
            time.sleep(1.0)  # a call run again would show by now
            assert tables(b.target) == tables(a.target) and tables(b.target)[0] == want

        try:
            with Client(a.target, producer_id="p") as c:
                c.deploy(SCRIPT)
                assert c.push_one("s", batch(1)).outcome == "committed"
            call(1000)
            time.sleep(0.05)  # well inside SAVE_EVERY (0.5 s)
            b.proc.kill()
            b.proc.wait()
            b = start_host(tmp_path, "b", nats, partitions=1)
            converged(1000)

            position, ts = call(10)
            b.proc.terminate()  # a clean stop saves the position past the call ...
            assert b.proc.wait(30) == 0
            saved = tmp_path / "b" / "cluster.json"
            record = json.loads(saved.read_text())
            assert record["applied"] == position and "calling" not in record
            # ... which a crash just after the call's commit would have left as it was while the call ran
            running = {"applied": position - 1, "calling": {"position": position, "ts": ts}}
            saved.write_text(json.dumps({**record, **running}))
            b = start_host(tmp_path, "b", nats, partitions=1)
            converged(1010)
        finally:
            a.close()
            b.close()
