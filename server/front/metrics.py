"""Prometheus metrics (`streamtx serve --metrics-port`): what `streamtx status` shows, scraped over HTTP.

A scrape asks the front for one status snapshot on its event loop, the way a
`Status` RPC does (each partition answers in command order), so the numbers
of one scrape belong to one moment; nothing is counted twice to serve them.
The endpoint listens on `--host` like the gRPC port (127.0.0.1 unless told
otherwise) and only reads. Families (`docs/operations.md` lists them):

- `streamtx_front_events_total{event}`: the front's counters (batches
  committed, rejected, duplicate; coordinated commands, calls, queries, ...);
- `streamtx_partition_events_total{partition, event}`: each partition's
  (committed, rows, intervals, fragments, TEs aborted, ...);
- `streamtx_table_rows{partition, table}`: rows each partition holds;
- `streamtx_partition_up{partition}`, `streamtx_partition_queued{partition}`:
  whether a worker is serving, and the commands sent to it not yet answered;
- `streamtx_last_timestamp`: the newest global timestamp given out;
- `streamtx_in_flight_batches`, `streamtx_in_flight_bytes`,
  `streamtx_admission_waiting`: what admission holds and who waits for it
  (front/admission.py); `streamtx_front_events_total{event="push_refused"}`
  counts unary pushes refused with a retry hint;
- `streamtx_push_seconds`: a histogram of each pushed batch's time from
  admission (the front took it) to its outcome (committed, rejected or
  duplicate, durable as `--durability` says): what a producer waits;
- `streamtx_stream_batches_total{stream, outcome}`, `streamtx_stream_rows_total{stream}`:
  the front's count of each stream's batch outcomes, and of committed rows;
- measured by each partition worker (partition/meter.py) and carried in its
  Status reply: `streamtx_procedure_tes_total{partition, procedure, outcome}`,
  the histograms `streamtx_te_seconds{partition, procedure}`,
  `streamtx_log_sync_seconds`, `streamtx_checkpoint_seconds`,
  `streamtx_interval_tes` (`{partition}`), the gauges `streamtx_log_bytes`,
  `streamtx_checkpoint_bytes`, `streamtx_dedup_entries{partition, table}`,
  `streamtx_partition_recovery_seconds`, and the counter
  `streamtx_partition_cpu_seconds_total`; `streamtx_recovery_seconds`: the
  front's last recovery;
- `process_*` of the front process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from streamtx.server.front.ports import Observed

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

SCRAPE_TIMEOUT_S = 10.0  # a scrape waits behind a coordinated command at most this long
PUSH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def push_latency() -> Histogram:
    """The front's histogram of admission-to-outcome seconds per pushed batch (observed whether served or not)."""
    return Histogram(
        "streamtx_push_seconds",
        "Seconds from a pushed batch's admission to its outcome",
        buckets=PUSH_BUCKETS,
        registry=None,
    )


class StatusCollector(Collector):
    """Turns one `Front.status()` snapshot into metric families, per scrape."""

    def __init__(
        self, status: Callable[[], Coroutine[Any, Any, dict[str, Any]]], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.status = status
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        future = asyncio.run_coroutine_threadsafe(self.status(), self.loop)
        try:
            status = future.result(timeout=SCRAPE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise
        yield from families(status)


ADMISSION = {
    "in_flight_batches": "Pushed batches admitted and not answered (bounded by --max-in-flight)",
    "in_flight_bytes": "Bytes of pushed messages admitted and not answered (bounded by --max-in-flight-bytes)",
    "admission_waiting": "Push requests waiting for admission",
}
"""Front status numbers that are levels, not counts: gauges of their own (front/admission.py)."""


def families(status: dict[str, Any]) -> list[Metric]:
    """The metric families of a status snapshot (`Front.status()`)."""
    front = CounterMetricFamily("streamtx_front_events", "Events counted by the front", labels=["event"])
    parts = CounterMetricFamily(
        "streamtx_partition_events", "Events counted by each partition", labels=["partition", "event"]
    )
    rows = GaugeMetricFamily(
        "streamtx_table_rows", "Rows each partition holds of each table", labels=["partition", "table"]
    )
    admission: list[Metric] = []
    for name, value in sorted(status["counters"].items()):
        head, dot, rest = name.partition(".")
        if dot and head.startswith("partition") and head[len("partition") :].isdigit():
            partition = head[len("partition") :]
            if rest.startswith("rows."):
                rows.add_metric([partition, rest[len("rows.") :]], value)
            else:
                parts.add_metric([partition, rest], value)
        elif name in ADMISSION:
            admission.append(GaugeMetricFamily(f"streamtx_{name}", ADMISSION[name], value=value))
        else:
            front.add_metric([name], value)
    up = GaugeMetricFamily("streamtx_partition_up", "1 while the partition's worker serves", labels=["partition"])
    queued = GaugeMetricFamily(
        "streamtx_partition_queued", "Commands sent to the partition, not answered yet", labels=["partition"]
    )
    for p in status["partitions"]:
        up.add_metric([str(p["id"])], 1.0 if p["alive"] and not p["error"] else 0.0)
        queued.add_metric([str(p["id"])], p["queued"])
    last = GaugeMetricFamily("streamtx_last_timestamp", "The newest global timestamp the sequencer gave out")
    last.add_metric([], status["last_timestamp"])
    return [front, parts, rows, up, queued, last, *admission, *stream_families(status), *partition_families(status)]


def stream_families(status: dict[str, Any]) -> list[Metric]:
    """The front's per-stream counts of batch outcomes and committed rows."""
    batches = CounterMetricFamily(
        "streamtx_stream_batches", "Pushed batches of each stream by outcome", labels=["stream", "outcome"]
    )
    rows = CounterMetricFamily("streamtx_stream_rows", "Rows of each stream's committed batches", labels=["stream"])
    for s in status.get("stream_metrics", []):
        for outcome in ("committed", "rejected", "duplicate"):
            batches.add_metric([s["stream"], outcome], s.get(outcome, 0))
        rows.add_metric([s["stream"]], s.get("rows", 0))
    recovery = GaugeMetricFamily(
        "streamtx_recovery_seconds", "Seconds the front's last recovery took (start-up or worker restart)"
    )
    recovery.add_metric([], status.get("recovery_seconds", 0.0))
    return [batches, rows, recovery]


def partition_families(status: dict[str, Any]) -> list[Metric]:
    """What each answering partition's worker measured (its Status reply's `metrics`, partition/meter.py)."""
    tes = CounterMetricFamily(
        "streamtx_procedure_tes",
        "TEs of each procedure on each partition: committed, or aborted",
        labels=["partition", "procedure", "outcome"],
    )
    te_seconds = HistogramMetricFamily(
        "streamtx_te_seconds", "Run time of each committed TE, seconds", labels=["partition", "procedure"]
    )
    sync = HistogramMetricFamily(
        "streamtx_log_sync_seconds",
        "Seconds to write and fdatasync one group of command-log records (group commit)",
        labels=["partition"],
    )
    checkpoint = HistogramMetricFamily(
        "streamtx_checkpoint_seconds", "Seconds of one checkpoint, its cut to its files written", labels=["partition"]
    )
    interval = HistogramMetricFamily(
        "streamtx_interval_tes", "TEs committed by one punctuation interval", labels=["partition"]
    )
    cpu = CounterMetricFamily(
        "streamtx_partition_cpu_seconds", "CPU seconds of each partition's worker process", labels=["partition"]
    )
    log_bytes = GaugeMetricFamily(
        "streamtx_log_bytes", "Bytes of each partition's command log on disk", labels=["partition"]
    )
    ckpt_bytes = GaugeMetricFamily(
        "streamtx_checkpoint_bytes", "Bytes of the last checkpoint each partition wrote", labels=["partition"]
    )
    dedup = GaugeMetricFamily(
        "streamtx_dedup_entries",
        "Exactly-once entries each partition holds: marks (producer, stream), taken (batch ids), rejections",
        labels=["partition", "table"],
    )
    recovery = GaugeMetricFamily(
        "streamtx_partition_recovery_seconds",
        "Seconds each partition's worker took to recover at its last start",
        labels=["partition"],
    )
    for p in status["partitions"]:
        m = p.get("metrics")
        if not m:
            continue
        part = str(p["id"])
        for proc in m["procedures"]:
            tes.add_metric([part, proc["procedure"], "committed"], proc["tes_committed"])
            tes.add_metric([part, proc["procedure"], "aborted"], proc["tes_aborted"])
            _histogram(te_seconds, [part, proc["procedure"]], proc["te_seconds"])
        _histogram(sync, [part], m["log_sync_seconds"])
        _histogram(checkpoint, [part], m["checkpoint_seconds"])
        _histogram(interval, [part], m["interval_tes"])
        cpu.add_metric([part], m["cpu_seconds"])
        log_bytes.add_metric([part], m["log_bytes"])
        ckpt_bytes.add_metric([part], m["checkpoint_bytes"])
        for table, n in sorted(m["dedup"].items()):
            dedup.add_metric([part, table], n)
        recovery.add_metric([part], m["recovery_seconds"])
    return [tes, te_seconds, sync, checkpoint, interval, cpu, log_bytes, ckpt_bytes, dedup, recovery]


def _histogram(family: HistogramMetricFamily, labels: list[str], h: dict[str, Any]) -> None:
    """Adds a histogram kept as per-bucket counts (partition/meter.py `Hist`) with Prometheus' cumulative buckets."""
    buckets, seen = [], 0
    for bound, n in zip(h["bounds"], h["counts"], strict=False):
        seen += n
        buckets.append((floatToGoString(bound), seen))
    buckets.append(("+Inf", h["count"]))
    family.add_metric(labels, buckets, sum_value=h["sum"])


def serve_metrics(front: Observed, host: str, port: int) -> tuple[WSGIServer, int]:
    """Starts the HTTP endpoint on a thread of its own; returns it and the port it listens on."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessCollector(registry=None))
    registry.register(StatusCollector(front.status, asyncio.get_running_loop()))
    registry.register(front.push_seconds)
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port
