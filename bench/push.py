"""Ingestion throughput: Arrow vs protobuf rows, pipelined PushStream vs unary Push.

Starts one embedded server (one partition, `--executor`, serial by default)
with a stream `bench_in(id BIGINT, k BIGINT, v DOUBLE, s VARCHAR)` that no
procedure consumes (plain ingestion; a small --stream-retention keeps its
storage bounded), then pushes atomic batches of each size under four
configurations, interleaved for several rounds:

  encoding arrow | protobuf  x  rpc stream (PushStream, pipelined) | unary (Push, sequential)

Each configuration prints one line with its median round: rows/s, batches/s and
per-batch latency (unary: the call's round trip; stream: from admission into
the client's window to the ack, so it includes queueing behind the batches in
flight). Then two ratio lines: arrow/protobuf rows/s at the largest batch size
(both over PushStream) and stream/unary batches/s at the smallest (Arrow).
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from streamtx.server.config import EXECUTORS

from .common import (
    Measurement,
    find_line,
    interleave,
    latency_summary,
    median_round,
    note,
    parse_sizes,
    plot_bars,
    progress,
    push_batches,
    ratio_line,
    round_sig,
)

NAME = "push"
STREAM = "bench_in"
DDL = f"CREATE STREAM {STREAM} (id BIGINT, k BIGINT, v DOUBLE, s VARCHAR);"
ENCODINGS = ("arrow", "protobuf")
RPCS = ("stream", "unary")
DEFAULT_SIZES = (1, 100, 10_000)
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 2
# Batches per configuration: rows budget / batch rows, clamped (same count for every
# configuration of one batch size, so their lines compare like for like).
FULL_BATCHES = (600_000, 60, 600)  # (rows budget, at least, at most)
QUICK_BATCHES = (40_000, 6, 80)
ARROW_OVER_PROTOBUF_TARGET = 2.0
STREAM_OVER_UNARY_TARGET = 5.0


@dataclass(frozen=True)
class Config:
    encoding: str  # arrow | protobuf
    rpc: str  # stream | unary
    batch_rows: int
    batches: int

    @property
    def label(self) -> str:
        return f"{self.encoding}/{self.rpc}/{self.batch_rows}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-sizes",
        type=parse_sizes,
        default=DEFAULT_SIZES,
        metavar="N,N,...",
        help=f"rows per atomic batch, comma-separated (default {','.join(map(str, DEFAULT_SIZES))})",
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=None,
        help="batches per configuration and round (default: from the batch size; fewer with --quick)",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        help="PushStream window: unacknowledged batches per producer (default %(default)s)",
    )
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="serial",
        help="the server's batch executor (default %(default)s)",
    )
    parser.add_argument(
        "--stream-retention",
        type=int,
        default=100,
        help="batches the server keeps on the unconsumed stream (default %(default)s)",
    )


def batches_for(rows: int, quick: bool) -> int:
    budget, lo, hi = QUICK_BATCHES if quick else FULL_BATCHES
    return max(lo, min(hi, budget // rows))


def configurations(sizes: tuple[int, ...], quick: bool, batches: int | None = None) -> list[Config]:
    return [Config(enc, rpc, n, batches or batches_for(n, quick)) for n in sizes for enc in ENCODINGS for rpc in RPCS]


def make_table(rows: int, seed: int = 0) -> pa.Table:
    """A batch for `bench_in`: sequential ids, 1,000 distinct keys, random doubles, short strings."""
    rng = np.random.default_rng(seed)
    ids = np.arange(rows, dtype=np.int64)
    keys = ids % 1000
    return pa.table(
        {
            "id": pa.array(ids),
            "k": pa.array(keys),
            "v": pa.array(rng.random(rows)),
            "s": pa.array([f"item-{k:04d}" for k in keys.tolist()], pa.string()),
        }
    )


# -- one measurement ----------------------------------------------------------------


async def _measure(target: str, cfg: Config, producer: str, table: pa.Table, max_in_flight: int) -> Measurement:
    return await push_batches(
        target,
        STREAM,
        producer,
        [table] * cfg.batches,
        pipelined=cfg.rpc == "stream",
        arrow=cfg.encoding == "arrow",
        max_in_flight=max_in_flight,
        what=f"bench push {cfg.label}",
    )


def _line(cfg: Config, rounds: list[Measurement], args: argparse.Namespace) -> dict[str, Any]:
    m = median_round(rounds, key=lambda x: x.per_s)
    return {
        "benchmark": NAME,
        "encoding": cfg.encoding,
        "rpc": cfg.rpc,
        "batch_rows": cfg.batch_rows,
        "batches": cfg.batches,
        "rows_per_s": round_sig(m.per_s * cfg.batch_rows),
        "batches_per_s": round_sig(m.per_s),
        "latency_ms": latency_summary(m.latencies),
        "rounds": len(rounds),
        "batches_per_s_rounds": [round_sig(x.per_s) for x in rounds],
        "max_in_flight": args.max_in_flight if cfg.rpc == "stream" else 1,
        "executor": args.executor,
        "load_1m": m.extra.get("load_1m"),
    }


def ratios(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The two ratio lines over the configuration lines."""
    sizes = sorted({line["batch_rows"] for line in lines})
    big, small = sizes[-1], sizes[0]
    arrow = find_line(lines, encoding="arrow", rpc="stream", batch_rows=big)
    proto = find_line(lines, encoding="protobuf", rpc="stream", batch_rows=big)
    stream = find_line(lines, encoding="arrow", rpc="stream", batch_rows=small)
    unary = find_line(lines, encoding="arrow", rpc="unary", batch_rows=small)
    return [
        ratio_line(
            NAME,
            arrow["rows_per_s"] / proto["rows_per_s"],
            ARROW_OVER_PROTOBUF_TARGET,
            f"rows/s arrow over PushStream, {big}-row batches",
            f"rows/s protobuf rows over PushStream, {big}-row batches",
            batch_rows=big,
            numerator_value=arrow["rows_per_s"],
            denominator_value=proto["rows_per_s"],
        ),
        ratio_line(
            NAME,
            stream["batches_per_s"] / unary["batches_per_s"],
            STREAM_OVER_UNARY_TARGET,
            f"batches/s PushStream (pipelined, {stream['max_in_flight']} in flight), arrow, {small}-row batches",
            f"batches/s unary Push (sequential), arrow, {small}-row batches",
            batch_rows=small,
            numerator_value=stream["batches_per_s"],
            denominator_value=unary["batches_per_s"],
        ),
    ]


# -- the verb -------------------------------------------------------------------------


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from streamtx.client import Client
    from streamtx.server.embedded import EmbeddedServer

    configs = configurations(args.batch_sizes, args.quick, args.batches)
    tables = {n: make_table(n, seed=n) for n in args.batch_sizes}
    run_id = uuid.uuid4().hex[:8]
    extra = ["--stream-retention", str(args.stream_retention)]
    with EmbeddedServer(executor=args.executor, extra_args=extra) as srv:
        with Client(srv.target) as c:
            c.deploy(DDL)

        # Untimed warm-up: every code path once (first DuckDB appends, gRPC calls, encoders).
        for enc in ENCODINGS:
            for rpc in RPCS:
                for n in args.batch_sizes:
                    warm = Config(enc, rpc, n, 2 if args.quick else 5)
                    producer = f"bench-push-{run_id}-warmup-{enc}-{rpc}-{n}"
                    asyncio.run(_measure(srv.target, warm, producer, tables[n], args.max_in_flight))

        total = len(configs) * args.rounds
        with progress(args.quiet) as bar:
            task = bar.add_task("bench push", total=total)

            def one(cfg: Config, r: int) -> Measurement:
                bar.update(task, description=f"push {cfg.label} round {r + 1}/{args.rounds}")
                producer = f"bench-push-{run_id}-{cfg.encoding}-{cfg.rpc}-{cfg.batch_rows}-r{r}"
                return asyncio.run(_measure(srv.target, cfg, producer, tables[cfg.batch_rows], args.max_in_flight))

            def done(cfg: Config, r: int, m: Measurement) -> None:
                bar.advance(task)
                bar.print(f"{cfg.label} round {r + 1}: {m.per_s:,.1f} batches/s")

            results = interleave(configs, one, args.rounds, on_done=done)
    lines = [_line(cfg, rounds, args) for cfg, rounds in zip(configs, results, strict=True)]
    note(f"bench push: {len(configs)} configurations x {args.rounds} rounds, run {run_id}", args.quiet)
    return lines + ratios(lines)


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Grouped bars: rows/s (log scale) per batch size, one bar per encoding/rpc."""
    lines = [r for r in records if "encoding" in r]
    sizes = sorted({r["batch_rows"] for r in lines})
    series: dict[str, list[float | None]] = {}
    for enc in ENCODINGS:
        for rpc in RPCS:
            label = f"{enc} / {'PushStream' if rpc == 'stream' else 'unary Push'}"
            values: list[float | None] = []
            for n in sizes:
                try:
                    values.append(find_line(lines, encoding=enc, rpc=rpc, batch_rows=n)["rows_per_s"])
                except KeyError:
                    values.append(None)
            series[label] = values
    executor = lines[0].get("executor", "") if lines else ""
    return plot_bars(
        path,
        [f"{n:,} row{'s' if n != 1 else ''}/batch" for n in sizes],
        series,
        title=f"streamtx push throughput ({executor} executor, median round)",
        xlabel="batch size",
        ylabel="rows/s (log)",
        log=True,
    )
