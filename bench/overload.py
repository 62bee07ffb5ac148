"""Overload: 4 producers push as fast as they can; memory stays bounded, reads keep answering.

One embedded server (2 partitions, opchain, strong durability) per admission
limit (`--max-in-flight`, and `--max-in-flight-bytes` = 1 KiB per batch of
it). Four producer processes push 50-row batches for `--seconds`: two over
one PushStream each (a window of 1,024 batches: flow control is what slows
them), two with unary Push, 64 requests at a time (refused with
RESOURCE_EXHAUSTED and a retry hint when no room comes within `--push-wait`;
the client waits the hint and sends again). Each producer owns its keys, so
its rows are checked exactly once after the run: every batch it sent was
acknowledged committed, and the server's table holds exactly its row count
and value sum.

Meanwhile, every half second, a separate client asks Health and runs a
Query (a count over the partitioned table, gathered from both partitions)
and samples the resident memory of every server process (psutil). Each
configuration's line gives the batches/s taken, the refusals, the peak RSS
per process, and Health and Query latency p50/p99/max. Two ratio lines, for
the smallest limit: 1 s over the slowest Query (target 1: every Query within
1 s), and the memory bound over the largest peak RSS (target 1).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import time
from pathlib import Path
from typing import Any

from .common import latency_summary, note, progress, ratio_line, save_figure

NAME = "overload"
DEFAULT_ROUNDS = 1
QUICK_ROUNDS = 1
DEFAULT_LIMITS = (64, 128, 1024)
SECONDS = 60.0
QUICK_SECONDS = 10.0
ROWS = 50  # rows per batch
KEYS = 100  # keys per producer
PRODUCERS = (("stream", 0), ("stream", 1), ("unary", 2), ("unary", 3))
UNARY_CONCURRENCY = 64
STREAM_WINDOW = 1024
SAMPLE_EVERY = 0.5
DEADLINE_S = 30.0  # of each Health and Query sample: one that takes longer fails the run
RSS_BOUND_MIB = 400
"""What the test and the ratio line hold every server process to; at rest a process takes about 210 MiB here."""

SCRIPT = """
CREATE STREAM events (k INTEGER, v BIGINT) PARTITION BY (k);
CREATE TABLE totals (k INTEGER PRIMARY KEY, n BIGINT NOT NULL, s BIGINT NOT NULL) PARTITION BY (k);
CREATE PROCEDURE tally ON STREAM events AS BEGIN
    INSERT INTO totals SELECT k, count(*), sum(v) FROM events GROUP BY k
        ON CONFLICT DO UPDATE SET n = totals.n + excluded.n, s = totals.s + excluded.s;
END;
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limits",
        type=lambda t: tuple(int(x) for x in t.split(",")),
        default=DEFAULT_LIMITS,
        help="admission limits to run, in batches (--max-in-flight; --max-in-flight-bytes is 1 KiB per batch), "
        f"comma-separated (default {','.join(map(str, DEFAULT_LIMITS))})",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"how long the producers push, per limit (default {SECONDS:g}, {QUICK_SECONDS:g} with --quick)",
    )
    parser.add_argument("--partitions", type=int, default=2, help="partitions of the server")


def _produce(target: str, kind: str, index: int, seconds: float, out: Any) -> None:
    """One producer process: pushes until `seconds` pass, then waits for every ack; reports what it sent."""
    asyncio.run(_produce_async(target, kind, index, seconds, out))


async def _produce_async(target: str, kind: str, index: int, seconds: float, out: Any) -> None:
    from streamtx.client import AsyncClient

    rng = random.Random(index)
    sent = {"kind": kind, "index": index, "batches": 0, "rows": 0, "sum": 0, "not_committed": []}
    window = STREAM_WINDOW if kind == "stream" else UNARY_CONCURRENCY
    async with AsyncClient(target, producer_id=f"overload-{index}", max_in_flight=window) as client:
        slots = asyncio.Semaphore(UNARY_CONCURRENCY)
        pending: set[asyncio.Future] = set()
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            k = index * KEYS + rng.randrange(KEYS)
            rows = [{"k": k, "v": rng.randrange(1000)} for _ in range(ROWS)]
            sent["batches"] += 1
            sent["rows"] += ROWS
            sent["sum"] += sum(r["v"] for r in rows)
            if kind == "stream":
                fut = await client.push("events", rows)
            else:
                await slots.acquire()
                fut = asyncio.ensure_future(client.push_one("events", rows, batch_id=sent["batches"]))
                fut.add_done_callback(lambda _f: slots.release())
            pending.add(fut)
            fut.add_done_callback(pending.discard)
            fut.add_done_callback(lambda f: _check(f, sent))
        if pending:
            await asyncio.wait(pending)
    out.put(sent)


def _check(fut: asyncio.Future, sent: dict[str, Any]) -> None:
    if fut.cancelled() or fut.exception() is not None:
        sent["not_committed"].append(repr(fut.exception()) if not fut.cancelled() else "cancelled")
        return
    ack = fut.result()
    if ack.outcome != "committed" and not (ack.outcome == "duplicate" and ack.original == "committed"):
        sent["not_committed"].append(f"batch {ack.batch_id}: {ack.outcome} {ack.reason}")


def _rss(pids: list[int]) -> list[int | None]:
    import psutil

    out: list[int | None] = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            out.append(None)
    return out


def _sample(producers: list[Any], health: Any, c: Any, pids: list[int], start: float, shown: Any) -> list[dict]:
    """Every SAMPLE_EVERY seconds while a producer runs: Health, a Query, Status and every process's RSS."""
    from grpc_health.v1 import health_pb2

    samples: list[dict[str, Any]] = []
    while any(p.is_alive() for p in producers):
        t0 = time.monotonic()
        health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)
        t1 = time.monotonic()
        c.query("SELECT count(*) FROM totals")
        t2 = time.monotonic()
        in_flight = c.status()["counters"].get("in_flight_batches", 0)
        samples.append(
            {"t": round(t0 - start, 2), "health_s": t1 - t0, "query_s": t2 - t1, "rss": _rss(pids), "in": in_flight}
        )
        shown(t0 - start)
        time.sleep(max(0.0, SAMPLE_EVERY - (time.monotonic() - t0)))
    return samples


def run_limit(limit: int, seconds: float, partitions: int, quiet: bool = False) -> dict[str, Any]:
    """One configuration: the server at `limit`, the four producers, the samples; returns its line."""
    import grpc
    import psutil
    from grpc_health.v1 import health_pb2_grpc

    from streamtx.client import Client
    from streamtx.server.embedded import EmbeddedServer

    extra = ["--max-in-flight", str(limit), "--max-in-flight-bytes", str(limit * 1024)]
    with EmbeddedServer(partitions=partitions, extra_args=extra) as srv, Client(srv.target, timeout=DEADLINE_S) as c:
        c.deploy(SCRIPT)
        assert srv.proc is not None
        server = psutil.Process(srv.proc.pid)
        pids = [server.pid, *(p.pid for p in server.children(recursive=True))]
        names = ["front", *(f"partition{i}" for i in range(len(pids) - 1))]
        ctx = multiprocessing.get_context("spawn")
        reports = ctx.Queue()
        producers = [ctx.Process(target=_produce, args=(srv.target, k, i, seconds, reports)) for k, i in PRODUCERS]
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(srv.target))
        for p in producers:
            p.start()
        start = time.monotonic()
        note(f"overload: --max-in-flight {limit}, 4 producers for {seconds:g} s", quiet)
        with progress(quiet) as bar:
            task = bar.add_task(f"limit {limit}: seconds pushed", total=round(seconds))
            samples = _sample(producers, health, c, pids, start, lambda t: bar.update(task, completed=min(t, seconds)))
        elapsed = time.monotonic() - start
        sent = sorted((reports.get(timeout=60) for _ in producers), key=lambda r: r["index"])
        for p in producers:
            p.join()
        held = {
            int(g): (int(n), int(s))
            for g, n, s in c.query(f"SELECT k // {KEYS}, sum(n), sum(s) FROM totals GROUP BY 1").fetchall()
        }
        counters = c.status()["counters"]
    exactly_once = all(not r["not_committed"] and held.get(r["index"], (0, 0)) == (r["rows"], r["sum"]) for r in sent)
    peaks = {name: round(max((s["rss"][i] or 0) for s in samples) / 2**20, 1) for i, name in enumerate(names)}
    return {
        "benchmark": NAME,
        "max_in_flight": limit,
        "max_in_flight_bytes": limit * 1024,
        "partitions": partitions,
        "seconds": round(elapsed, 2),
        "batches_per_s": round(sum(r["batches"] for r in sent) / elapsed, 1),
        "batches": {f"{r['kind']}{r['index']}": r["batches"] for r in sent},
        "push_refused": counters.get("push_refused", 0),
        "in_flight_peak": max((s["in"] for s in samples), default=0),
        "exactly_once": exactly_once,
        "not_committed": [x for r in sent for x in r["not_committed"]][:5],
        "rss_peak_mib": peaks,
        "health_ms": latency_summary([s["health_s"] for s in samples]),
        "query_ms": latency_summary([s["query_s"] for s in samples]),
        "samples": [
            {
                "t": s["t"],
                "query_ms": round(s["query_s"] * 1e3, 1),
                "rss_mib": [None if r is None else round(r / 2**20, 1) for r in s["rss"]],
            }
            for s in samples
        ],
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    seconds = args.seconds or (QUICK_SECONDS if args.quick else SECONDS)
    lines = [run_limit(limit, seconds, args.partitions, args.quiet) for limit in args.limits]
    smallest = min(lines, key=lambda r: r["max_in_flight"])
    slowest = smallest["query_ms"]["max"] or 0.0
    largest = max(smallest["rss_peak_mib"].values())
    return [
        *lines,
        ratio_line(
            NAME,
            1000.0 / max(slowest, 1e-3),
            1.0,
            "1 s",
            "slowest Query under overload",
            max_in_flight=smallest["max_in_flight"],
            query_max_ms=slowest,
        ),
        ratio_line(
            NAME,
            RSS_BOUND_MIB / largest,
            1.0,
            f"{RSS_BOUND_MIB} MiB",
            "largest peak RSS of a server process",
            max_in_flight=smallest["max_in_flight"],
            rss_peak_mib=largest,
        ),
    ]


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    from .common import _pyplot

    plt = _pyplot()
    lines = [r for r in records if "samples" in r]
    fig, (mem, lat) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for r in lines:
        ts = [s["t"] for s in r["samples"]]
        for i, name in enumerate(r["rss_peak_mib"]):
            mem.plot(ts, [s["rss_mib"][i] for s in r["samples"]], label=f"{name}, limit {r['max_in_flight']}")
        lat.plot(ts, [s["query_ms"] for s in r["samples"]], marker=".", label=f"limit {r['max_in_flight']}")
    mem.axhline(RSS_BOUND_MIB, color="grey", linestyle="--", label=f"bound {RSS_BOUND_MIB} MiB")
    mem.set_ylabel("resident memory (MiB)")
    mem.legend(fontsize=7, ncol=2)
    lat.axhline(1000, color="grey", linestyle="--", label="1 s")
    lat.set_ylabel("Query latency (ms)")
    lat.set_xlabel("seconds since the producers started")
    lat.set_yscale("log")
    lat.legend(fontsize=7)
    mem.set_title("4 producers pushing as fast as they can, 2 partitions")
    for ax in (mem, lat):
        ax.grid(alpha=0.3)
    return save_figure(fig, path)
