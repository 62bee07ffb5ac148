"""Front <-> partition messages: the cost per message and per row of the Arrow IPC path.

The front talks to each partition worker over a Unix socket pair; a message
is a pickled header plus Arrow IPC bodies (server/ipc.py). This verb starts
one real worker process, as the server does, and sends it `echo` requests
(the worker sends the tables back) with 0 .. 100,000 rows, one at a time and
pipelined (32 in flight). It shows that a message costs tens of microseconds whatever it
carries, and a row a few nanoseconds: batches, not tuples, cross processes.
The `ratio` line is rows/s in 10,000-row messages over rows/s in 1-row
messages (pipelined both): what sending tuples one by one would cost.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from streamtx.server import protocol as pr
from streamtx.server.config import ServerConfig
from streamtx.server.front.partitions import Partitions, checked
from streamtx.server.launch import launch

from .common import Stopwatch, median_round, plot_lines, progress, ratio_line, round_sig

NAME = "ipc"
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 2
ROWS = (0, 1, 100, 10_000, 100_000)
TARGET = 100.0
WINDOW = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=2000, help="messages per configuration and round")


def _table(rows: int) -> pa.Table:
    rng = np.random.default_rng(rows)
    return pa.table(
        {
            "key": pa.array(np.arange(rows, dtype=np.int64)),
            "value": pa.array(rng.random(rows)),
            "label": pa.array([f"k{i % 97}" for i in range(rows)], pa.string()),
        }
    )


async def _measure(parts: Partitions, rows: int, messages: int, pipelined: bool) -> dict[str, Any]:
    table = _table(rows)
    tables = [table] if rows else []
    worker = parts[0]
    with Stopwatch() as sw:
        if pipelined:  # a window of WINDOW messages in flight, as the front keeps batches in flight
            window: collections.deque[asyncio.Future] = collections.deque()
            for _ in range(messages):
                if len(window) >= WINDOW:
                    reply = await window.popleft()
                    assert sum(t.num_rows for t in checked(reply)[1]) == rows
                window.append(worker.send(pr.Echo(), tables))
            for fut in window:
                reply = await fut
                assert sum(t.num_rows for t in checked(reply)[1]) == rows
        else:
            for _ in range(messages):
                reply = await worker.request(pr.Echo(), tables)
                assert sum(t.num_rows for t in reply[1]) == rows
    return {"elapsed": sw.elapsed, "messages": messages}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    messages = max(50, args.messages // (10 if args.quick else 1))
    configs = [(rows, pipelined) for rows in ROWS for pipelined in (False, True)]

    async def main() -> list[list[dict[str, Any]]]:
        with tempfile.TemporaryDirectory() as tmp:
            config = ServerConfig(data_dir=Path(tmp), partitions=1)
            parts = Partitions(config)
            launched = launch(config)
            await parts.attach(launched.workers)
            try:
                await _measure(parts, 1, 200, False)  # warm-up: imports, buffers
                out: list[list[dict[str, Any]]] = [[] for _ in configs]
                with progress(args.quiet) as bar:
                    task = bar.add_task("bench ipc", total=len(configs) * args.rounds)
                    for _ in range(args.rounds):
                        for i, (rows, pipelined) in enumerate(configs):
                            n = messages if rows < 100_000 else max(20, messages // 20)
                            out[i].append(await _measure(parts, rows, n, pipelined))
                            bar.advance(task)
                return out
            finally:
                await parts.stop()
                launched.lock.close()

    results = asyncio.run(main())
    records = []
    for (rows, pipelined), rounds in zip(configs, results, strict=True):
        best = median_round(rounds, key=lambda r: r["messages"] / r["elapsed"])
        per_message_us = best["elapsed"] / best["messages"] * 1e6
        records.append(
            {
                "benchmark": NAME,
                "rows": rows,
                "mode": "pipelined" if pipelined else "round trip",
                "messages_per_s": round_sig(best["messages"] / best["elapsed"]),
                "us_per_message": round_sig(per_message_us),
                "rows_per_s": round_sig(rows * best["messages"] / best["elapsed"]),
                "ns_per_row": round_sig(per_message_us * 1000 / rows) if rows else None,
            }
        )
    by = {(r["rows"], r["mode"]): r for r in records}
    batched, single = by[(10_000, "pipelined")], by[(1, "pipelined")]
    records.append(
        ratio_line(
            NAME,
            batched["rows_per_s"] / single["rows_per_s"],
            TARGET,
            "rows/s in 10,000-row messages",
            "rows/s in 1-row messages",
            us_per_message_empty=by[(0, "pipelined")]["us_per_message"],
            ns_per_row_batched=batched["ns_per_row"],
        )
    )
    return records


def plot(records: list[dict[str, Any]], path: Path) -> Path:
    lines = [r for r in records if "rows" in r and r["rows"] > 0]
    xs = sorted({r["rows"] for r in lines})
    series = {
        mode: [next(r["us_per_message"] for r in lines if r["rows"] == x and r["mode"] == mode) for x in xs]
        for mode in ("round trip", "pipelined")
    }
    return plot_lines(
        path,
        xs,
        series,
        title="front <-> partition: cost per message (echo of an Arrow batch)",
        xlabel="rows per message",
        ylabel="microseconds per message",
        logx=True,
        logy=True,
    )
