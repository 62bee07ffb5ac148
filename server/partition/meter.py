"""What a partition worker measures for `Status` (and so for `--metrics-port` and `streamtx top`).

Plain integers and floats, added to where the work already happens once per
TE, per commit, per log group or per checkpoint (never per tuple); nothing
here is a Prometheus object: the front turns a `snapshot` into metric
families (front/metrics.py). A histogram is kept as one count per bucket
(not cumulative) plus the sum; its count is the sum of its buckets, so a
snapshot taken while another thread observes (the command log's flusher)
never has a count its buckets disagree with.

Only live work is counted: what recovery replays from the log is not
(`Dataflow` folds a run's TEs in only once it has a journal).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any

from streamtx.server import log

TE_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Seconds of one TE's run, 50 µs to 10 s."""
SYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds to write and fdatasync one group of command-log records."""
CHECKPOINT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Seconds of one checkpoint, from its cut to its files written."""
INTERVAL_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
"""TEs committed by one punctuation interval."""


class Hist:
    """A histogram of plain numbers: `counts[i]` observations in (bounds[i-1], bounds[i]], the last above all."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def snapshot(self) -> dict[str, Any]:
        """As `streamtx.v1.Histogram` (the field names of the protobuf message)."""
        counts = list(self.counts)
        return {"bounds": list(self.bounds), "counts": counts, "sum": self.sum, "count": sum(counts)}


class ProcedureMeter:
    """One procedure's TEs on this partition: committed (with their run times) and aborted."""

    __slots__ = ("aborted", "committed", "seconds")

    def __init__(self) -> None:
        self.committed = 0
        self.aborted = 0
        self.seconds = Hist(TE_BUCKETS)


class Meter:
    """A partition's measurements; one per worker, used by its executing thread (and the log's flusher)."""

    def __init__(self, partition: int, slow_te_s: float = 0.0) -> None:
        self.partition = partition
        self.slow_te_s = slow_te_s  # a committed TE that ran longer is logged (`slow_te`); 0: never
        self.procedures: dict[str, ProcedureMeter] = {}
        self.log_sync = Hist(SYNC_BUCKETS)  # observed by the command log's flusher thread
        self.checkpoint = Hist(CHECKPOINT_BUCKETS)
        self.interval_tes = Hist(INTERVAL_BUCKETS)
        self.checkpoint_bytes = 0
        self.recovery_seconds = 0.0

    def _procedure(self, name: str) -> ProcedureMeter:
        meter = self.procedures.get(name)
        if meter is None:
            meter = self.procedures[name] = ProcedureMeter()
        return meter

    def committed(self, timed: list[tuple[str, float]], ts: int, batch: tuple[str, str, int] | None = None) -> None:
        """TEs of one command that committed, each with its run time; a slow one is logged."""
        slow = self.slow_te_s
        for procedure, seconds in timed:
            meter = self._procedure(procedure)
            meter.committed += 1
            meter.seconds.observe(seconds)
            if slow and seconds > slow:
                self._slow(procedure, seconds, ts, batch)

    def aborted(self, procedures: list[str]) -> None:
        for procedure in procedures:
            self._procedure(procedure).aborted += 1

    def _slow(self, procedure: str, seconds: float, ts: int, batch: tuple[str, str, int] | None) -> None:
        fields: dict[str, Any] = {"procedure": procedure, "ts": ts, "ms": round(seconds * 1000, 3)}
        where = f"at timestamp {ts}"
        if batch is not None:
            fields.update(producer=batch[0], stream=batch[1], batch_id=batch[2])
            where += f" (batch {batch[2]} of producer {batch[0]!r} on stream {batch[1]!r})"
        limit = f"--slow-te-ms {self.slow_te_s * 1000:g}"
        log.event(
            "slow_te",
            f"slow TE: procedure {procedure} {where} ran {seconds * 1000:.3f} ms ({limit})",
            level="warning",
            partition=self.partition,
            **fields,
        )

    def snapshot(self, *, log_bytes: int, dedup: dict[str, int]) -> dict[str, Any]:
        """As `streamtx.v1.PartitionMetrics`; `log_bytes` and `dedup` are measured by the caller, now."""
        return {
            "cpu_seconds": time.process_time(),
            "procedures": [
                {
                    "procedure": name,
                    "tes_committed": m.committed,
                    "tes_aborted": m.aborted,
                    "te_seconds": m.seconds.snapshot(),
                }
                for name, m in sorted(self.procedures.items())
            ],
            "log_sync_seconds": self.log_sync.snapshot(),
            "checkpoint_seconds": self.checkpoint.snapshot(),
            "interval_tes": self.interval_tes.snapshot(),
            "log_bytes": log_bytes,
            "checkpoint_bytes": self.checkpoint_bytes,
            "dedup": dedup,
            "recovery_seconds": self.recovery_seconds,
        }
