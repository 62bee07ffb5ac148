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
- `streamtx_push_seconds`: a histogram of each pushed batch's time from
  admission (the front took it) to its outcome (committed, rejected or
  duplicate, durable as `--durability` says): what a producer waits;
- `process_*` of the front process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from streamtx.server.front.front import Front

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

    def __init__(self, front: Front, loop: asyncio.AbstractEventLoop) -> None:
        self.front = front
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        future = asyncio.run_coroutine_threadsafe(self.front.status(), self.loop)
        try:
            status = future.result(timeout=SCRAPE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise
        yield from families(status)


def families(status: dict[str, Any]) -> list[Metric]:
    """The metric families of a status snapshot (`Front.status()`)."""
    front = CounterMetricFamily("streamtx_front_events", "Events counted by the front", labels=["event"])
    parts = CounterMetricFamily(
        "streamtx_partition_events", "Events counted by each partition", labels=["partition", "event"]
    )
    rows = GaugeMetricFamily(
        "streamtx_table_rows", "Rows each partition holds of each table", labels=["partition", "table"]
    )
    for name, value in sorted(status["counters"].items()):
        head, dot, rest = name.partition(".")
        if dot and head.startswith("partition") and head[len("partition") :].isdigit():
            partition = head[len("partition") :]
            if rest.startswith("rows."):
                rows.add_metric([partition, rest[len("rows.") :]], value)
            else:
                parts.add_metric([partition, rest], value)
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
    return [front, parts, rows, up, queued, last]


def serve_metrics(front: Front, host: str, port: int) -> tuple[WSGIServer, int]:
    """Starts the HTTP endpoint on a thread of its own; returns it and the port it listens on."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessCollector(registry=None))
    registry.register(StatusCollector(front, asyncio.get_running_loop()))
    registry.register(front.push_seconds)
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port
