"""Staged rows of two-phase pushes: many writers stage, one commit makes the batch.

A Spark micro-batch is written by many tasks (and, with retries and
speculation, by more attempts than tasks) but must reach the stream as one
atomic batch, once. Writers stage their rows here under a staging id (the
future batch) and a part name (the writer attempt); the driver's commit names
the parts that won, and exactly those become the batch, through the ordinary
push path and its (producer, stream, batch id) deduplication.

For now the rows are held in the front process and pushed on commit (routing
them to the owning partitions at staging time is left for multi-partition
servers). Memory is bounded: a chunk that would exceed `max_bytes` is refused
with RESOURCE_EXHAUSTED and changes nothing; staging ids idle for `ttl_s`
seconds are dropped, so an abandoned attempt cannot hold memory for ever.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from streamtx.errors import FailedPrecondition, InvalidArgument, ResourceExhausted


@dataclass(frozen=True)
class PartSpec:
    """What the committer says a part holds: chunks 0..chunks-1 with `rows` rows."""

    part: str
    chunks: int
    rows: int


@dataclass
class _Entry:
    parts: dict[str, dict[int, pa.Table]] = field(default_factory=dict)
    nbytes: int = 0
    touched: float = 0.0


class Staging:
    def __init__(self, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.nbytes = 0
        self.expired = 0  # staging ids dropped by the TTL (a counter for Status)
        self.discarded = 0  # staged parts a commit did not name (failed or duplicate attempts)
        self._entries: dict[tuple[str, str], _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, stream: str, staging_id: str, part: str, chunk: int, table: pa.Table) -> int:
        """Stages one chunk (replacing an earlier copy of it); returns the bytes staged in all."""
        _check_ids(stream, staging_id)
        if not part:
            raise InvalidArgument(f"stage to {stream!r} ({staging_id}): part is empty")
        if chunk < 0:
            raise InvalidArgument(f"stage to {stream!r} ({staging_id}, part {part}): chunk {chunk} is negative")
        self.expire()
        key = (stream, staging_id)
        entry = self._entries.get(key)
        old = entry.parts.get(part, {}).get(chunk) if entry is not None else None
        grow = table.nbytes - (old.nbytes if old is not None else 0)
        if self.nbytes + grow > self.max_bytes:
            raise ResourceExhausted(
                f"stage to {stream!r} ({staging_id}, part {part}): {table.nbytes} more bytes would exceed the "
                f"staging limit of {self.max_bytes} bytes ({self.nbytes} staged; --staging-max-bytes); "
                "commit or abort staged batches first, or stage smaller batches"
            )
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.parts.setdefault(part, {})[chunk] = table
        entry.nbytes += grow
        entry.touched = self.clock()
        self.nbytes += grow
        return self.nbytes

    def take(self, stream: str, staging_id: str, specs: Sequence[PartSpec], schema: pa.Schema) -> pa.Table | None:
        """The named parts as one table, dropping the staging id (losing parts too).

        None when nothing is staged under the id (already committed, aborted,
        expired, or never staged). A named part that is incomplete or holds
        other row counts than the committer says is FAILED_PRECONDITION, and
        nothing is dropped.
        """
        _check_ids(stream, staging_id)
        names = [s.part for s in specs]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"commit of {stream!r} ({staging_id}): a part is named twice")
        self.expire()
        entry = self._entries.get((stream, staging_id))
        if entry is None:
            return None
        pieces: list[pa.Table] = []
        for spec in specs:
            chunks = entry.parts.get(spec.part, {})
            missing = [c for c in range(spec.chunks) if c not in chunks]
            if missing:
                raise FailedPrecondition(
                    f"commit of {stream!r} ({staging_id}): part {spec.part} lacks chunk(s) "
                    f"{', '.join(map(str, missing[:5]))} of {spec.chunks}"
                )
            got = sum(chunks[c].num_rows for c in range(spec.chunks))
            if got != spec.rows:
                raise FailedPrecondition(
                    f"commit of {stream!r} ({staging_id}): part {spec.part} holds {got} rows, "
                    f"the commit says {spec.rows}"
                )
            pieces.extend(chunks[c] for c in range(spec.chunks))
        self._drop((stream, staging_id))
        self.discarded += len(set(entry.parts) - set(names))
        if not pieces:
            return schema.empty_table()
        return pa.concat_tables([p.select(schema.names).cast(schema) for p in pieces])

    def drop(self, stream: str, staging_id: str) -> int:
        """Discards a staging id; returns how many parts it held."""
        _check_ids(stream, staging_id)
        entry = self._drop((stream, staging_id))
        return len(entry.parts) if entry is not None else 0

    def expire(self) -> int:
        """Drops the staging ids idle for longer than the TTL; returns how many."""
        horizon = self.clock() - self.ttl_s
        old = [key for key, e in self._entries.items() if e.touched < horizon]
        for key in old:
            self._drop(key)
        self.expired += len(old)
        return len(old)

    def _drop(self, key: tuple[str, str]) -> _Entry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry.nbytes
        return entry


def _check_ids(stream: str, staging_id: str) -> None:
    if not stream:
        raise InvalidArgument("staging: no stream named")
    if not staging_id:
        raise InvalidArgument(f"staging for {stream!r}: staging_id is empty")


__all__ = ["PartSpec", "Staging"]
