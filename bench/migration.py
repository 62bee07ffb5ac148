"""Live migration: ack latency while a quarter of the state moves and back, all-at-once vs fluid vs batched.

One embedded server of two partitions keeps a count per key (a key-count
state machine, `counts` partitioned by key) over `--keys` keys, loaded before
the clock starts. An open-loop producer pushes batches of random keys at a
fixed rate (`--rate` batches/s, each scheduled at its own time whether or
not earlier ones were acknowledged; latency is from that scheduled time to
the ack, so a stall shows in full). For each strategy in turn the server
moves half of partition 0's bins (a quarter of the state) to partition 1 and
then back, between steady periods; last, `resize` retires partition 1 (its
half of the state moves to partition 0 first, in batched steps) and adds it
back (a new worker, then half the bins to it). Reported per run: the latency
timeline per 250 ms window (p50, p99, max), latency and throughput while
migrating against the steady state, how long each migration took, and how
long its steps held the commands behind them (`step_ms`).

Checked at the end: every key's count equals the keys pushed and acked
(plain Python's counter), so no row was lost or counted twice.

Ratio lines: the maximum latency during the all-at-once migration over the
maximum during the batched one (Megaphone's claim: bounded by what one step
moves; target 10), and throughput during the batched migration over steady
state (target 0.8).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .common import latency_summary, progress, ratio_line, round_sig, save_figure

NAME = "migration"
STRATEGIES = ("all-at-once", "fluid", "batched")
RESIZE = "resize"
"""The run that shrinks the server to one partition and grows it back to two, in batched steps."""
WINDOW_S = 0.25
WARMUP_S = 2.0
MAX_LATENCY_TARGET = 10.0
THROUGHPUT_TARGET = 0.8

APP = """
CREATE TABLE counts (k BIGINT PRIMARY KEY, n BIGINT NOT NULL) PARTITION BY (k);
CREATE STREAM words (k BIGINT) PARTITION BY (k);
CREATE PROCEDURE count_words ON STREAM words AS BEGIN
    INSERT INTO counts SELECT k, count(*) FROM words GROUP BY k
        ON CONFLICT DO UPDATE SET n = counts.n + excluded.n;
END;
CREATE PROCEDURE load_keys (n BIGINT) AS BEGIN
    INSERT INTO counts SELECT i, 0 FROM range($n) t(i);
END;
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", type=int, default=None, help="keys loaded (default 1000000; --quick 100000)")
    parser.add_argument("--rate", type=float, default=200.0, help="batches pushed per second (default %(default)s)")
    parser.add_argument("--keys-per-batch", type=int, default=1, help="keys per batch (default %(default)s)")
    parser.add_argument("--bins-per-step", type=int, default=16, help="bins a batched step moves (default %(default)s)")
    parser.add_argument("--steady", type=float, default=None, help="seconds of steady state around each migration")
    parser.add_argument("--bins", type=int, default=None, help="the server's bins (default 1024; --quick 256)")


class Producer:
    """Open loop: batch i leaves at start + i / rate; its latency runs from then to its ack."""

    def __init__(self, client: Any, keys: int, per_batch: int, rate: float, seed: int) -> None:
        self.client = client
        self.keys = keys
        self.per_batch = per_batch
        self.rate = rate
        self.rng = random.Random(seed)
        self.pushed: Counter[int] = Counter()
        self.acks: list[tuple[float, float]] = []  # (scheduled, acked), monotonic seconds
        self.futures: list[asyncio.Future] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        start = time.monotonic()
        i = 0
        while not self._stop.is_set():
            due = start + i / self.rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            keys = [self.rng.randrange(self.keys) for _ in range(self.per_batch)]
            fut = await self.client.push("words", pa.table({"k": pa.array(keys, pa.int64())}))
            fut.add_done_callback(lambda f, due=due, keys=keys: self._acked(f, due, keys))
            self.futures.append(fut)
            i += 1

    def _acked(self, fut: asyncio.Future, due: float, keys: list[int]) -> None:
        if fut.cancelled() or fut.exception() is not None or fut.result().outcome != "committed":
            return
        self.acks.append((due, time.monotonic()))
        self.pushed.update(keys)

    async def stop(self) -> None:
        self._stop.set()
        results = await asyncio.gather(*self.futures, return_exceptions=True)
        bad = [r for r in results if isinstance(r, BaseException) or r.outcome != "committed"]
        if bad:
            raise RuntimeError(f"bench migration: {len(bad)} batch(es) not committed; first: {bad[0]}")


def _moves(bins: int, back: bool) -> list[tuple[int, int, int]]:
    """Half of partition 0's bins (round robin: the even ones below bins / 2) to partition 1, or back."""
    if not back:
        return [(0, bins // 2 - 1, 1)]
    return [(b, b, 0) for b in range(0, bins // 2, 2)]


def timeline(acks: list[tuple[float, float]], t0: float, until: float) -> list[list[float | None]]:
    """[seconds since t0, p50, p99, max] of the latencies of batches scheduled in each 250 ms window."""
    acks = [(d, a) for d, a in acks if d >= t0]
    due = np.array([d for d, _ in acks]) - t0
    lat = np.array([a - d for d, a in acks]) * 1e3
    out: list[list[float | None]] = []
    for w in np.arange(0, until - t0, WINDOW_S):
        sel = lat[(due >= w) & (due < w + WINDOW_S)]
        if sel.size:
            p50, p99 = np.percentile(sel, [50, 99])
            out.append([round(float(w), 2), round(float(p50), 2), round(float(p99), 2), round(float(sel.max()), 2)])
        else:
            out.append([round(float(w), 2), None, None, None])
    return out


def _between(acks: list[tuple[float, float]], spans: list[tuple[float, float]]) -> list[float]:
    """Latencies (s) of the batches scheduled within any of `spans`."""
    return [a - d for d, a in acks if any(s <= d < e for s, e in spans)]


def _request(args: argparse.Namespace, strategy: str, bins: int, back: bool) -> dict[str, Any]:
    """What `Client.rebalance` is given for a run's migration out (or back)."""
    if strategy == RESIZE:
        return {"partitions": 2 if back else 1, "strategy": "batched", "bins_per_step": args.bins_per_step}
    return {"moves": _moves(bins, back), "strategy": strategy, "bins_per_step": args.bins_per_step}


async def _one(args: argparse.Namespace, target: str, strategy: str, keys: int, bins: int, steady: float) -> dict:
    from streamtx.client import AsyncClient
    from streamtx.server.collector import Collector

    # this process's own full collections (its acks pile up) would show as stalls the server did not make
    collecting = asyncio.create_task(Collector().run_on_loop())
    async with (
        AsyncClient(target, producer_id=f"migration-{uuid.uuid4().hex[:8]}", max_in_flight=1024) as client,
        AsyncClient(target) as admin,
    ):
        producer = Producer(client, keys, args.keys_per_batch, args.rate, seed=len(strategy))
        task = asyncio.create_task(producer.run())
        await asyncio.sleep(min(WARMUP_S, steady))  # connections, code paths and caches warm: not measured
        t0 = time.monotonic()
        spans: list[tuple[float, float]] = []
        steps = rows = 0
        step_seconds: list[float] = []
        for back in (False, True):
            await asyncio.sleep(steady)
            started = time.monotonic()
            reports = [p async for p in admin.rebalance(**_request(args, strategy, bins, back))]
            last = reports[-1]
            spans.append((started, time.monotonic()))
            step_seconds += [r["step_seconds"] for r in reports if r.get("step")]
            steps += last.get("steps", 0)
            rows += last.get("rows_moved", 0)
        await asyncio.sleep(steady)
        end = time.monotonic()
        await producer.stop()
        await task
    collecting.cancel()
    migrating = _between(producer.acks, spans)
    calm = _between(producer.acks, [(t0, spans[0][0]), (spans[0][1], spans[1][0]), (spans[1][1], end)])
    calm_s = (spans[0][0] - t0) + (spans[1][0] - spans[0][1]) + (end - spans[1][1])
    moving_s = sum(e - s for s, e in spans)
    return {
        "benchmark": NAME,
        "strategy": strategy,
        "keys": keys,
        "bins": bins,
        "bins_moved": bins // (2 if strategy == RESIZE else 4),  # each way
        "bins_per_step": args.bins_per_step if strategy in ("batched", RESIZE) else None,
        "rate": args.rate,
        "keys_per_batch": args.keys_per_batch,
        "steps": steps,
        "rows_moved": rows,
        "migration_s": [round(e - s, 3) for s, e in spans],
        "step_ms": latency_summary(step_seconds),
        "latency_ms": {"steady": latency_summary(calm), "migrating": latency_summary(migrating)},
        "batches_per_s": {
            "steady": round_sig(len(calm) / calm_s) if calm_s > 0 else None,
            "migrating": round_sig(len(migrating) / moving_s) if moving_s > 0 else None,
        },
        "timeline": timeline(producer.acks, t0, end),
        "migrations_at_s": [[round(s - t0, 3), round(e - t0, 3)] for s, e in spans],
        "_pushed": producer.pushed,
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from streamtx.client import Client
    from streamtx.server.embedded import EmbeddedServer

    keys = args.keys or (100_000 if args.quick else 1_000_000)
    bins = args.bins or (256 if args.quick else 1024)
    steady = args.steady if args.steady is not None else (2.0 if args.quick else 4.0)
    lines: list[dict[str, Any]] = []
    pushed: Counter[int] = Counter()
    with EmbeddedServer(partitions=2, extra_args=["--bins", str(bins)]) as srv:
        with progress(args.quiet) as bar:
            task = bar.add_task("bench migration", total=len(STRATEGIES) + 2)
            bar.update(task, description=f"migration: loading {keys:,} keys")
            with Client(srv.target) as c:
                c.deploy(APP)
                c.call("load_keys", n=keys)
            bar.advance(task)
            for strategy in (*STRATEGIES, RESIZE):
                what = "2 -> 1 -> 2 partitions" if strategy == RESIZE else "25% of the state out and back"
                bar.update(task, description=f"migration: {strategy}, {what}")
                line = asyncio.run(_one(args, srv.target, strategy, keys, bins, steady))
                pushed.update(line.pop("_pushed"))
                lines.append(line)
                moving = line["latency_ms"]["migrating"]
                bar.print(
                    f"{strategy}: migrations {line['migration_s']} s, {line['steps']} steps "
                    f"(p50 {line['step_ms']['p50']} ms, max {line['step_ms']['max']} ms), "
                    f"max latency {moving['max']} ms migrating vs {line['latency_ms']['steady']['max']} ms steady"
                )
                bar.advance(task)
            with Client(srv.target) as c:
                got = dict(c.query("SELECT k, n FROM counts WHERE n > 0").fetchall())
                stored = c.query("SELECT count(*) FROM counts").fetchall()[0][0]
    if got != dict(pushed) or stored != keys:
        raise RuntimeError("bench migration: the counts differ from the keys pushed: a row was lost or doubled")
    for line in lines:
        line["matches_reference"] = True
    by = {line["strategy"]: line for line in lines}
    worst_all = by["all-at-once"]["latency_ms"]["migrating"]["max"]
    worst_batched = by["batched"]["latency_ms"]["migrating"]["max"]
    batched_rates = by["batched"]["batches_per_s"]
    lines.append(
        ratio_line(
            NAME,
            worst_all / worst_batched if worst_all and worst_batched else float("nan"),
            MAX_LATENCY_TARGET,
            "max ack latency while migrating, all-at-once (ms)",
            "max ack latency while migrating, batched (ms)",
            numerator_value=worst_all,
            denominator_value=worst_batched,
        )
    )
    lines.append(
        ratio_line(
            NAME,
            (batched_rates["migrating"] or 0) / batched_rates["steady"] if batched_rates["steady"] else float("nan"),
            THROUGHPUT_TARGET,
            "batches/s acked while migrating, batched",
            "batches/s acked in steady state (same run)",
            numerator_value=batched_rates["migrating"],
            denominator_value=batched_rates["steady"],
        )
    )
    return lines


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    """The latency timeline of each run (p50, p99 and max per 250 ms), migrations shaded."""
    from .common import _pyplot

    runs = [r for r in records if "timeline" in r]
    plt = _pyplot()
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.6 * len(runs)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], runs, strict=True):
        t = [w[0] for w in r["timeline"]]
        for col, label in ((3, "max"), (2, "p99"), (1, "p50")):
            ax.plot(t, [np.nan if w[col] is None else w[col] for w in r["timeline"]], label=label)
        for s, e in r["migrations_at_s"]:
            ax.axvspan(s, max(e, s + 0.05), color="orange", alpha=0.25)
        ax.set_yscale("log")
        ax.set_ylabel("ack latency (ms)")
        ax.set_title(f"{r['strategy']}: {r['steps']} steps, migrations {r['migration_s']} s", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel(
        "seconds (shaded: migrating 25% of the state out, then back; resize: 2 -> 1 -> 2 partitions)"
    )
    return save_figure(fig, path)
