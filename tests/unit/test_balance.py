"""Automatic rebalancing's policy (front/balance.py): which bins move for a window's keys per bin."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamtx.server.front.balance import MAX_SHARE_MOVED, BinLoad, imbalance, per_partition, proposal
from streamtx.server.partitioning import PartitionMap, bins_of


def loads(bins: int, hot: dict[int, int]) -> np.ndarray:
    out = np.zeros(bins, dtype=np.int64)
    for b, n in hot.items():
        out[b] = n
    return out


def test_an_even_window_or_one_too_small_to_judge_moves_nothing() -> None:
    current = PartitionMap.round_robin(2, 8)
    assert proposal(current, np.full(8, 500), tolerance=0.25) is None
    assert proposal(current, loads(8, {0: 900}), tolerance=0.25, min_keys=1_000) is None


def test_keys_crowding_one_partition_move_half_its_hot_bins_to_the_other() -> None:
    current = PartitionMap.round_robin(2, 8)  # partition 0 owns the even bins
    window = loads(8, {0: 1000, 2: 1000, 4: 1000, 6: 1000})
    target = proposal(current, window, tolerance=0.25)
    assert target is not None
    assert per_partition(target, 2, window).tolist() == [2000, 2000]
    assert sum(a != b for a, b in zip(current.owner, target, strict=True)) == 2
    assert imbalance(current.owner, 2, window) == 2.0 and imbalance(target, 2, window) == 1.0


def test_a_hot_bin_heavier_than_the_gap_stays_where_it_is() -> None:
    current = PartitionMap.round_robin(2, 8)
    assert proposal(current, loads(8, {0: 5000}), tolerance=0.25) is None  # moving it would only swap the roles
    target = proposal(current, loads(8, {0: 5000, 2: 1000, 4: 1000}), tolerance=0.25)
    assert target is not None and target[0] == 0 and {target[2], target[4]} == {1}


def test_a_partition_owning_no_bin_yet_takes_bins_from_the_busiest() -> None:
    current = PartitionMap(8, PartitionMap.round_robin(2, 8).owner, born=(0, 0, 5))  # partition 2 added at 5
    window = np.full(8, 300)
    target = proposal(current, window, tolerance=0.25)
    assert target is not None
    assert per_partition(target, 3, window).tolist() == [900, 900, 600]


def test_one_proposal_moves_at_most_a_quarter_of_the_bins() -> None:
    current = PartitionMap(64, (0,) * 63 + (1,))
    target = proposal(current, np.full(64, 100), tolerance=0.01)
    assert target is not None
    assert sum(a != b for a, b in zip(current.owner, target, strict=True)) == int(64 * MAX_SHARE_MOVED)


@given(
    st.integers(2, 4),
    st.lists(st.integers(0, 2_000), min_size=16, max_size=16),
    st.lists(st.integers(0, 3), min_size=16, max_size=16),
)
def test_a_proposal_evens_the_partitions_out_and_never_makes_the_busiest_busier(
    parts: int, keys: list[int], owned: list[int]
) -> None:
    owner = tuple(min(o, parts - 1) for o in owned)
    current = PartitionMap(16, owner, born=(0,) * parts)
    window = np.array(keys)
    target = proposal(current, window, tolerance=0.1, min_keys=1)
    if target is None:
        return
    before, after = per_partition(owner, parts, window), per_partition(target, parts, window)
    assert after.max() <= before.max()
    assert (after.astype(float) ** 2).sum() < (before.astype(float) ** 2).sum()  # each move narrows a gap
    assert after.sum() == before.sum()


@pytest.mark.parametrize(
    "keys",
    [pa.array([1, -7, 2**40, 123456789], pa.int64()), pa.array(["a", "phone", ""]), pa.array(range(100), pa.int64())],
)
def test_bins_counted_are_the_bins_that_route_the_keys(keys: pa.Array) -> None:
    pmap = PartitionMap.round_robin(2, 64)
    assert pmap.bins_for(keys).tolist() == bins_of(keys, 64).tolist()
    load = BinLoad(64)
    load.count(pmap, keys)
    load.count(pmap, keys)
    window = load.take()
    assert window.sum() == 2 * len(keys)
    assert np.array_equal(window, 2 * np.bincount(bins_of(keys, 64), minlength=64))
    assert load.take().sum() == 0  # the next window starts empty
