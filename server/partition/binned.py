"""A partition's keys of a table with their bins, kept from one migration step to the next.

A migration step takes out every row of the bins it moves. Finding them
means reading and hashing every key the partition holds of the table, a
cost per step that does not depend on what moves (a partition of 500,000
rows: 10-20 ms of a step that moves 1,000). The first step reads them
once; the keys and their bins stay in memory, and each later step folds in
the keys written since (the write-back and arriving rows report them,
`KeyIndex.add`) and picks its bins' keys out with one NumPy mask.

What it holds is a superset of the table's keys, under the `KeyIndex`'s
discipline: a key deleted since stays listed (the DELETE by key finds
nothing for it), and whatever could add a key unseen (SQL that may write
the table, any rollback, a deploy) drops it, so that the next step reads
the table again. Only tables whose one primary key column is the partition
column and holds signed integers keep one: their keys are the bins' keys,
and NumPy holds them as they are.
"""

from __future__ import annotations

import time
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from streamtx.server.catalog.compile import quote
from streamtx.server.partitioning import PartitionMap, bins_of

SIGNED = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
"""The key column types (as DuckDB names them) whose keys are kept: NumPy's int64 holds every value."""
MAX_PENDING = 200_000
"""Distinct keys written since the last step that one keeps before it is dropped (read again at the next
step instead): a table written for long after a migration must not grow a second copy of its key set."""
IDLE_S = 60.0
"""Seconds without a step after which the kept keys are dropped at the next write: once a migration is
over, the write-back stops paying for reporting its keys (steps of one migration are at most a second or
so apart, `MAX_PAUSE_S` in front/rebalance.py)."""
MAX_CHUNKS = 32
"""Arrays of keys appended (one per step that found keys written since) before they are merged into one."""


class BinnedKeys:
    """Keys (int64) of one table with the bin of each, under `nbins` bins, in arrays appended as keys come.

    A step does not remove the keys it takes: it picks only the bins this
    partition gives up (owned before the step, not after), so the keys of
    bins that left earlier are skipped until a merge drops them (`_compact`).
    """

    def __init__(self, nbins: int) -> None:
        self.nbins = nbins
        self.chunks: list[tuple[np.ndarray, np.ndarray]] = []
        self.size = 0
        self.left = 0  # keys taken since the last merge, still in `chunks`
        self.pending: set[Any] = set()
        self.arrived: list[pa.Array | pa.ChunkedArray] = []
        self.used = time.monotonic()

    @classmethod
    def read(cls, con: duckdb.DuckDBPyConnection, table: str, column: str, nbins: int) -> BinnedKeys:
        """The table's keys (a column of a `SIGNED` type) as DuckDB holds them now."""
        keys = con.sql(f"SELECT {quote(column)} FROM {quote(table)}").to_arrow_table().column(0)
        binned = cls(nbins)
        binned._append(keys)
        return binned

    @property
    def stale(self) -> bool:
        """Worth dropping rather than keeping up to date: too many keys written since, or no step for long."""
        return len(self.pending) > MAX_PENDING or time.monotonic() - self.used > IDLE_S

    def take(self, old: PartitionMap, new: PartitionMap, partition: int) -> pa.Array | None:
        """The keys of the bins `partition` owns under `old` and not under `new`; None if a key written
        since is not a plain int64 (then the table must be read again)."""
        if not self._fold():
            return None
        self.used = time.monotonic()
        kept = np.asarray(new.owner, dtype=np.int32) == partition
        gives = (np.asarray(old.owner, dtype=np.int32) == partition) & ~kept
        taken = [keys[gives[bins]] for keys, bins in self.chunks]
        out = np.concatenate(taken) if taken else np.empty(0, np.int64)
        self.left += len(out)
        if self.left * 2 > self.size or len(self.chunks) > MAX_CHUNKS:
            self._compact(kept)
        return pa.array(out, pa.int64())

    def _fold(self) -> bool:
        if self.pending:
            if any(type(k) is not int or not -(1 << 63) <= k < (1 << 63) for k in self.pending):
                return False
            self.arrived.append(pa.array(list(self.pending), pa.int64()))
            self.pending = set()
        for keys in self.arrived:
            self._append(keys)
        self.arrived = []
        return True

    def _append(self, keys: pa.Array | pa.ChunkedArray) -> None:
        if not len(keys):
            return
        keys = keys.cast(pa.int64())
        self.chunks.append((keys.to_numpy(), bins_of(keys, self.nbins)))
        self.size += len(keys)

    def _compact(self, owned: np.ndarray) -> None:
        """One array again, of the keys of the bins this partition owns (`owned`, per bin)."""
        keys = np.concatenate([k for k, _ in self.chunks]) if self.chunks else np.empty(0, np.int64)
        bins = np.concatenate([b for _, b in self.chunks]) if self.chunks else np.empty(0, np.int64)
        here = owned[bins]
        self.chunks = [(keys[here], bins[here])]
        self.size = int(here.sum())
        self.left = 0
