"""Planning a migration (server/front/rebalance.py): the target map and the steps that reach it."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtx.errors import InvalidArgument
from streamtx.server.front.front import common_checkpoint
from streamtx.server.front.rebalance import BinMove, even_owner, plan, target_owner
from streamtx.server.partition.migration import gives_bins
from streamtx.server.partitioning import PartitionMap
from streamtx.server.protocol import Recoverable


@st.composite
def maps(draw: st.DrawFn) -> PartitionMap:
    partitions = draw(st.integers(1, 5))
    bins = draw(st.integers(partitions, 64))
    owner = draw(st.lists(st.integers(0, partitions - 1), min_size=bins, max_size=bins))
    owner[:partitions] = range(partitions)  # every partition owns a bin, as a server's map does
    return PartitionMap(bins, tuple(owner))


@settings(max_examples=300, deadline=None)
@given(current=maps())
def test_even_spreads_bins_within_one_and_moves_only_the_surplus(current):
    target = even_owner(current)
    counts = Counter(target)
    assert max(counts.values()) - min(counts.values()) <= 1 and len(counts) == current.partitions
    moved = sum(a != b for a, b in zip(current.owner, target, strict=True))
    before = Counter(current.owner)
    quota = sorted(counts.values(), reverse=True)
    biggest_first = sorted(before.values(), reverse=True)
    assert moved == sum(max(0, have - want) for have, want in zip(biggest_first, quota, strict=True))
    assert even_owner(PartitionMap(current.bins, target)) == target  # even is a fixed point


@settings(max_examples=300, deadline=None)
@given(current=maps(), data=st.data())
def test_steps_move_each_bin_once_to_its_target_at_most_k_a_step(current, data):
    target = tuple(
        data.draw(st.lists(st.integers(0, current.partitions - 1), min_size=current.bins, max_size=current.bins))
    )
    strategy = data.draw(st.sampled_from(["all-at-once", "fluid", "batched"]))
    k = data.draw(st.integers(1, 10))
    steps = plan(current, target, strategy, k)
    moving = sum(a != b for a, b in zip(current.owner, target, strict=True))
    size = {"all-at-once": max(moving, 1), "fluid": 1, "batched": k}[strategy]
    assert len(steps) == -(-moving // size)
    before = current.owner
    for step in steps:
        changed = [b for b in range(current.bins) if step.owner[b] != before[b]]
        assert 1 <= len(changed) <= size
        assert all(step.owner[b] == target[b] for b in changed)
        before = step.owner
    assert before == target


def test_moves_name_ranges_and_later_moves_win():
    current = PartitionMap.round_robin(2, 8)
    assert target_owner(current, [BinMove(0, 3, 1), BinMove(2, 2, 0)], even=False) == (1, 1, 0, 1, 0, 1, 0, 1)


@pytest.mark.parametrize(
    "moves, even, message",
    [
        ([BinMove(0, 8, 1)], False, "bins 0..8: bins are 0..7"),
        ([BinMove(3, 2, 1)], False, "bins 3..2: bins are 0..7"),
        ([BinMove(0, 1, 2)], False, "partition 2: the server has partitions 0..1"),
        ([], False, "one of bin moves, even or a partition count"),
        ([BinMove(0, 1, 1)], True, "one of bin moves, even or a partition count"),
    ],
)
def test_bad_moves_are_refused_by_name(moves, even, message):
    with pytest.raises(InvalidArgument, match=message):
        target_owner(PartitionMap.round_robin(2, 8), moves, even)


@settings(max_examples=200, deadline=None)
@given(current=maps(), data=st.data())
def test_only_a_partition_whose_bins_go_elsewhere_reads_its_tables_in_a_step(current, data):
    """A step's other partitions skip the scan for leaving rows: they hold rows of their own bins only."""
    step = plan(current, even_owner(current), "fluid", 1)
    new = data.draw(st.sampled_from(step)) if step else current
    for p in range(current.partitions):
        expected = any(a == p and b != p for a, b in zip(current.owner, new.owner, strict=True))
        assert gives_bins(current, new, p) == expected
    assert gives_bins(PartitionMap.round_robin(1, new.bins + 1), new, 0)  # maps of other bins: read, to be safe


@settings(max_examples=300, deadline=None)
@given(current=maps(), data=st.data())
def test_a_partition_count_spreads_every_bin_over_exactly_that_many(current, data):
    """Growing or shrinking: every partition kept or added gets its share, none past the count keeps a bin,
    and a partition kept loses bins only to make room (as few move as `even` moves at that count)."""
    n = data.draw(st.integers(1, min(current.bins, 7)), label="partitions")
    target = target_owner(current, [], even=False, partitions=n)
    counts = Counter(target)
    assert sorted(counts) == list(range(n))
    assert max(counts.values()) - min(counts.values()) <= 1
    kept = [b for b in range(current.bins) if current.owner[b] < n and target[b] == current.owner[b]]
    surplus = sum(max(0, have - counts[p]) for p, have in Counter(current.owner).items() if p < n)
    assert len(kept) == sum(1 for b in range(current.bins) if current.owner[b] < n) - surplus


def test_a_map_counts_partitions_that_own_no_bin():
    grown = PartitionMap.round_robin(2, 8).resized(3, ts=40)
    assert (grown.partitions, grown.born) == (3, (0, 0, 40))
    emptied = grown.moved((0,) * 8)
    assert emptied.partitions == 3 and PartitionMap.from_json(emptied.to_json()) == emptied
    assert emptied.resized(1).born == (0,) and PartitionMap(8, (0, 1) * 4).partitions == 2  # old files: no born


@pytest.mark.parametrize("partitions", [0, 9, -1])
def test_a_partition_count_outside_one_per_bin_is_refused(partitions):
    with pytest.raises(InvalidArgument, match=f"{partitions} partitions: must be 1..8"):
        target_owner(PartitionMap.round_robin(2, 8), [], even=False, partitions=partitions)


def test_recovery_starts_a_partition_added_after_a_checkpoint_from_its_empty_state():
    """The newest checkpoint every partition wrote, or was added after (it held nothing at that cut)."""
    infos = [Recoverable([10, 20], [], 0), Recoverable([10, 20], [], 0), Recoverable([], [], 0)]
    assert common_checkpoint(infos, (0, 0, 25)) == 20
    assert common_checkpoint(infos, (0, 0, 15)) == 10  # it missed 20: the one before it, for all
    assert common_checkpoint(infos, (0, 0)) == 20  # one the map does not name yet: added by a step under way
    assert common_checkpoint(infos, (0, 0, 5)) is None
    assert common_checkpoint(infos[:2], (0, 0)) == 20
