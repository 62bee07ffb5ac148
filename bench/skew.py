"""Skewed keys on two partitions: what `--auto-rebalance` wins back.

Three servers of two partitions run the key-count application of `bench
migration` (`counts` partitioned by key) side by side. Every batch counts
`--rows` keys of one bin, drawn from `--hot-bins` bins:

- **skewed**: the hot bins are all partition 0's (round robin gives it the even
  bins), so partition 0 does all the work while partition 1 idles;
- **auto**: the same, served with `--auto-rebalance`; during the untimed
  warm-up its front sees the skew and moves bins (the verb waits until a
  migration happened and none runs);
- **balanced**: every other hot bin moved to partition 1 before anything is
  loaded (`rebalance --move`), the placement a perfect balancer would reach.

One pipelined producer per server pushes the same batches, configurations
interleaved for several rounds. **Checked:** every key's count on every
server equals what was pushed (plain Python's counter). Ratio lines, the
median of the rounds' ratios: batches/s of auto over balanced (target 0.9:
the automatic placement gets most of what a perfect one would), and of auto
over skewed (target 1.0).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .common import (
    CpuMeter,
    Measurement,
    interleave,
    latency_summary,
    median,
    median_round,
    plot_bars,
    progress,
    push_batches,
    ratio_line,
    round_sig,
)
from .migration import APP

NAME = "skew"
PLACEMENTS = ("skewed", "auto", "balanced")
BINS = 1024
WINDOW_S = 1.0
"""The auto server's `--auto-rebalance` window."""
SETTLE_TIMEOUT_S = 120.0
AUTO_TARGET = 0.9
GAIN_TARGET = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=200, help="keys per batch, all of one bin (default %(default)s)")
    parser.add_argument("--hot-bins", type=int, default=32, help="bins the keys come from (default %(default)s)")
    parser.add_argument("--batches", type=int, default=None, help="batches per run (default 4000; --quick 600)")


def hot_keys(hot_bins: int, per_bin: int) -> dict[int, np.ndarray]:
    """`per_bin` keys of each of partition 0's first `hot_bins` bins (0, 2, 4, ... under round robin)."""
    from streamtx.server.partitioning import bins_of

    wanted = [2 * i for i in range(hot_bins)]
    candidates = np.arange(per_bin * BINS * 2, dtype=np.int64)
    bins = bins_of(pa.array(candidates), BINS)
    return {b: candidates[bins == b][:per_bin] for b in wanted}


def make_batches(keys: dict[int, np.ndarray], count: int, rows: int, seed: int) -> list[pa.Table]:
    rng = random.Random(seed)
    bins = sorted(keys)
    out = []
    for _ in range(count):
        pool = keys[rng.choice(bins)]
        picked = [int(pool[rng.randrange(len(pool))]) for _ in range(rows)]
        out.append(pa.table({"k": pa.array(picked, pa.int64())}))
    return out


def _counted(batches: list[pa.Table]) -> Counter[int]:
    total: Counter[int] = Counter()
    for b in batches:
        total.update(b.column("k").to_pylist())
    return total


def _settle(target: str, batches: list[pa.Table], pushed: Counter[int]) -> int:
    """Pushes warm-up batches to the auto server (counted into `pushed`) until it has moved bins and runs
    no migration; the migrations it made."""
    from streamtx.client import Client

    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    i = 0
    with Client(target) as c:
        while True:
            status = c.status()
            if status["counters"].get("auto_rebalances", 0) and not status["rebalancing"].get("steps"):
                return int(status["counters"]["auto_rebalances"])
            if time.monotonic() > deadline:
                raise RuntimeError(f"bench {NAME}: the auto-rebalancing server moved no bin in {SETTLE_TIMEOUT_S} s")
            chunk = [batches[(i + j) % len(batches)] for j in range(100)]
            asyncio.run(push_batches(target, "words", f"skew-settle-{uuid.uuid4().hex[:6]}", chunk, what=NAME))
            pushed.update(_counted(chunk))
            i += len(chunk)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from streamtx.client import Client
    from streamtx.server.embedded import EmbeddedServer

    count = args.batches or (600 if args.quick else 4000)
    keys = hot_keys(args.hot_bins, 4 * args.rows)
    warm = make_batches(keys, 300, args.rows, seed=1)
    runs = {r: make_batches(keys, count, args.rows, seed=10 + r) for r in range(args.rounds)}
    pushed = {p: Counter() for p in PLACEMENTS}
    flags = {p: ["--bins", str(BINS)] for p in PLACEMENTS}
    flags["auto"] += ["--auto-rebalance", str(WINDOW_S)]
    with ExitStack() as stack, progress(args.quiet) as bar:
        task = bar.add_task("bench skew: starting", total=len(PLACEMENTS) * (args.rounds + 1))
        servers = {p: stack.enter_context(EmbeddedServer(partitions=2, extra_args=flags[p])) for p in PLACEMENTS}
        pids: dict[str, list[int]] = {}
        for p, srv in servers.items():
            with Client(srv.target) as c:
                c.deploy(APP)
                if p == "balanced":
                    list(c.rebalance([(b, b, 1) for b in sorted(keys)[1::2]], strategy="all-at-once"))
                pids[p] = [x["pid"] for x in c.status()["partitions"]]
        moves = 0
        for p, srv in servers.items():  # untimed: caches warm, and the auto server rebalances
            bar.update(task, description=f"skew: warming up {p}")
            asyncio.run(push_batches(srv.target, "words", f"skew-warm-{p}", warm, what=NAME))
            pushed[p].update(_counted(warm))
            if p == "auto":
                moves = _settle(srv.target, warm, pushed[p])
            bar.advance(task)

        def one(p: str, r: int) -> Measurement:
            bar.update(task, description=f"skew: {p} round {r + 1}/{args.rounds}")
            srv = servers[p]
            meter = CpuMeter(srv.proc.pid if srv.proc else 0, pids[p])
            m = asyncio.run(
                push_batches(srv.target, "words", f"skew-{p}-r{r}-{uuid.uuid4().hex[:6]}", runs[r], what=NAME)
            )
            m.extra["cpu_ms_per_batch"] = meter.per_batch_ms(len(runs[r]))
            pushed[p].update(_counted(runs[r]))
            bar.advance(task)
            return m

        results = interleave(list(PLACEMENTS), one, args.rounds)
        final: dict[str, dict[str, Any]] = {}
        for p, srv in servers.items():
            with Client(srv.target) as c:
                got = dict(c.query("SELECT k, n FROM counts").fetchall())
                status = c.status()
            if got != dict(pushed[p]):
                raise RuntimeError(f"bench {NAME}: {p}: the counts differ from the keys pushed")
            final[p] = status
    lines: list[dict[str, Any]] = []
    for p, rounds in zip(PLACEMENTS, results, strict=True):
        m = median_round(rounds, key=lambda x: x.per_s)
        cpu = dict(m.extra["cpu_ms_per_batch"])
        owner = final[p]["bin_owner"]
        lines.append(
            {
                "benchmark": NAME,
                "placement": p,
                "batches": count,
                "rows_per_batch": args.rows,
                "hot_bins": args.hot_bins,
                "hot_bins_on_partition_1": sum(owner[b] == 1 for b in keys),
                "auto_rebalances": int(final[p]["counters"].get("auto_rebalances", 0)),
                "batches_per_s": round_sig(m.per_s),
                "keys_per_s": round_sig(m.per_s * args.rows),
                "batches_per_s_rounds": [round_sig(x.per_s) for x in rounds],
                "latency_ms": latency_summary(m.latencies),
                "other_cores": cpu.pop("other_cores"),
                "cpu_ms_per_batch": cpu,
                "load_1m": m.extra.get("load_1m"),
                "matches_reference": True,
            }
        )
    lines[PLACEMENTS.index("auto")]["auto_rebalances_in_warmup"] = moves
    per = dict(zip(PLACEMENTS, results, strict=True))
    for other, target, denominator in (
        ("balanced", AUTO_TARGET, "batches/s, the hot bins split evenly by hand"),
        ("skewed", GAIN_TARGET, "batches/s, skewed keys, no rebalancing"),
    ):
        paired = [a.per_s / b.per_s for a, b in zip(per["auto"], per[other], strict=True)]
        lines.append(
            ratio_line(
                NAME,
                median(paired),
                target,
                "batches/s, skewed keys, --auto-rebalance",
                denominator + " (median of the rounds' ratios)",
                rounds=[round(r, 3) for r in paired],
            )
        )
    return lines


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Batches/s of each placement (the median round), with how many hot bins partition 1 ended with."""
    runs = [r for r in records if "placement" in r]
    return plot_bars(
        path,
        [f"{r['placement']}\n{r['hot_bins_on_partition_1']}/{r['hot_bins']} hot bins on p1" for r in runs],
        {"batches/s": [r["batches_per_s"] for r in runs]},
        title=f"skewed keys on 2 partitions, {runs[0]['rows_per_batch']} keys of one bin per batch",
        ylabel="batches/s",
    )
