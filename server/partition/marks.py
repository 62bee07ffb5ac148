"""Exactly-once bookkeeping of one partition: which batches it took, and its clock.

A *mark* is the last batch id a producer's stream had taken here: batches are
taken in batch-id order, so every id at or below it is a re-send. The *clock*
is the highest global timestamp the partition ran. Both only move forward,
and only after the DuckDB transaction holding the batch's effects (and the
durable copy of its mark, `producers`/`taken` system tables, engine.py)
committed: a rolled-back batch leaves them as they were.

Laws, asserted on every path (interval, isolated batch, coordinated
fragment, span, rejection, replay):
- a mark only increases: taking a batch at or below its stream's mark is a
  bug in the caller, which should have answered DUPLICATE;
- the clock never goes back: the sequencer hands out timestamps in order and
  each partition runs its queue in that order.
"""

from __future__ import annotations

from collections.abc import Iterable

Mark = tuple[str, str]
"""(producer id, stream)"""

Taken = tuple[str, str, int, int]
"""A batch taken: (producer id, stream, batch id, timestamp)."""


class Marks:
    def __init__(self) -> None:
        self._last: dict[Mark, int] = {}
        self.last_ts = 0

    def last(self, producer: str, stream: str) -> int:
        """The last batch id taken of this producer's stream (0: none)."""
        return self._last.get((producer, stream), 0)

    def taken(self, producer: str, stream: str, batch_id: int) -> bool:
        """Whether a batch with this id was taken (committed or rejected) here: a re-send."""
        return batch_id <= self._last.get((producer, stream), 0)

    def took(self, batches: Iterable[Taken]) -> None:
        """Batches whose transaction committed, in the order they ran."""
        last = self._last
        for producer, stream, batch_id, ts in batches:
            key = (producer, stream)
            assert batch_id > last.get(key, 0), f"batch {batch_id} of {key} taken twice (mark {last.get(key, 0)})"
            last[key] = batch_id
            self.ran(ts)

    def ran(self, ts: int) -> None:
        """A command at `ts` ran (committed, or was answered): the clock moves to it."""
        assert ts >= self.last_ts, f"timestamp {ts} after {self.last_ts}: commands run in timestamp order"
        self.last_ts = ts

    def load(self, rows: Iterable[tuple[str, str, int, int]]) -> None:
        """Marks as the `producers` table holds them (start-up, deploy, checkpoint restore)."""
        self._last = {}
        for producer, stream, batch_id, ts in rows:
            self._last[(producer, stream)] = batch_id
            self.last_ts = max(self.last_ts, ts)

    def restored(self, ts: int) -> None:
        """A checkpoint taken at `ts` was loaded: the clock is at least there."""
        self.last_ts = max(self.last_ts, ts)

    def count(self) -> int:
        """How many (producer, stream) marks this partition holds."""
        return len(self._last)

    def as_dict(self) -> dict[Mark, int]:
        return dict(self._last)
