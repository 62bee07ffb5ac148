"""Worker supervision: a partition worker killed with SIGKILL comes back by itself.

The server runs 2 partitions with a command log; a producer keeps pushing
batches (local ones and ones spanning both partitions) while workers are
killed at random points. Every batch must get the outcome a plain
sequential reference gives it, and the final tables must be the
reference's: nothing lost, nothing applied twice, no batch refused because
of the failure.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import signal
import time

import grpc
import pyarrow as pa
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.acks import expand
from support.partitions import ACCOUNTS, ACCOUNTS_ON, HITS, deposits
from support.processes import Launched, workers_of

from streamtx.client import Client
from streamtx.errors import DataLoss
from streamtx.server.embedded import EmbeddedServer
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import table_to_ipc

pytestmark = pytest.mark.timeout(300)


CHECKPOINTS = ["--checkpoint-every", "0.5"]
"""Online checkpoints run all along, so kills also land while one is written."""


def random_batches(rng: random.Random, n: int) -> list[list[tuple[int, int]]]:
    """Batches of 1-3 deposits; some withdraw more than an account holds (the CHECK rejects those)."""
    out = []
    for _ in range(n):
        sides = rng.choice([[0], [1], [0, 1]])
        rows = []
        for _ in range(rng.randint(1, 3)):
            account = rng.choice(ACCOUNTS_ON[rng.choice(sides)])
            rows.append((account, rng.randint(-12, 10)))
        out.append(rows)
    return out


def reference(batches: list[list[tuple[int, int]]]) -> tuple[list[str], dict[int, int], int]:
    """Each batch applied alone, in order: outcomes, balances, audit rows."""
    balances: dict[int, int] = {}
    outcomes, audit = [], 0
    for batch in batches:
        trial = dict(balances)
        for account, amount in batch:
            trial[account] = trial.get(account, 0) + amount
        if all(v >= 0 for v in trial.values()):
            balances, audit = trial, audit + len(batch)
            outcomes.append("committed")
        else:
            outcomes.append("rejected")
    return outcomes, balances, audit


def pid_of(client: Client, partition: int) -> int:
    deadline = time.monotonic() + 60
    while True:
        parts = client.status()["partitions"]
        if all(p["alive"] and not p["error"] for p in parts) or time.monotonic() > deadline:
            return parts[partition]["pid"]
        time.sleep(0.05)


def final_state(client: Client) -> tuple[dict[int, int], int]:
    balances = dict(client.query("SELECT account, balance FROM balances").fetchall())
    return balances, client.query("SELECT count(*) FROM audit").fetchall()[0][0]


@pytest.mark.parametrize("durability", ["strong", "weak"])
@pytest.mark.parametrize("seed", [1, 2])
def test_killed_workers_come_back_with_nothing_lost_or_applied_twice(tmp_path, durability, seed):
    rng = random.Random(seed)
    batches = random_batches(rng, 240)
    kills = sorted(rng.sample(range(10, 230), 3))
    with (
        EmbeddedServer(tmp_path / "data", partitions=2, durability=durability, extra_args=CHECKPOINTS) as srv,
        Client(srv.target) as c,
    ):
        c.deploy(ACCOUNTS)
        c.call("set_fee", kind="deposit", fee=0)
        c.deploy(HITS)
        futures, hits, want_hits = [], [], {}

        def hit(n: int) -> None:
            for _ in range(n):
                account = rng.choice(ACCOUNTS_ON[rng.randint(0, 1)])
                want_hits[account] = want_hits.get(account, 0) + 1
                hits.append(c.push("hits", {"account": [account], "n": [1]}))

        for i, batch in enumerate(batches):
            if i in kills:
                victim = pid_of(c, rng.randint(0, 1))
                hit(rng.randint(0, 60))  # in flight when it dies
                os.kill(victim, signal.SIGKILL)
            futures.append(c.push("deposits", deposits(batch)))
            hit(3)
        outcomes = [f.result(timeout=120).outcome for f in futures]
        want_outcomes, want_balances, want_audit = reference(batches)
        assert outcomes == want_outcomes
        assert final_state(c) == (want_balances, want_audit)
        assert {f.result(timeout=120).outcome for f in hits} == {"committed"}
        assert dict(c.query("SELECT account, n FROM hit_counts").fetchall()) == want_hits
        status = c.status()
        assert status["counters"]["restarts"] >= 1
        assert all(p["alive"] and not p["error"] for p in status["partitions"])
        # and what was recovered survives a restart of the whole server
        srv.stop()
    with EmbeddedServer(tmp_path / "data", partitions=2, durability=durability) as srv, Client(srv.target) as c:
        assert final_state(c) == (want_balances, want_audit)


def test_a_call_and_a_query_wait_for_the_restart_instead_of_failing(tmp_path):
    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target) as c:
        c.deploy(ACCOUNTS)
        c.call("set_fee", kind="deposit", fee=0)
        a, b = ACCOUNTS_ON[0][0], ACCOUNTS_ON[1][0]
        assert c.push("deposits", deposits([(a, 5), (b, 7)])).result(timeout=60).outcome == "committed"
        os.kill(pid_of(c, 1), signal.SIGKILL)
        c.call("open_account", account=ACCOUNTS_ON[1][1])
        assert final_state(c)[0] == {a: 5, b: 7, ACCOUNTS_ON[1][1]: 0}
        assert c.push("deposits", deposits([(a, 1), (b, 1)])).result(timeout=60).outcome == "committed"
        assert final_state(c)[0] == {a: 6, b: 8, ACCOUNTS_ON[1][1]: 0}


def test_health_is_not_serving_while_the_workers_restart_then_serving(tmp_path):
    with (
        EmbeddedServer(tmp_path / "data", partitions=2) as srv,
        Client(srv.target) as c,
        grpc.insecure_channel(srv.target) as channel,
    ):
        c.deploy(ACCOUNTS)
        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="streamtx.v1.StreamTx")
        seen = []
        os.kill(pid_of(c, 0), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = health.Check(request, timeout=10).status
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == health_pb2.HealthCheckResponse.SERVING and len(seen) > 1:
                break
            time.sleep(0.01)
        assert seen[-2:] == [health_pb2.HealthCheckResponse.NOT_SERVING, health_pb2.HealthCheckResponse.SERVING]
        assert c.status()["counters"]["restarts"] == 1


@pytest.mark.parametrize("partitions", [1, 2])
def test_batches_a_dead_worker_applied_but_did_not_answer_get_their_first_outcome(tmp_path, monkeypatch, partitions):
    """The worker dies with acks durable but unsent: its successor answers them from the log, nothing runs twice.

    The batches go 20 to a message; at P = 1 each message reaches the worker as one push run, answered
    partly before the death and the rest by the successor."""
    flag = tmp_path / "died"
    monkeypatch.setenv("STREAMTX_FAULT_EXIT_BEFORE_ACK", f"{partitions - 1}:30:{flag}")
    with EmbeddedServer(tmp_path / "data", partitions=partitions) as srv, Client(srv.target) as c:
        c.deploy(HITS)
        accounts = ACCOUNTS_ON[partitions - 1]
        table = pa.table({"account": [accounts[i % 4] for i in range(200)], "n": list(range(200))})
        messages = [
            pb.PushRequest(
                stream="hits",
                producer_id="p",
                batch_id=first + 1,
                data=pb.RowData(arrow_ipc=table_to_ipc(table.slice(first, 20))),
                batch_rows=[1] * 20,
            )
            for first in range(0, 200, 20)
        ]
        with grpc.insecure_channel(srv.target) as channel:
            acks = expand(list(pb_grpc.StreamTxStub(channel).PushStream(iter(messages), timeout=120)))
        assert flag.exists()
        assert [(b, o) for b, o, _, _ in acks] == [(b, pb.COMMITTED) for b in range(1, 201)]
        assert len({t for *_, t in acks}) == 200 and all(t > 0 for *_, t in acks)
        want = {a: sum(i for i in range(200) if accounts[i % 4] == a) for a in accounts}
        assert dict(c.query("SELECT account, n FROM hit_counts").fetchall()) == want
        counters = c.status()["counters"]
        assert counters["restarts"] == 1
        assert (counters.get("push_runs", 0) == 10) == (partitions == 1)


def test_a_call_a_dead_worker_committed_but_did_not_answer_is_data_loss_not_run_twice(tmp_path, monkeypatch):
    flag = tmp_path / "died"
    monkeypatch.setenv("STREAMTX_FAULT_EXIT_BEFORE_ACK", f"1:2:{flag}")  # after the start-up and deploy installs
    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target) as c:
        c.deploy(ACCOUNTS)
        account = ACCOUNTS_ON[1][0]
        with pytest.raises(DataLoss, match=r"call open_account: it committed \(timestamp \d+\) on partition 1"):
            c.call("open_account", account=account)
        assert flag.exists()
        assert c.query("SELECT account, balance FROM balances").fetchall() == [(account, 0)]


def test_a_full_disk_holds_acknowledgements_until_space_returns(tmp_path):
    """Log writes fail (RLIMIT_FSIZE: a write past 4 MB fails with EFBIG, as on a full disk).

    The worker that cannot log stops acknowledging and dies; the restarted ones
    die too while the disk stays full, and nothing is acknowledged meanwhile.
    Once space returns, the next restart takes every waiting batch: all
    committed, each once. (The server's stderr file is held by the same
    limit: 4 MB leaves room for thousands of restart messages.)
    """
    limit = 4_000_000
    srv = Launched(tmp_path / "data", partitions=2, extra=["--max-restarts", "100000"])
    try:
        with Client(srv.target) as c:
            c.deploy(HITS)
            pids = [srv.proc.pid] + [p["pid"] for p in c.status()["partitions"]]
            for pid in pids:  # soft limit only, so it can be raised again; new workers inherit the front's
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            rows, batches = 5_000, 120  # ~10 MB of log records; fewer batches than the client's window
            futures = []
            for i in range(batches):
                accounts = [ACCOUNTS_ON[i % 2][j % 4] for j in range(rows)]
                futures.append(c.push("hits", {"account": accounts, "n": [1] * rows}))
            deadline = time.monotonic() + 240  # a hang guard, below pytest's timeout so the server's stderr shows
            while srv.stderr().count("restarting the partition workers") < 3:
                assert time.monotonic() < deadline, srv.stderr()[-3000:]
                time.sleep(0.1)
            assert "File too large" in srv.stderr()
            waited = sum(not f.done() for f in futures)
            unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, unlimited)
            for pid, _line in workers_of(srv.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    resource.prlimit(pid, resource.RLIMIT_FSIZE, unlimited)
            assert [f.result(timeout=120).outcome for f in futures] == ["committed"] * batches
            assert waited > 0  # some waited for the space
            counts = dict(c.query("SELECT account, n FROM hit_counts").fetchall())
            assert counts == {a: batches * rows // 8 for a in ACCOUNTS_ON[0] + ACCOUNTS_ON[1]}
    finally:
        srv.close()


def test_a_worker_dying_right_after_its_last_recovery_request_is_recovered_too(tmp_path, monkeypatch):
    """Its death failed no request and came while no one watched: the push replayed to it waited for ever."""
    armed = tmp_path / "exit-after-recovery"
    monkeypatch.setenv("STREAMTX_FAULT_EXIT_AFTER_RECOVERY", f"1:{armed}")
    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target, timeout=60) as c:
        c.deploy(HITS)
        for p in (0, 1):
            assert c.push("hits", {"account": [ACCOUNTS_ON[p][0]], "n": [1]}).result(timeout=60).outcome == "committed"
        armed.write_text("the next recovery\n")
        os.kill(c.status()["partitions"][0]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not c.status()["counters"].get("restarts"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        late = c.push("hits", {"account": [ACCOUNTS_ON[1][0]], "n": [1]})  # sent to partition 1's successor
        assert late.result(timeout=60).outcome == "committed"
        assert (tmp_path / "exit-after-recovery.fired").exists()  # partition 1's new worker died after recovering
        assert dict(c.query("SELECT account, n FROM hit_counts").fetchall()) == {
            ACCOUNTS_ON[0][0]: 1,
            ACCOUNTS_ON[1][0]: 2,
        }
        assert c.status()["counters"]["restarts"] >= 2


def test_a_worker_killed_during_the_recovery_of_another_is_recovered_too(tmp_path):
    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target) as c:
        c.deploy(HITS)
        want: dict[int, int] = {}
        futures = []
        for i in range(3000):  # a log that takes a moment to replay
            account = ACCOUNTS_ON[i % 2][i % 4]
            want[account] = want.get(account, 0) + 1
            futures.append(c.push("hits", {"account": [account], "n": [1]}))
        assert {f.result(timeout=120).outcome for f in futures} == {"committed"}
        old = [p["pid"] for p in c.status()["partitions"]]
        os.kill(old[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:  # the new worker of partition 1, while it replays its log (Status would wait for it)
            new = [pid for pid, line in workers_of(srv.proc.pid) if "--partition 1 " in line and pid != old[1]]
            if new:
                break
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)
        os.kill(new[0], signal.SIGKILL)
        account = ACCOUNTS_ON[1][0]
        assert c.push("hits", {"account": [account], "n": [1]}).result(timeout=120).outcome == "committed"
        want[account] = want.get(account, 0) + 1
        assert dict(c.query("SELECT account, n FROM hit_counts").fetchall()) == want
        assert c.status()["counters"]["restarts"] >= 2
