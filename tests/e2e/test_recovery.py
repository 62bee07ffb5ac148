"""Durability: real servers killed with SIGKILL, restarted on the same data directory.

The producer re-sends every batch it has no acknowledgement for, in batch-id
order, after each restart. The final state must equal the sequential
reference over all batches: an acknowledged batch that was lost, or a batch
applied twice, would show. Crashes land during pushes, during the periodic
online checkpoints (every 0.4 s) and during recovery itself.
"""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from support.partitions import ACCOUNTS_ON, HITS

from streamtx.client import Client
from streamtx.errors import Unauthenticated
from streamtx.procedures.tstream import sl
from streamtx.procedures.tstream.common import run_reference
from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params
from streamtx.procedures.voter.reference import SERVER_QUERIES, VoterReference
from streamtx.procedures.voter.state import QUERIES as STATE_QUERIES
from streamtx.recovery import LogReader, RecordKind, decode_command
from streamtx.server.embedded import EmbeddedServer

pytestmark = pytest.mark.timeout(900)

CONFIGS = [("strong", 1), ("weak", 1), ("strong", 2), ("weak", 2)]
CRASHES = int(os.environ.get("STREAMTX_CRASHES", "6"))
"""Kills per test (10 tests); where each lands depends on timing, so every run meets new crash points (more: a
longer hunt)."""
BATCH = 4


def rows_of(table: pa.Table) -> list[tuple]:
    return list(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


def push_until_killed(srv: EmbeddedServer, stream: str, batches: list[pa.Table], first: int, delay: float) -> int:
    """Pushes batches `first`, `first + 1`, ... pipelined; SIGKILLs the server after `delay` seconds.

    Returns the first batch id without an acknowledgement (acks come in batch-id order).
    """
    c = Client(srv.target, producer_id="crash-producer", retries=0, max_in_flight=32)
    futures = [c.push(stream, batches[i - 1], batch_id=i) for i in range(first, len(batches) + 1)]
    time.sleep(delay)
    srv.kill()
    acked = first
    for f in futures:
        try:
            r = f.result(timeout=30)
        except Exception:
            break
        if r.outcome not in ("committed", "rejected", "duplicate"):
            break
        acked = r.batch_id + 1
    try:
        c.close(flush=False)
    except Exception:
        pass
    return acked


def crash_loop(srv: EmbeddedServer, stream: str, batches: list[pa.Table], seed: int) -> None:
    rng = random.Random(seed)
    first = 1
    for _ in range(CRASHES):
        first = push_until_killed(srv, stream, batches, first, rng.uniform(0.05, 0.6))
        if rng.random() < 0.3:  # a crash during recovery itself
            srv.start(wait=False)
            time.sleep(rng.uniform(0.2, 1.2))
            srv.kill()
        srv.start()
    with Client(srv.target, producer_id="crash-producer") as c:
        results = [
            f.result() for f in [c.push(stream, batches[i - 1], batch_id=i) for i in range(first, len(batches) + 1)]
        ]
    assert all(r.outcome in ("committed", "duplicate", "rejected") for r in results)


def voter_survives(
    data: Path, config: VoterConfig, batches: list[pa.Table], mode: str, partitions: int, variant: str, seed: int
) -> None:
    """The voter's `variant` through random crashes ends in exactly the sequential reference's tables."""
    args = ["--checkpoint-every", "0.4", "--order-timeout", "30"]
    srv = EmbeddedServer(data, partitions=partitions, durability=mode, extra_args=args).start()
    try:
        with Client(srv.target) as c:
            c.deploy(deploy_script(config, variant))
            c.call("setup", **setup_params(config))
        crash_loop(srv, "votes_in", batches, seed=seed)
        ref = VoterReference(config)
        for b in batches:
            ref.process_batch(rows_of(b))
        expected = ref.tables()
        with Client(srv.target) as c:
            for name, sql in (STATE_QUERIES if variant == "state" else SERVER_QUERIES).items():
                assert c.query(sql).fetchall() == expected[name], name
            rejected = c.query("SELECT vote_id, reason FROM rejected_votes ORDER BY vote_id").fetchall()
            assert rejected == sorted(ref.rejected)
    finally:
        srv.close()


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "partitions"), CONFIGS, ids=[f"{m}-P{p}" for m, p in CONFIGS])
def test_voter_survives_random_crashes_exactly_once(tmp_path, mode, partitions):
    config = VoterConfig(contestants=6, max_votes=2, delete_every=70, window=12, slide=2)
    votes = generate_votes(160 * BATCH, seed=partitions, contestants=6, phones=60, invalid_share=0.1)
    batches = [votes.slice(i, BATCH) for i in range(0, votes.num_rows, BATCH)]
    voter_survives(tmp_path / "data", config, batches, mode, partitions, "dataflow", hash((mode, partitions)) & 0xFFFF)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strong", "weak"])
def test_voter_flows_survive_random_crashes_exactly_once(tmp_path, mode):
    """The state voter at P = 2 in 1-vote batches: they run in flows (front/flows.py: vote on the phone's
    partition, leaderboard at home), cut at each deletion; kills land in stages, decisions and DONE records."""
    config = VoterConfig(contestants=6, max_votes=2, delete_every=40, window=12, slide=2)
    votes = generate_votes(400, seed=3, contestants=6, phones=60, invalid_share=0.1)
    batches = [votes.slice(i, 1) for i in range(votes.num_rows)]
    voter_survives(tmp_path / "data", config, batches, mode, 2, "state", 17 if mode == "strong" else 18)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "partitions"), CONFIGS, ids=[f"{m}-P{p}" for m, p in CONFIGS])
def test_sl_transfers_survive_random_crashes_exactly_once(tmp_path, mode, partitions):
    """At P = 2 most batches span both partitions: their fragments replay with the rows the partitions exchanged."""
    records = 60
    events = sl.generate(480, seed=7, records=records, theta=0.8, transfer_max=900, partitions=partitions)
    batches = [events.slice(i, 8) for i in range(0, events.num_rows, 8)]
    args = ["--checkpoint-every", "0.4", "--order-timeout", "30"]
    srv = EmbeddedServer(tmp_path / "data", partitions=partitions, durability=mode, extra_args=args).start()
    try:
        with Client(srv.target) as c:
            c.deploy(sl.deploy_script())
            c.call("setup_sl", **sl.setup_params(records))
        crash_loop(srv, sl.INPUT_STREAM, batches, seed=11 + partitions)
        expected = run_reference(sl, events, records)
        with Client(srv.target) as c:
            assert {n: c.query(q).fetchall() for n, q in sl.STATE_QUERIES.items()} == expected.tables
            assert {n: c.query(q).fetchall() for n, q in sl.OUTPUT_QUERIES.items()} == expected.outputs
    finally:
        srv.close()


def _server(data: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamtx", "serve", "--port", "0", "--data-dir", str(data), "--partitions", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _fill(data: Path) -> list[int]:
    srv = EmbeddedServer(data, durability="strong").start()
    with Client(srv.target, producer_id="p") as c:
        c.deploy(
            "CREATE TABLE t (k BIGINT); CREATE STREAM s (k BIGINT);"
            "CREATE PROCEDURE p ON STREAM s AS BEGIN INSERT INTO t SELECT k FROM s; END;"
        )
        for i in range(1, 31):
            assert c.push("s", pa.table({"k": pa.array([i], pa.int64())}), batch_id=i).result().ok
    srv.kill()
    return list(range(1, 31))


def test_a_torn_last_record_is_dropped_and_the_rest_recovered(tmp_path):
    data = tmp_path / "data"
    keys = _fill(data)
    segment = Path(sorted(glob.glob(str(data / "partition-0" / "log" / "*.seg")))[-1])
    segment.write_bytes(segment.read_bytes()[:-7])  # the last record loses its end
    srv = EmbeddedServer(data, durability="strong").start()
    try:
        with Client(srv.target, producer_id="p") as c:
            recovered = [k for (k,) in c.query("SELECT k FROM t ORDER BY k").fetchall()]
            assert recovered == keys[: len(recovered)] and len(recovered) >= len(keys) - 1
            again = [c.push("s", pa.table({"k": pa.array([k], pa.int64())}), batch_id=k).result() for k in keys]
            assert {r.outcome for r in again[: len(recovered)]} == {"duplicate"}
            assert [k for (k,) in c.query("SELECT k FROM t ORDER BY k").fetchall()] == keys
    finally:
        srv.close()


def test_a_flipped_byte_in_the_middle_refuses_to_start_naming_file_offset_and_lsn(tmp_path):
    data = tmp_path / "data"
    _fill(data)
    segment = Path(sorted(glob.glob(str(data / "partition-0" / "log" / "*.seg")))[-1])
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    segment.write_bytes(bytes(raw))
    done = _server(data)
    assert done.returncode != 0
    assert "cannot recover" in done.stderr and segment.name in done.stderr
    assert "offset" in done.stderr and "lsn" in done.stderr


def test_recovery_starts_from_the_last_checkpoint_and_replays_only_after_it(tmp_path):
    data = tmp_path / "data"
    srv = EmbeddedServer(data, partitions=2, durability="weak", token="s3cret").start()
    try:
        with Client(srv.target, producer_id="p", token="s3cret") as c:
            c.deploy(
                "CREATE TABLE t (k BIGINT) PARTITION BY (k); CREATE STREAM s (k BIGINT) PARTITION BY (k);"
                "CREATE PROCEDURE p ON STREAM s AS BEGIN INSERT INTO t SELECT k FROM s; END;"
            )
            for i in range(1, 31):
                assert c.push("s", pa.table({"k": pa.array([i, i + 100], pa.int64())}), batch_id=i).result().ok
            done = c.checkpoint()
            assert [p["partition"] for p in done["partitions"]] == [0, 1]
            assert all(Path(p["path"]).is_dir() for p in done["partitions"])
            for i in range(31, 41):
                assert c.push("s", pa.table({"k": pa.array([i, i + 100], pa.int64())}), batch_id=i).result().ok
        with Client(srv.target) as anonymous, pytest.raises(Unauthenticated, match="Checkpoint is an admin verb"):
            anonymous.checkpoint()
        srv.kill()
        srv.start()
        with Client(srv.target, producer_id="p", token="s3cret") as c:
            assert c.query("SELECT count(*), sum(k) FROM t").fetchall() == [(80, sum(range(1, 41)) * 2 + 4000)]
            counters = c.status()["counters"]
            replayed = sum(int(counters.get(f"partition{p}.recovered_records", 0)) for p in (0, 1))
            assert 0 < replayed <= 10 * 2 + 2  # the batches after the checkpoint (some may split), nothing before
            r = c.push("s", pa.table({"k": pa.array([5, 105], pa.int64())}), batch_id=5).result()
            assert r.outcome == "duplicate"
    finally:
        srv.close()


def test_a_deploy_keeps_the_streams_it_does_not_touch_with_their_batches_and_marks(tmp_path):
    """A stream an unrelated deploy leaves alone keeps its stored batches and its producers' marks.

    It was rebuilt empty by every deploy after the first (its definition compared unequal to its
    own copy), so stored batches vanished and, after a restart, a re-sent batch was applied twice.
    """
    data = tmp_path / "data"
    srv = EmbeddedServer(data, partitions=1).start()
    try:
        with Client(srv.target, producer_id="p") as c:
            c.deploy(
                "CREATE TABLE t (a BIGINT); CREATE STREAM s (a BIGINT); CREATE STREAM out_s (a BIGINT);"
                "CREATE PROCEDURE p ON STREAM s AS BEGIN INSERT INTO t SELECT a FROM s; END;"
            )
            assert c.push("s", {"a": [1, 2]}, batch_id=1).result().outcome == "committed"
            assert c.push("out_s", {"a": [3]}, batch_id=1).result().outcome == "committed"
            c.deploy("CREATE TABLE unrelated (a BIGINT);")
            c.deploy("CREATE TABLE another (a BIGINT);")
            assert c.query("SELECT a FROM out_s").fetchall() == [(3,)]
        srv.kill()
        srv.start()
        with Client(srv.target, producer_id="p") as c:
            assert c.push("s", {"a": [1, 2]}, batch_id=1).result().outcome == "duplicate"
            assert c.push("out_s", {"a": [3]}, batch_id=1).result().outcome == "duplicate"
            assert c.query("SELECT count(*) FROM t").fetchall() == [(2,)]
            assert c.query("SELECT a FROM out_s").fetchall() == [(3,)]
    finally:
        srv.close()


@pytest.mark.parametrize("mode", ["strong", "weak"])
def test_batches_committed_together_are_one_record_and_replay_batch_for_batch(tmp_path, mode):
    """An interval's batches are one record: INTERVAL (strong: TEs border and interior, two schemas) or PUSHES."""
    data = tmp_path / "data"
    srv = EmbeddedServer(data, durability=mode).start()
    batches = [pa.table({"k": pa.array([i, -i], pa.int64())}) for i in range(1, 301)]
    script = (
        "CREATE TABLE t (k BIGINT, doubled BIGINT); CREATE STREAM s (k BIGINT);"
        "CREATE STREAM s2 (k BIGINT, doubled BIGINT);"
        "CREATE PROCEDURE p1 ON STREAM s AS BEGIN INSERT INTO s2 SELECT k, 2 * k FROM s WHERE k > 0; END;"
        "CREATE PROCEDURE p2 ON STREAM s2 AS BEGIN INSERT INTO t SELECT k, doubled FROM s2; END;"
    )
    try:
        with Client(srv.target, producer_id="p", max_in_flight=300) as c:
            c.deploy(script)
            assert all(f.result().ok for f in [c.push("s", b, batch_id=i + 1) for i, b in enumerate(batches)])
            before = c.query("SELECT k, doubled FROM t ORDER BY k").fetchall()
            assert before == [(k, 2 * k) for k in range(1, 301)]
        srv.kill()
        kind, key = (RecordKind.INTERVAL, "batches") if mode == "strong" else (RecordKind.PUSHES, "pushes")
        intervals = [
            decode_command(r.payload)[0][key]
            for r in LogReader(data / "partition-0" / "log").records()
            if r.kind == kind
        ]
        assert max(map(len, intervals), default=0) > 1  # the pipelined batches were committed together
        if mode == "strong":
            assert all(len(specs) == 2 for _, _, specs, _ in (b for i in intervals for b in i))  # p1 and p2
        srv.start()
        with Client(srv.target, producer_id="p") as c:
            assert c.query("SELECT k, doubled FROM t ORDER BY k").fetchall() == before
            again = [f.result().outcome for f in [c.push("s", b, batch_id=i + 1) for i, b in enumerate(batches)]]
            assert set(again) == {"duplicate"}
    finally:
        srv.close()


@pytest.mark.parametrize("durability", ["strong", "weak"])
def test_a_batch_lost_on_one_partition_while_its_successor_survived_on_another_is_taken_again(tmp_path, durability):
    """Batch k never reached partition 0's log, batch k + 1 is durable on partition 1, then the server dies.

    Neither was acknowledged (acks leave in batch order), so the producer re-sends both:
    k must be taken (it is not a duplicate), k + 1 answered DUPLICATE.
    """
    a0, a1 = ACCOUNTS_ON[0][0], ACCOUNTS_ON[1][0]

    def batch(account: int) -> pa.Table:
        return pa.table({"account": pa.array([account], pa.int64()), "n": pa.array([1], pa.int64())})

    data = tmp_path / "data"
    srv = EmbeddedServer(data, partitions=2, durability=durability).start()
    with Client(srv.target, producer_id="hole") as c:
        c.deploy(HITS)
        assert [c.push("hits", batch(a), batch_id=i).result(timeout=60).outcome for i, a in ((1, a0), (2, a1))] == [
            "committed",
            "committed",
        ]
        frozen = c.status()["partitions"][0]["pid"]
        os.kill(frozen, signal.SIGSTOP)  # partition 0 takes nothing more
        c.push("hits", batch(a0), batch_id=3)
        c.push("hits", batch(a1), batch_id=4)
        deadline = time.monotonic() + 30
        while not any(_batch_ids(data / "partition-1" / "log", 4)):  # batch 4 is in partition 1's log
            assert time.monotonic() < deadline
            time.sleep(0.05)
        srv.kill()  # the workers die with the front, the frozen one too
    srv = EmbeddedServer(data, partitions=2, durability=durability).start()
    try:
        with Client(srv.target, producer_id="hole") as c:
            again = [c.push("hits", batch(a), batch_id=i).result(timeout=60) for i, a in ((3, a0), (4, a1))]
            assert [r.outcome for r in again] == ["committed", "duplicate"]
            assert dict(c.query("SELECT account, n FROM hit_counts").fetchall()) == {a0: 2, a1: 2}
    finally:
        srv.stop()


def _batch_ids(log_dir: Path, batch_id: int) -> list[int]:
    """Records of `log_dir` that take batch `batch_id` (any producer)."""
    if not log_dir.exists():
        return []
    found = []
    for record in LogReader(log_dir).records():
        head, _ = decode_command(record.payload)
        marks = [head.get("mark"), [head.get("producer"), head.get("stream"), head.get("batch_id")]]
        marks += [b[1] for b in head.get("batches", [])] + [[p, s, b] for s, p, b, *_ in head.get("pushes", [])]
        if any(m and m[2] == batch_id for m in marks):
            found.append(record.lsn)
    return found
