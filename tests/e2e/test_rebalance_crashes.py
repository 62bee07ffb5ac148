"""Crashes during a migration: SIGKILLed workers, and a front that dies at each point of a step.

Whatever the point, the server comes back with one map that every row
agrees with: each balance equals the deposits acked (none lost, none
applied twice), and lives on the partition its bin's owner names. A step
cut short is either kept everywhere (its DONE record made it) or dropped
everywhere; a migration left with bins to move is reported interrupted and
resumes to its target.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from support.partitions import ACCOUNTS, deposits
from support.processes import wait_dead

from streamtx.client import Client
from streamtx.errors import StreamTxError
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.partitioning import PartitionMap

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

ACCOUNT_IDS = list(range(1, 150))


def deposit_rows(rng: random.Random) -> list[tuple[int, int]]:
    return [(rng.choice(ACCOUNT_IDS), rng.randint(1, 9)) for _ in range(rng.choice((1, 1, 2)))]


def check(c: Client, expected: Counter[int]) -> list[int]:
    """Balances as acked, each on the partition its bin's owner names; returns the bins per partition."""
    balances = dict(c.query("SELECT account, balance FROM balances").fetchall())
    assert balances == dict(expected)
    status = c.status()
    counters = status["counters"]
    rows = [counters.get(f"partition{p}.rows.balances", 0) for p in (0, 1)]
    assert sum(rows) == len(balances)
    return status["bins_per_partition"], rows


def placed(owner_moves: list[tuple[int, int, int]], accounts: list[int]) -> list[int]:
    owner = list(PartitionMap.round_robin(2, 1024).owner)
    for first, last, p in owner_moves:
        owner[first : last + 1] = [p] * (last - first + 1)
    found = Counter(PartitionMap(1024, tuple(owner)).owners_of(accounts).tolist())
    return [found[0], found[1]]


def deposit_while_killing(
    c: Client, migrate: Callable[[], None], rng: random.Random, chance: float
) -> tuple[Counter[int], int]:
    """Pushes deposits while `migrate` runs in a thread, SIGKILLing a live worker with `chance` between
    pushes (ten kills at most); returns what every deposit acked committed adds up to, and the kills."""
    pending = []
    mover = threading.Thread(target=migrate)
    mover.start()
    kills = 0
    while mover.is_alive():
        for _ in range(10):
            rows = deposit_rows(rng)
            pending.append((c.push("deposits", deposits(rows)), rows))
        live = [p["pid"] for p in c.status()["partitions"] if p.get("alive")]
        if kills < 10 and live and rng.random() < chance:
            victim = rng.choice(live)
            os.kill(victim, 9)
            wait_dead([victim], 10)
            kills += 1
        time.sleep(rng.uniform(0.02, 0.3))
    mover.join()
    expected: Counter[int] = Counter()
    for fut, rows in pending:
        result = fut.result(timeout=120)
        assert result.outcome == "committed", result
        for account, amount in rows:
            expected[account] += amount
    return expected, kills


def test_workers_killed_at_random_moments_of_a_fluid_migration_lose_and_repeat_nothing(tmp_path):
    """Ten kills, at any moment: under a step, between steps, and during the recovery from the last kill
    (a worker dying after answering its last recovery request once left the server waiting on it for ever)."""
    rng = random.Random(7)
    srv = EmbeddedServer(tmp_path / "data", partitions=2, extra_args=["--max-restarts", "50"]).start()
    try:
        with Client(srv.target, producer_id="killed", timeout=120) as c:
            c.deploy(ACCOUNTS)
            c.call("set_fee", kind="deposit", fee=0)
            before = [deposit_rows(rng) for _ in range(100)]
            acked = [c.push("deposits", deposits(rows)) for rows in before]
            progress: list[dict] = []

            def migrate() -> None:
                with Client(srv.target, timeout=120) as admin:
                    progress.extend(admin.rebalance([(0, 127, 1)], strategy="fluid"))

            expected, kills = deposit_while_killing(c, migrate, rng, 0.4)
            for fut, rows in zip(acked, before, strict=True):
                assert fut.result(timeout=120).outcome == "committed"
                for account, amount in rows:
                    expected[account] += amount
            assert kills == 10
            assert progress[-1]["bins_moved"] == 64 and progress[-1]["step"] == 64
            shape, rows = check(c, expected)
            assert shape == [512 - 64, 512 + 64]
            assert rows == placed([(0, 127, 1)], sorted(expected))
            assert c.status()["counters"]["restarts"] >= 1
    finally:
        srv.stop()


def deposit_more(c: Client, rng: random.Random, expected: Counter[int], n: int = 50) -> None:
    """`n` deposits, one at a time, each committed; `expected` takes them."""
    for _ in range(n):
        rows = deposit_rows(rng)
        assert c.push("deposits", deposits(rows)).result(timeout=60).outcome == "committed"
        for account, amount in rows:
            expected[account] += amount


def die_in_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, partitions: int, migrate: Callable[[Client], object]
) -> Counter[int]:
    """Deposits, acked, on a new server, then `migrate` with the front set to die at `point` of its first
    step; returns what the deposits add up to once the front is dead."""
    marker = tmp_path / "died"
    monkeypatch.setenv("STREAMTX_FAULT_FRONT_EXIT_IN_MIGRATION", f"{point}:{marker}")
    rng = random.Random(point)
    expected: Counter[int] = Counter()
    srv = EmbeddedServer(tmp_path / "data", partitions=partitions).start()
    try:
        with Client(srv.target, producer_id="before", timeout=60) as c:
            c.deploy(ACCOUNTS)
            c.call("set_fee", kind="deposit", fee=0)
            sent = [deposit_rows(rng) for _ in range(200)]
            for fut, rows in [(c.push("deposits", deposits(rows)), rows) for rows in sent]:
                assert fut.result(timeout=60).outcome == "committed"
                for account, amount in rows:
                    expected[account] += amount
            c.checkpoint()  # a partition added later has none: it starts from its empty state and its log
            with pytest.raises(StreamTxError):
                migrate(c)
        assert marker.exists()
        srv.proc.wait(timeout=30)
    finally:
        srv.close()
    monkeypatch.delenv("STREAMTX_FAULT_FRONT_EXIT_IN_MIGRATION")
    return expected


@pytest.mark.parametrize("point", ["pending", "prepared", "decided", "done"])
def test_a_front_dying_at_any_point_of_a_step_recovers_one_map_and_the_migration_completes(
    tmp_path, monkeypatch, point
):
    data = tmp_path / "data"
    rng = random.Random(point)
    expected = die_in_a_step(tmp_path, monkeypatch, point, 2, lambda c: list(c.rebalance([(0, 255, 1)])))
    moved = point == "done"  # the step's DONE made it to the home partition's log
    with EmbeddedServer(data, partitions=None) as again, Client(again.target, producer_id="after") as c:
        shape, rows = check(c, expected)
        moves = [(0, 255, 1)] if moved else []
        assert shape == ([512 - 128, 512 + 128] if moved else [512, 512])
        assert rows == placed(moves, sorted(expected))
        # reported as interrupted unless its one step made it; resumed, or issued again (nothing left)
        assert c.status()["rebalance_interrupted"]["bins_left"] == (0 if moved else 128)
        steps = list(c.rebalance([(0, 255, 1)]) if moved else c.rebalance(resume=True))
        assert steps[-1]["bins_moved"] == (0 if moved else 128)
        deposit_more(c, rng, expected)
        shape, rows = check(c, expected)
        assert shape == [512 - 128, 512 + 128]
        assert rows == placed([(0, 255, 1)], sorted(expected))


@pytest.mark.parametrize("point", ["pending", "prepared", "decided", "done"])
def test_a_front_dying_while_a_partition_is_added_recovers_with_it_or_without_it(tmp_path, monkeypatch, point):
    """The step adding partition 1 is kept (with its worker's directory) if its DONE made it, else the
    server comes back with one partition and no trace of the other; either way `resume` finishes the grow."""
    data = tmp_path / "data"
    rng = random.Random(point)
    expected = die_in_a_step(tmp_path, monkeypatch, point, 1, lambda c: list(c.rebalance(partitions=2)))
    added = point == "done"
    with EmbeddedServer(data, partitions=None) as again, Client(again.target, producer_id="after") as c:
        assert (data / "partition-1").exists() == added
        status = c.status()
        assert status["bins_per_partition"] == ([1024, 0] if added else [1024])
        assert status["rebalance_interrupted"]["bins_left"] == 512
        balances = dict(c.query("SELECT account, balance FROM balances").fetchall())
        assert balances == dict(expected)
        steps = list(c.rebalance(resume=True))
        assert steps[-1]["bins_moved"] == 512
        deposit_more(c, rng, expected)
        shape, rows = check(c, expected)
        assert shape == [512, 512]
        found = Counter(PartitionMap(1024, tuple(c.status()["bin_owner"])).owners_of(sorted(expected)).tolist())
        assert rows == [found[0], found[1]]


@pytest.mark.parametrize("point", ["pending", "prepared", "decided", "done"])
def test_a_front_dying_while_a_partition_is_retired_recovers_with_it_or_without_it(tmp_path, monkeypatch, point):
    """The step retiring partition 1 (which owns no bin by then) is kept if its DONE made it: the server
    comes back with one partition, the other's directory gone, and its batches still re-sends; else with
    both, and `resume` retires it."""
    data = tmp_path / "data"
    marker = tmp_path / "died"
    rng = random.Random(point)
    expected: Counter[int] = Counter()
    sent = [deposit_rows(rng) for _ in range(100)]
    srv = EmbeddedServer(data, partitions=2).start()
    try:
        with Client(srv.target, producer_id="p", timeout=60) as c:
            c.deploy(ACCOUNTS)
            c.call("set_fee", kind="deposit", fee=0)
            pushed = [c.push("deposits", deposits(rows), batch_id=i + 1) for i, rows in enumerate(sent)]
            for fut, rows in zip(pushed, sent, strict=True):
                assert fut.result(timeout=60).outcome == "committed"
                for account, amount in rows:
                    expected[account] += amount
            list(c.rebalance([(0, 1023, 0)]))
    finally:
        srv.close()
    monkeypatch.setenv("STREAMTX_FAULT_FRONT_EXIT_IN_MIGRATION", f"{point}:{marker}")  # the front reads it at start
    srv = EmbeddedServer(data, partitions=2).start()
    try:
        with Client(srv.target, producer_id="p", timeout=60) as c, pytest.raises(StreamTxError):
            list(c.rebalance(partitions=1))
        assert marker.exists()
        srv.proc.wait(timeout=30)
    finally:
        srv.close()
    monkeypatch.delenv("STREAMTX_FAULT_FRONT_EXIT_IN_MIGRATION")
    retired = point == "done"
    with EmbeddedServer(data, partitions=None) as again, Client(again.target, producer_id="p") as c:
        assert (data / "partition-1").exists() != retired
        status = c.status()
        assert status["bins_per_partition"] == ([1024] if retired else [1024, 0])
        if not retired:
            assert status["rebalance_interrupted"]["bins_left"] == 0
            assert list(c.rebalance(resume=True))[-1]["bins_per_partition"] == [1024]
        again_sent = [c.push("deposits", deposits(rows), batch_id=i + 1) for i, rows in enumerate(sent)]
        assert [f.result(timeout=60).outcome for f in again_sent] == ["duplicate"] * len(sent)
        assert dict(c.query("SELECT account, balance FROM balances").fetchall()) == dict(expected)
    assert not (data / "partition-1").exists()


def test_workers_killed_while_partitions_are_added_and_retired_lose_and_repeat_nothing(tmp_path):
    """Grow 1 -> 2 and shrink back, twice, batched, while deposits flow and workers (the added one too)
    are SIGKILLed at random moments, up to ten times: every deposit counts once, on the partition its
    bin names, and the server ends with one partition and no other directory."""
    rng = random.Random(11)
    data = tmp_path / "data"
    srv = EmbeddedServer(data, partitions=1, extra_args=["--max-restarts", "50"]).start()
    try:
        with Client(srv.target, producer_id="killed", timeout=120) as c:
            c.deploy(ACCOUNTS)
            c.call("set_fee", kind="deposit", fee=0)
            progress: list[dict] = []

            def migrate() -> None:
                with Client(srv.target, timeout=120) as admin:
                    for partitions in (2, 1, 2, 1):
                        progress.append(
                            list(admin.rebalance(partitions=partitions, strategy="batched", bins_per_step=128))[-1]
                        )

            expected, kills = deposit_while_killing(c, migrate, rng, 0.3)
            assert kills >= 3
            assert [p["bins_per_partition"] for p in progress] == [[512, 512], [1024], [512, 512], [1024]]
            assert dict(c.query("SELECT account, balance FROM balances").fetchall()) == dict(expected)
            status = c.status()
            assert status["bins_per_partition"] == [1024]
            assert status["counters"]["partition0.rows.balances"] == len(expected)
            assert status["counters"]["restarts"] >= 1
        assert not (data / "partition-1").exists()
    finally:
        srv.stop()
