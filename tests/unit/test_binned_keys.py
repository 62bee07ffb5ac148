"""The keys a partition keeps by bin between migration steps (partition/binned.py), against a plain set.

A random history of one partition: keys written in its bins (reported as
pending), rows deleted (not reported: what is kept is a superset), rows
arriving from another partition with the bins a step gave it, and steps
that give bins away. Each step must return every key the partition holds in
the bins it gives, and no key outside those bins.
"""

from __future__ import annotations

import random

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtx.server.partition.binned import BinnedKeys
from streamtx.server.partitioning import PartitionMap, scalar_hash

BINS = 16
ME = 0


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 12))
def test_each_step_takes_every_key_held_in_the_bins_it_gives(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    current = PartitionMap.round_robin(2, BINS)
    held = {k for k in range(300) if current.owner_of(k, pa.int64()) == ME}
    binned = BinnedKeys(BINS)
    binned._append(pa.array(sorted(held), pa.int64()))
    elsewhere = {k for k in range(300) if k not in held}
    for _ in range(steps):
        for _ in range(rng.randrange(20)):
            key = rng.randrange(-(2**40), 2**40)
            if current.owner_of(key, pa.int64()) == ME:
                held.add(key)
                binned.pending.add(key)
        for key in rng.sample(sorted(held), min(len(held), rng.randrange(10))):
            held.discard(key)
        owner = list(current.owner)
        for b in rng.sample(range(BINS), rng.randrange(1, 5)):
            owner[b] = rng.choice((0, 1))
        new = PartitionMap(BINS, tuple(owner))
        taken = binned.take(current, new, ME)
        assert taken is not None
        gives = {b for b in range(BINS) if current.owner[b] == ME != new.owner[b]}
        leaving = {k for k in held if new.owner_of(k, pa.int64()) != ME}
        assert leaving <= set(taken.to_pylist())
        assert all(scalar_hash(k, pa.int64()) % BINS in gives for k in taken.to_pylist())
        held -= leaving
        elsewhere |= leaving
        arriving = {k for k in elsewhere if current.owner_of(k, pa.int64()) != ME == new.owner_of(k, pa.int64())}
        if arriving:
            binned.arrived.append(pa.array(sorted(arriving), pa.int64()))
            held |= arriving
            elsewhere -= arriving
        current = new


def test_a_key_written_since_that_is_not_an_int64_asks_for_a_new_read() -> None:
    binned = BinnedKeys(BINS)
    binned._append(pa.array([1, 2, 3], pa.int64()))
    binned.pending.add("seven")
    assert binned.take(PartitionMap.round_robin(2, BINS), PartitionMap(BINS, (1,) * BINS), ME) is None
