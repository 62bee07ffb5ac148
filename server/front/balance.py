"""Automatic rebalancing: keys routed per bin, and the moves that even out the partitions' shares.

Off unless `--auto-rebalance SECONDS` is given. The front counts the keys of
every batch pushed to a partitioned stream by bin (one vectorized pass per
message, or a few Python hashes for a small batch) while the server has two
partitions or more. Every SECONDS it takes the counts of the window just
ended and, if the most loaded partition received more than its fair share
by over `--auto-rebalance-tolerance`, proposes bins to move from the most
loaded partitions to the least loaded ones, hottest bins that fit first,
until they are within a quarter of the tolerance;
the front then runs the migration batched, as `streamtx rebalance --move`
would (front/rebalance.py). A bin carrying more than the gap between two
partitions stays (moving it would only swap their roles), so one hot key
is not chased from partition to partition. The load counted is keys routed,
not CPU time: it is what the map decides, and what moving bins changes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from streamtx.server.partitioning import PartitionMap

MIN_KEYS = 1_000
"""Keys a window must route before its counts say anything (fewer: no proposal)."""
MAX_SHARE_MOVED = 0.25
"""At most this share of the bins moves in one proposal: the next window sees what the move did."""


class BinLoad:
    """Keys routed to each bin since the last `take`."""

    def __init__(self, bins: int) -> None:
        self.keys = np.zeros(bins, dtype=np.int64)

    def count(self, partition_map: PartitionMap, keys: pa.Array | pa.ChunkedArray) -> None:
        if len(self.keys) != partition_map.bins:
            self.keys = np.zeros(partition_map.bins, dtype=np.int64)
        if len(keys):
            np.add.at(self.keys, partition_map.bins_for(keys), 1)

    def take(self) -> np.ndarray:
        """The counts of the window that ends now; the next starts at zero."""
        window, self.keys = self.keys, np.zeros_like(self.keys)
        return window


def per_partition(owner: tuple[int, ...], partitions: int, load: np.ndarray) -> np.ndarray:
    """Keys routed to each partition's bins."""
    return np.bincount(np.asarray(owner, dtype=np.int64), weights=load, minlength=partitions)[:partitions]


def imbalance(owner: tuple[int, ...], partitions: int, load: np.ndarray) -> float:
    """The most loaded partition's keys over the mean (1.0: even; 0.0: nothing routed)."""
    shares = per_partition(owner, partitions, load)
    total = float(shares.sum())
    return float(shares.max()) * partitions / total if total else 0.0


def proposal(
    current: PartitionMap, load: np.ndarray, tolerance: float, min_keys: int = MIN_KEYS
) -> tuple[int, ...] | None:
    """When the most loaded partition is over the mean by more than `tolerance`: the owner of every bin
    after the moves that bring it within a quarter of that (or as close as single bins can); else None.

    Greedy, like a scheduler's longest-job-first: the most loaded partition
    gives the least loaded its hottest bin that is at most half their gap
    (else the coolest bin below the gap), until it is within a quarter of
    the tolerance, no bin helps, or a quarter of the bins have moved. The
    gap between the two thresholds keeps the next windows' noise from
    moving bins back and forth.
    """
    parts = current.partitions
    shares = per_partition(current.owner, parts, load).astype(float)
    total = float(shares.sum())
    if parts < 2 or total < min_keys or shares.max() <= total / parts * (1 + tolerance):
        return None
    goal = total / parts * (1 + tolerance / 4)  # once out of tolerance, as even as bins allow, nearly
    owner = list(current.owner)
    budget = max(1, int(current.bins * MAX_SHARE_MOVED))
    while budget and shares.max() > goal:
        hot, cold = int(np.argmax(shares)), int(np.argmin(shares))
        gap = shares[hot] - shares[cold]
        candidates = [(float(load[b]), b) for b in range(current.bins) if owner[b] == hot and 0 < load[b] < gap]
        if not candidates:
            break
        fitting = [c for c in candidates if c[0] <= gap / 2]
        weight, b = max(fitting, key=lambda c: (c[0], -c[1])) if fitting else min(candidates)
        owner[b] = cold
        shares[hot] -= weight
        shares[cold] += weight
        budget -= 1
    moved = tuple(owner)
    return moved if moved != current.owner else None
