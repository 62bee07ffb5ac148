"""Voter with leaderboards: server-side dataflow vs client-ordered synchronous calls.

Two embedded servers run the voter application of WORKLOADS.md section 1 side
by side: one deploys it as an S-Store dataflow (procedures/voter/dataflow.sql;
one pipelined producer pushes atomic batches, PE triggers run the three
procedures in order), the other as H-Store-style OLTP procedures that the
client calls one after another for every batch (client_ordered.sql/.py). Both
get the same votes in the same order, so they must end in the same tables
(checked: the `states_equal` line). Throughput is in input batches per second,
at batch sizes 1 and 100, interleaved for several rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamtx.server.config import EXECUTORS

from .common import (
    Measurement,
    Stopwatch,
    interleave,
    latency_summary,
    median_round,
    note,
    plot_bars,
    progress,
    push_batches,
    ratio_line,
    round_sig,
)

NAME = "voter"
MODES = ("dataflow", "client_ordered")
DEFAULT_SIZES = (1, 100)
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 2
DATAFLOW_OVER_CLIENT_TARGET = 5.0  # S-Store: 2,200 vs 210 batches/s with all guarantees


@dataclass(frozen=True)
class Config:
    mode: str
    batch_size: int
    batches: int

    @property
    def label(self) -> str:
        return f"{self.mode}/{self.batch_size}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-sizes",
        type=lambda t: tuple(sorted({int(x) for x in t.split(",")})),
        default=DEFAULT_SIZES,
        metavar="N,N",
        help="votes per atomic batch (default 1,100)",
    )
    parser.add_argument("--batches", type=int, default=None, help="batches per configuration and round")
    parser.add_argument("--executor", choices=EXECUTORS, default="serial")
    parser.add_argument("--max-in-flight", type=int, default=256, help="PushStream window of the producer")
    parser.add_argument("--delete-every", type=int, default=20_000, help="votes between contestant deletions")


def batches_for(size: int, quick: bool) -> int:
    if quick:
        return 120 if size == 1 else 12
    return 600 if size == 1 else 40


def _client_ordered(target: str, batches: list[pa.Table]) -> Measurement:
    from streamtx.client import Client
    from streamtx.procedures.voter import client_ordered

    latencies = []
    with Client(target) as client:
        client.status()
        with Stopwatch() as sw:
            for batch in batches:
                t0 = time.perf_counter()
                client_ordered.process_batch(client, batch)
                latencies.append(time.perf_counter() - t0)
    return Measurement(sw.elapsed, len(batches), latencies, {"load_1m": round(os.getloadavg()[0], 2)})


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from streamtx.client import Client
    from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params
    from streamtx.procedures.voter.reference import SERVER_QUERIES
    from streamtx.server.embedded import EmbeddedServer

    config = VoterConfig(delete_every=args.delete_every)
    configs = [Config(mode, n, args.batches or batches_for(n, args.quick)) for n in args.batch_sizes for mode in MODES]
    per_round = {n: (args.batches or batches_for(n, args.quick)) * n for n in args.batch_sizes}
    total_votes = sum(per_round.values()) * args.rounds
    votes = generate_votes(total_votes, seed=11, phones=max(10_000, total_votes // 2))
    offsets: dict[tuple[int, int], int] = {}
    cursor = 0
    for r in range(args.rounds):
        for n in args.batch_sizes:
            offsets[(n, r)] = cursor
            cursor += per_round[n]
    run_id = uuid.uuid4().hex[:8]

    def batches_of(cfg: Config, r: int) -> list[pa.Table]:
        start = offsets[(cfg.batch_size, r)]
        return [votes.slice(start + i * cfg.batch_size, cfg.batch_size) for i in range(cfg.batches)]

    with (
        EmbeddedServer(executor=args.executor) as flow_srv,
        EmbeddedServer(executor=args.executor) as client_srv,
    ):
        servers = {"dataflow": flow_srv, "client_ordered": client_srv}
        for mode, srv in servers.items():
            with Client(srv.target) as c:
                c.deploy(deploy_script(config, mode))
                c.call("setup", **setup_params(config))
        with progress(args.quiet) as bar:
            task = bar.add_task("bench voter", total=len(configs) * args.rounds)

            def one(cfg: Config, r: int) -> Measurement:
                bar.update(task, description=f"voter {cfg.label} round {r + 1}/{args.rounds}")
                target = servers[cfg.mode].target
                if cfg.mode == "dataflow":
                    producer = f"bench-voter-{run_id}-{cfg.batch_size}-r{r}"
                    return asyncio.run(
                        push_batches(target, "votes_in", producer, batches_of(cfg, r), max_in_flight=args.max_in_flight)
                    )
                return _client_ordered(target, batches_of(cfg, r))

            def done(cfg: Config, r: int, m: Measurement) -> None:
                bar.advance(task)
                bar.print(f"{cfg.label} round {r + 1}: {m.per_s:,.1f} batches/s")

            results = interleave(configs, one, args.rounds, on_done=done)
        states = {}
        for mode, srv in servers.items():
            with Client(srv.target) as c:
                states[mode] = {name: c.query(sql).fetchall() for name, sql in SERVER_QUERIES.items()}
    lines = []
    for cfg, rounds in zip(configs, results, strict=True):
        m = median_round(rounds, key=lambda x: x.per_s)
        lines.append(
            {
                "benchmark": NAME,
                "mode": cfg.mode,
                "batch_size": cfg.batch_size,
                "batches": cfg.batches,
                "batches_per_s": round_sig(m.per_s),
                "votes_per_s": round_sig(m.per_s * cfg.batch_size),
                "latency_ms": latency_summary(m.latencies),
                "rounds": len(rounds),
                "batches_per_s_rounds": [round_sig(x.per_s) for x in rounds],
                "executor": args.executor,
                "guarantees": "acid+ordered+exactly-once" if cfg.mode == "dataflow" else "acid (order by client)",
                "load_1m": m.extra.get("load_1m"),
            }
        )
    equal = states["dataflow"] == states["client_ordered"]
    lines.append({"benchmark": NAME, "states_equal": equal, "votes": total_votes})
    note(f"bench voter: final tables of both modes {'equal' if equal else 'DIFFER'}", args.quiet)
    for n in args.batch_sizes:
        flow = next(x for x in lines if x.get("mode") == "dataflow" and x["batch_size"] == n)
        client = next(x for x in lines if x.get("mode") == "client_ordered" and x["batch_size"] == n)
        lines.append(
            ratio_line(
                NAME,
                flow["batches_per_s"] / client["batches_per_s"],
                DATAFLOW_OVER_CLIENT_TARGET,
                f"batches/s server-side dataflow, {n}-vote batches, one pipelined producer",
                f"batches/s client-ordered synchronous calls, {n}-vote batches",
                batch_size=n,
                numerator_value=flow["batches_per_s"],
                denominator_value=client["batches_per_s"],
            )
        )
    return lines


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    lines = [r for r in records if "mode" in r]
    sizes = sorted({r["batch_size"] for r in lines})
    series = {
        ("server-side dataflow" if mode == "dataflow" else "client-ordered calls"): [
            next((r["batches_per_s"] for r in lines if r["mode"] == mode and r["batch_size"] == n), None) for n in sizes
        ]
        for mode in MODES
    }
    return plot_bars(
        path,
        [f"{n} vote{'s' if n > 1 else ''}/batch" for n in sizes],
        series,
        title="Voter with leaderboards: input batches/s (median round)",
        ylabel="batches/s (log)",
        log=True,
    )
