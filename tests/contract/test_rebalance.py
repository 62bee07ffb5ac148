"""Moving bins between partitions while batches flow (front/rebalance.py, partition/migration.py).

A real server of two partitions runs the accounts application (balances
partitioned by account, an audit table on the home partition); a producer
pushes deposits, single- and multi-partition, while bins move. Afterwards
every balance and audit row equals plain Python's sum of what was acked,
each table's rows live where the new map puts them (Status row counts),
re-sent batches are DUPLICATE, and new deposits land on the moved rows.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter

import grpc
import pyarrow as pa
import pytest
from support.partitions import ACCOUNTS, deposits, keys_on

from streamtx.client import Client
from streamtx.client.async_client import rowdata_to_result
from streamtx.errors import FailedPrecondition, InvalidArgument
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.partitioning import PartitionMap
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(300)

ACCOUNT_IDS = list(range(1, 120))


class Ledger:
    """A producer of deposits and the balances they must add up to."""

    def __init__(self, client: Client, seed: int) -> None:
        self.client = client
        self.rng = random.Random(seed)
        self.expected: Counter[int] = Counter()
        self.audited = 0
        self.sent: list[tuple[int, list[tuple[int, int]]]] = []  # (batch id, rows)
        self.futures: list = []

    def push(self, n: int) -> None:
        for _ in range(n):
            rows = [(self.rng.choice(ACCOUNT_IDS), self.rng.randint(1, 9)) for _ in range(self.rng.choice((1, 1, 3)))]
            fut = self.client.push("deposits", deposits(rows))
            self.futures.append((fut, rows))

    def settle(self) -> None:
        for fut, rows in self.futures:
            result = fut.result(timeout=60)
            assert result.outcome == "committed", result
            for account, amount in rows:
                self.expected[account] += amount
            self.audited += len(rows)
            self.sent.append((result.batch_id, rows))
        self.futures = []

    def check(self, *moves: tuple[int, int, int]) -> None:
        """Balances and audit as acked; each balance on the partition owning its bin after `moves`."""
        balances = dict(self.client.query("SELECT account, balance FROM balances").fetchall())
        assert balances == dict(self.expected)
        assert self.client.query("SELECT count(*) FROM audit").fetchall() == [(self.audited,)]
        owner = list(PartitionMap.round_robin(2, 1024).owner)
        for first, last, p in moves:
            owner[first : last + 1] = [p] * (last - first + 1)
        placed = Counter(PartitionMap(1024, tuple(owner)).owners_of(list(balances)).tolist())
        counters = self.client.status()["counters"]
        assert [counters.get(f"partition{p}.rows.balances", 0) for p in (0, 1)] == [placed[0], placed[1]]


def start(tmp_path) -> EmbeddedServer:
    return EmbeddedServer(tmp_path / "data", partitions=2).start()


@pytest.fixture
def server(tmp_path):
    srv = start(tmp_path)
    with Client(srv.target) as c:
        c.deploy(ACCOUNTS)
        c.call("set_fee", kind="deposit", fee=0)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def untouched(tmp_path_factory):
    """A server the tests below only ask to rebalance wrongly: they leave it as it was."""
    with EmbeddedServer(tmp_path_factory.mktemp("untouched"), partitions=2) as srv, Client(srv.target) as c:
        c.deploy(ACCOUNTS)
        yield srv


@pytest.mark.parametrize("strategy", ["all-at-once", "fluid", "batched"])
def test_bins_move_while_deposits_flow_and_end_as_without_a_migration(server, strategy):
    with Client(server.target, producer_id=f"ledger-{strategy}") as c:
        ledger = Ledger(c, seed=len(strategy))
        ledger.push(150)
        moves = [(0, 127, 1), (900, 1023, 1)] if strategy != "fluid" else [(0, 31, 1)]
        progress: list[dict] = []

        def rebalance() -> None:
            with Client(server.target) as admin:
                progress.extend(admin.rebalance(moves, strategy=strategy, bins_per_step=20))

        mover = threading.Thread(target=rebalance)
        mover.start()
        while mover.is_alive():
            ledger.push(20)
            ledger.settle()
        mover.join()
        ledger.push(100)
        ledger.settle()

        moved = 64 + 62 if strategy != "fluid" else 16  # bins 0..127 and 900..1023 that partition 0 owned
        steps = {"all-at-once": 1, "fluid": moved, "batched": -(-moved // 20)}[strategy]
        assert [p["step"] for p in progress] == list(range(steps + 1))
        assert progress[0]["step_seconds"] == 0 and all(p["step_seconds"] > 0 for p in progress[1:])
        assert progress[-1]["bins_moved"] == progress[-1]["bins_total"] == moved
        assert progress[-1]["bins_per_partition"] == [512 - moved, 512 + moved]
        assert c.status()["bins_per_partition"] == [512 - moved, 512 + moved]
        ledger.check(*moves)

        # a re-sent batch is DUPLICATE wherever its rows route now, and changes nothing
        for batch_id, rows in ledger.sent[:40]:
            again = c.push("deposits", deposits(rows), batch_id=batch_id).result(timeout=60)
            assert again.outcome == "duplicate", again
        ledger.check(*moves)


def test_even_spreads_bins_back_and_moves_as_few_as_possible(server):
    with Client(server.target) as c:
        ledger = Ledger(c, seed=5)
        ledger.push(200)
        ledger.settle()
        list(c.rebalance([(0, 299, 0)]))
        assert c.status()["bins_per_partition"] == [662, 362]
        steps = list(c.rebalance(even=True, strategy="batched", bins_per_step=50))
        assert steps[-1]["bins_moved"] == 150  # only the surplus of partition 0 goes
        assert c.status()["bins_per_partition"] == [512, 512]
        assert list(c.rebalance(even=True))[-1]["steps"] == 0  # nothing to move: no step
        ledger.push(100)
        ledger.settle()
        # partition 0's surplus is its last 150 bins: 0..299, then its own even bins from 300 up to 722
        ledger.check((0, 299, 0), *[(b, b, 1) for b in range(724, 1024, 2)])


def test_a_migration_survives_a_checkpoint_and_a_restart(tmp_path):
    srv = start(tmp_path)
    try:
        with Client(srv.target, producer_id="restart") as c:
            c.deploy(ACCOUNTS)
            c.call("set_fee", kind="deposit", fee=0)
            ledger = Ledger(c, seed=9)
            ledger.push(100)
            ledger.settle()
            list(c.rebalance([(0, 511, 1)], strategy="batched", bins_per_step=100))
            ledger.push(50)
            ledger.settle()
            c.checkpoint()
            list(c.rebalance([(512, 767, 0)], strategy="batched", bins_per_step=100))
            ledger.push(50)
            ledger.settle()
            expected, audited, shape = ledger.expected, ledger.audited, c.status()["bins_per_partition"]
        assert srv.stop() == 0
    finally:
        srv.stop()
    with EmbeddedServer(tmp_path / "data", partitions=None) as again, Client(again.target, producer_id="after") as c:
        assert c.status()["bins_per_partition"] == shape == [256 + 128, 512 + 128]
        ledger = Ledger(c, seed=10)
        ledger.expected, ledger.audited = expected, audited
        ledger.check((0, 511, 1), (512, 767, 0))
        ledger.push(80)
        ledger.settle()
        ledger.check((0, 511, 1), (512, 767, 0))


def test_a_migration_left_early_is_interrupted_kept_across_a_restart_and_resumed(tmp_path, capsys):
    from streamtx import cli

    srv = start(tmp_path)
    try:
        with Client(srv.target, producer_id="left") as c:
            c.deploy(ACCOUNTS)
            c.call("set_fee", kind="deposit", fee=0)
            with pytest.raises(FailedPrecondition, match="no migration was interrupted; there is nothing to resume"):
                list(c.rebalance(resume=True))
            ledger = Ledger(c, seed=11)
            ledger.push(100)
            ledger.settle()
            steps = c.rebalance([(0, 63, 1)], strategy="fluid")  # partition 0's 32 bins among 0..63
            for progress in steps:
                if progress["step"] == 3:
                    break
            steps.close()  # the caller leaves: the migration stops after the step under way
            deadline = time.monotonic() + 30
            while not c.status()["rebalance_interrupted"]["bins_left"] and time.monotonic() < deadline:
                time.sleep(0.05)
            stopped = c.status()["rebalance_interrupted"]
            assert stopped["strategy"] == "fluid" and 1 <= stopped["bins_left"] <= 29
            left = stopped["bins_left"]
            ledger.push(50)
            ledger.settle()
            expected, audited = ledger.expected, ledger.audited
        assert srv.stop() == 0
    finally:
        srv.stop()
    assert (tmp_path / "data" / "migration.json").exists()
    with EmbeddedServer(tmp_path / "data", partitions=None) as again, Client(again.target, producer_id="after") as c:
        status = c.status()
        assert status["rebalance_interrupted"]["bins_left"] == left
        assert cli.main(["--target", again.target, "status"]) == 0
        assert f"{left} bins still to move (fluid)" in capsys.readouterr().out
        assert status["bins_per_partition"] == [512 - (32 - left), 512 + (32 - left)]
        with pytest.raises(InvalidArgument, match="resume takes no bin moves, even or partition count"):
            list(c.rebalance([(0, 3, 1)], resume=True))
        steps = list(c.rebalance(resume=True, strategy="batched", bins_per_step=8))
        assert steps[-1]["bins_moved"] == left and steps[-1]["steps"] == -(-left // 8)
        status = c.status()
        assert status["rebalance_interrupted"]["bins_left"] == 0  # none (the message's defaults)
        assert status["bins_per_partition"] == [512 - 32, 512 + 32]
        ledger = Ledger(c, seed=12)
        ledger.expected, ledger.audited = expected, audited
        ledger.push(50)
        ledger.settle()
        ledger.check((0, 63, 1))
    assert not (tmp_path / "data" / "migration.json").exists()


@pytest.mark.parametrize(
    "moves, options, message",
    [
        ([(0, 1024, 1)], {}, "rebalance: bins 0..1024: bins are 0..1023"),
        ([(-1, 3, 1)], {}, "rebalance: bins -1..3: bins are 0..1023"),
        ([(5, 3, 1)], {}, "rebalance: bins 5..3: bins are 0..1023"),
        ([(0, 3, 2)], {}, "rebalance: partition 2: the server has partitions 0..1"),
        ([(0, 3, 1)], {"strategy": "sideways"}, "strategy 'sideways': must be one of all-at-once, fluid, batched"),
        ([(0, 3, 1)], {"strategy": "batched", "bins_per_step": -2}, "bins per step -2: must be at least 1"),
        ([(0, 3, 1)], {"even": True}, "give one of bin moves, even or a partition count"),
        ([], {}, "give one of bin moves, even or a partition count"),
        ([], {"partitions": 1025}, "rebalance: 1025 partitions: must be 1..1024 (every partition owns a bin)"),
        ([], {"partitions": -1}, "rebalance: -1 partitions: must be 1..1024"),
        ([], {"partitions": 2, "resume": True}, "resume takes no bin moves, even or partition count"),
    ],
)
def test_a_bad_rebalance_is_refused_by_name_and_moves_nothing(untouched, moves, options, message):
    with Client(untouched.target) as c:
        with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
            list(c.rebalance(moves, **options))
        status = c.status()
        assert status["bins_per_partition"] == [512, 512]
        assert status["counters"].get("partition0.migrations", 0) == 0


def test_a_window_kept_on_every_partition_refuses_a_rebalance(tmp_path):
    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target) as c:
        c.deploy(
            "CREATE STREAM ticks (k BIGINT, v BIGINT) PARTITION BY (k);\n"
            "CREATE TABLE seen (k BIGINT PRIMARY KEY, n BIGINT) PARTITION BY (k);\n"
            "CREATE WINDOW recent ON ticks ROWS 4 SLIDE 1;\n"
            "CREATE PROCEDURE tick ON STREAM ticks AS BEGIN\n"
            "    INSERT INTO seen SELECT k, count(*) FROM recent GROUP BY k ON CONFLICT DO UPDATE SET n = excluded.n;\n"
            "END;"
        )
        with pytest.raises(FailedPrecondition, match="window 'recent' is kept by procedure 'tick'"):
            list(c.rebalance([(0, 10, 1)]))
        assert c.status()["bins_per_partition"] == [512, 512]


def test_rebalance_needs_an_admin_token(tmp_path):
    with EmbeddedServer(tmp_path / "data", partitions=2, token="s3cret") as srv:
        with Client(srv.target, token="wrong", retries=0) as c, pytest.raises(Exception) as refused:
            list(c.rebalance([(0, 3, 1)]))
        assert getattr(refused.value, "code", None) == grpc.StatusCode.UNAUTHENTICATED
        with Client(srv.target, token="s3cret") as c:
            assert c.status()["bins_per_partition"] == [512, 512]
            assert list(c.rebalance([(0, 3, 1)]))[-1]["bins_moved"] == 2


def test_cli_rebalance_moves_bins_and_status_shows_the_map(server, capsys):
    from streamtx import cli

    t = ["--target", server.target]
    assert cli.main([*t, "rebalance", "--resume", "-q"]) == 2  # nothing was interrupted
    assert "no migration was interrupted" in capsys.readouterr().err
    assert cli.main([*t, "rebalance", "--move", "0-7:1", "--strategy", "fluid", "-q"]) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert final["bins_moved"] == 4 and final["steps"] == 4 and final["bins_per_partition"] == [508, 516]
    assert cli.main([*t, "status"]) == 0
    assert "0:508 1:516" in capsys.readouterr().out
    assert cli.main([*t, "rebalance", "--even", "-q"]) == 0
    assert json.loads(capsys.readouterr().out.strip())["bins_per_partition"] == [512, 512]


KEYED = """
CREATE TABLE counts (k BIGINT PRIMARY KEY, n BIGINT NOT NULL) PARTITION BY (k);
CREATE STREAM words (k BIGINT) PARTITION BY (k);
CREATE PROCEDURE count_words ON STREAM words AS BEGIN
    INSERT INTO counts SELECT k, count(*) FROM words GROUP BY k ON CONFLICT DO UPDATE SET n = counts.n + excluded.n;
END;
CREATE PROCEDURE add_keys (lo BIGINT, hi BIGINT) AS BEGIN
    INSERT INTO counts SELECT i, 0 FROM range($lo, $hi) t(i) ON CONFLICT DO NOTHING;
END;
"""


def test_keys_written_between_steps_leave_with_their_bins(tmp_path):
    """A partition keeps the keys it read at one step, with their bins, for the next (partition/binned.py):
    keys that the compiled upsert, plain SQL or an arriving step added since must leave with their bins."""
    owner = list(PartitionMap.round_robin(2, 1024).owner)
    expected: Counter[int] = Counter({k: 0 for k in range(2000)})

    def move(c: Client, first: int, last: int, to: int, strategy: str = "fluid") -> None:
        list(c.rebalance([(first, last, to)], strategy=strategy, bins_per_step=8))
        owner[first : last + 1] = [to] * (last - first + 1)
        counts = dict(c.query("SELECT k, n FROM counts").fetchall())
        assert counts == dict(expected)
        placed = Counter(PartitionMap(1024, tuple(owner)).owners_of(list(counts)).tolist())
        rows = c.status()["counters"]
        assert [rows.get(f"partition{p}.rows.counts", 0) for p in (0, 1)] == [placed[0], placed[1]]

    def words(c: Client, keys: list[int]) -> None:
        futures = [c.push("words", pa.table({"k": pa.array([k], pa.int64())})) for k in keys]
        assert {f.result(timeout=60).outcome for f in futures} == {"committed"}
        expected.update(keys)

    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target, producer_id="keys") as c:
        c.deploy(KEYED)
        c.call("add_keys", lo=0, hi=2000)
        words(c, list(range(0, 2000, 7)))
        move(c, 0, 63, 1)  # partition 0 reads its keys once
        words(c, list(range(5000, 5400)))  # new keys, by the compiled upsert, in every bin
        expected.update({k: 0 for k in range(6000, 6400)})
        c.call("add_keys", lo=6000, hi=6400)  # and by SQL: what was kept is dropped
        move(c, 64, 255, 1, "batched")
        words(c, list(range(7000, 7300)))
        move(c, 256, 511, 1, "batched")
        assert c.status()["counters"]["partition0.migration_key_reads"] == 2
        move(c, 0, 511, 0, "batched")  # back: partition 1 reads; partition 0 keeps what arrives
        words(c, list(range(8000, 8300)))
        move(c, 0, 1023, 1, "all-at-once")  # partition 0 gives all: what it kept and what arrived since
        assert c.status()["counters"]["partition0.migration_key_reads"] == 2
        move(c, 0, 1023, 0, "batched")


DROPPING = """
CREATE TABLE counts (k BIGINT PRIMARY KEY, n BIGINT NOT NULL) PARTITION BY (k);
CREATE STREAM words (k BIGINT) PARTITION BY (k);
CREATE STREAM drops (k BIGINT) PARTITION BY (k);
CREATE PROCEDURE count_words ON STREAM words AS BEGIN
    INSERT INTO counts SELECT k, count(*) FROM words GROUP BY k ON CONFLICT DO UPDATE SET n = counts.n + excluded.n;
END;
CREATE PROCEDURE drop_words ON STREAM drops AS BEGIN
    DELETE FROM counts WHERE k IN (SELECT k FROM drops);
END;
"""


def test_rows_a_partition_held_leave_with_their_bins_and_what_arrives_is_held_as_it_now_is(tmp_path):
    """A step keeps the moved tables' rows held in memory (partition/state.py `moved_out`, `moved_in`):
    rows deleted while their bins were away, or changed there, must not come back from it."""
    keys = keys_on(2, 0, 30)
    bins = sorted(set(PartitionMap.round_robin(2, 1024).bins_for(pa.array(keys, pa.int64())).tolist()))

    def push(c: Client, stream: str, ks: list[int]) -> None:
        futures = [c.push(stream, pa.table({"k": pa.array([k], pa.int64())})) for k in ks]
        assert {f.result(timeout=60).outcome for f in futures} == {"committed"}

    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target, producer_id="drops") as c:
        c.deploy(DROPPING)
        push(c, "words", keys)  # partition 0 holds their rows, n = 1
        list(c.rebalance([(b, b, 1) for b in bins], strategy="batched", bins_per_step=4))
        push(c, "drops", keys[:10])  # deleted on partition 1
        push(c, "words", keys[10:20])  # n = 2 there
        list(c.rebalance([(b, b, 0) for b in bins], strategy="fluid"))
        push(c, "words", keys)  # back on partition 0: the first ten start again, the others go on
        counts = dict(c.query("SELECT k, n FROM counts").fetchall())
        assert counts == {**dict.fromkeys(keys[:10], 1), **dict.fromkeys(keys[10:20], 3), **dict.fromkeys(keys[20:], 2)}
        assert c.status()["counters"]["partition0.rows.counts"] == len(keys)


LOGGED_HITS = """
CREATE STREAM hits (account BIGINT, n BIGINT) PARTITION BY (account);
CREATE TABLE hit_counts (account BIGINT PRIMARY KEY, n BIGINT NOT NULL) PARTITION BY (account);
CREATE STREAM hit_log (account BIGINT, n BIGINT);
CREATE PROCEDURE hit ON STREAM hits AS BEGIN
    INSERT INTO hit_counts SELECT account, sum(n) FROM hits GROUP BY account
        ON CONFLICT DO UPDATE SET n = hit_counts.n + excluded.n;
    INSERT INTO hit_log SELECT account, n FROM hits;
END;
"""
"""Batches that run on their account's partition alone, which alone records them, and a stream kept there."""


def test_a_retired_partitions_batches_stay_re_sends_and_its_stream_tuples_stay_readable_across_restarts(tmp_path):
    """Shrinking 2 -> 1 hands the retired partition's marks, taken ids and retained tuples to home: every
    batch sent again is DUPLICATE after a restart too (the front then knows marks only from the
    partitions), subscribers read every batch of the stream it kept, and its directory is gone; growing
    back adds a partition that starts empty and recovers from its own log."""
    rng = random.Random(7)
    batches = [(rng.randrange(1, 40), rng.randrange(1, 9)) for _ in range(80)]
    expected = Counter()
    for account, n in batches:
        expected[account] += n
    data = tmp_path / "data"

    def push_all(c: Client, outcome: str) -> list[int]:
        sent = [c.push("hits", {"account": [a], "n": [n]}, batch_id=i + 1) for i, (a, n) in enumerate(batches)]
        acks = [f.result() for f in sent]
        assert [a.outcome for a in acks] == [outcome] * len(batches)
        assert dict(c.query("SELECT account, n FROM hit_counts").fetchall()) == dict(expected)
        return [a.timestamp for a in acks]

    def logged(target: str) -> list[tuple[int, list[tuple[int, int]]]]:
        """The stream's batches as a reader gets them (ReadStream: bounded, unlike a subscription)."""
        with grpc.insecure_channel(target) as channel:
            request = pb.ReadStreamRequest(stream="hit_log", max_batches=len(batches) + 1)
            reply = pb_grpc.StreamTxStub(channel).ReadStream(request, timeout=30)
        return [(b.ts, rowdata_to_result(b.data).fetchall()) for b in reply.batches]

    with EmbeddedServer(data, partitions=2) as srv, Client(srv.target, producer_id="p", max_in_flight=32) as c:
        c.deploy(LOGGED_HITS)
        stamps = push_all(c, "committed")
        assert c.status()["counters"].get("partition1.rows.hit_counts", 0) > 0
        log = [(ts, [(a, n)]) for ts, (a, n) in zip(stamps, batches, strict=True)]
        steps = list(c.rebalance(partitions=1, strategy="batched", bins_per_step=256))
        assert steps[-1]["bins_per_partition"] == [1024] and steps[-1]["steps"] == 3
        assert logged(srv.target) == log
    assert not (data / "partition-1").exists()
    with EmbeddedServer(data, partitions=None) as srv, Client(srv.target, producer_id="p") as c:
        assert c.status()["bins_per_partition"] == [1024]
        push_all(c, "duplicate")
        assert logged(srv.target) == log
        list(c.rebalance(partitions=2))
    with EmbeddedServer(data, partitions=None) as srv, Client(srv.target, producer_id="p") as c:
        assert c.status()["bins_per_partition"] == [512, 512]
        push_all(c, "duplicate")
        assert logged(srv.target) == log


def test_auto_rebalance_moves_bins_off_the_partition_keys_crowd_onto_and_keeps_every_deposit(tmp_path, capsys):
    from streamtx import cli

    hot = keys_on(2, 0, 40)  # every account on partition 0's bins
    args = ["--auto-rebalance", "0.5"]
    with (
        EmbeddedServer(tmp_path / "data", partitions=2, extra_args=args) as srv,
        Client(srv.target, producer_id="skewed") as c,
    ):
        c.deploy(ACCOUNTS)
        c.call("set_fee", kind="deposit", fee=0)
        rng = random.Random(7)
        expected: Counter[int] = Counter()

        def push(batches: int) -> None:
            futures = []
            for _ in range(batches):
                rows = [(rng.choice(hot), rng.randint(1, 9)) for _ in range(10)]
                futures.append((c.push("deposits", deposits(rows)), rows))
            for fut, rows in futures:
                assert fut.result(timeout=60).outcome == "committed"
                for account, amount in rows:
                    expected[account] += amount

        push(20)  # 200 keys, fewer than a window needs to be judged: counted, nothing moves
        deadline = time.monotonic() + 30
        while not (routed := c.status().get("keys_per_partition") or [0, 0])[0]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert routed[1] == 0 and c.status()["counters"].get("auto_rebalances", 0) == 0
        assert cli.main(["--target", srv.target, "status"]) == 0
        assert f"0:{routed[0]:,} 1:0 (last window)" in capsys.readouterr().out

        deadline = time.monotonic() + 120
        while c.status()["counters"].get("auto_rebalances", 0) == 0 or c.status()["rebalancing"].get("steps"):
            assert time.monotonic() < deadline, c.status()
            push(50)
        status = c.status()
        moved = status["bins_per_partition"]
        assert moved[1] > 512, moved  # partition 0 gave bins: some of the hot ones
        owner = PartitionMap(1024, tuple(status["bin_owner"]))
        assert set(owner.owners_of(hot).tolist()) == {0, 1}

        push(100)  # the keys now split between the two (and may move again: the windows are random)
        time.sleep(1.2)  # past the last window with keys: a migration it starts is under way by now
        while (status := c.status())["rebalancing"].get("steps"):  # no keys come now: no other migration starts
            time.sleep(0.1)
        balances = dict(c.query("SELECT account, balance FROM balances").fetchall())
        assert balances == dict(expected)
        placed = Counter(PartitionMap(1024, tuple(status["bin_owner"])).owners_of(list(balances)).tolist())
        counters = status["counters"]
        assert [counters.get(f"partition{p}.rows.balances", 0) for p in (0, 1)] == [placed[0], placed[1]]
        assert counters["partition1.rows.balances"] > 0
