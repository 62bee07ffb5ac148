"""Voter with leaderboards: server-side dataflow vs client-ordered synchronous calls.

Three embedded servers run the voter application (docs/benchmarks.md, `bench voter`) side
by side: one deploys it as an S-Store dataflow (procedures/voter/dataflow.sql;
one pipelined producer pushes atomic batches, PE triggers run the three
procedures in order), one the same dataflow with every SQL statement run in
DuckDB (`--sql-compiler off`: what compiling the procedures gains), and one as
H-Store-style OLTP procedures that the client calls one after another for
every vote of a batch (client_ordered.sql/.py: the rules are per vote, so a
client that orders the steps itself must make its calls vote by vote).
Throughput is in input batches per second, at batch sizes 1 and 100,
interleaved for several rounds.

Two more servers run the voter as state procedures (procedures/voter/state.sql
and state.py, `deploy_script(mode="state")`), one under `--executor serial`,
one under `--executor opchain`, each fed 1-vote batches by one pipelined
producer with all three guarantees on, in the same interleaved rounds. Each
state server first takes untimed warm-up batches (opchain 2,000, serial 50;
`--quick` 500 and 20). After every run (and warm-up) of every server, its
tables (and, where it has them, its rejected votes and deletions) are checked
against a `VoterReference` fed the same batches in the same order: a mismatch
fails the verb; every line says `matches_reference`. The compiled dataflow
takes more batches per round than the two slow modes (it is ~100x faster: a
short run would time mostly its start), so it has its own votes; the two slow
modes take the same votes and must end with equal tables (`states_equal`).
Absolute lines hold the SQL dataflow's 1-vote batches/s against S-Store's
2,200 and opchain's state-procedure batches/s against H-Store's 5,300 on this
2-core machine, client included.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamtx.server.config import EXECUTORS, ServerConfig

from .common import (
    CpuMeter,
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
MODES = ("dataflow", "dataflow_duckdb", "client_ordered")
SCRIPTS = {"dataflow": "dataflow", "dataflow_duckdb": "dataflow", "client_ordered": "client_ordered"}
"""Each mode's deploy script: dataflow_duckdb is the same dataflow on a server with --sql-compiler off."""
STATE_EXECUTORS = ("serial", "opchain")
DEFAULT_SIZES = (1, 100)
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 2
COMPILED_OVER_DUCKDB_TARGET = 1.0  # compiling a procedure never makes it slower
DATAFLOW_OVER_CLIENT_TARGET = 10.0  # S-Store: 2,200 vs 210 batches/s with all guarantees (10.5x)
DATAFLOW_TARGET = 2_200.0  # batches/s of the SQL dataflow, 1-vote batches, one pipelined client (S-Store's figure)
OPCHAIN_TARGET = 5_300.0  # batches/s, 1-vote batches, one pipelined client (H-Store's asynchronous anchor)
STATE_BATCHES = {"serial": 600, "opchain": 5_000}  # 1-vote batches per state run: ~10 s and ~3 s
QUICK_STATE_BATCHES = {"serial": 100, "opchain": 1_000}
STATE_WARMUP = {"serial": 50, "opchain": 2_000}  # untimed 1-vote batches per state server before the rounds
QUICK_STATE_WARMUP = {"serial": 20, "opchain": 500}
STATE_MAX_IN_FLIGHT = 1024  # a wider window lets opchain intervals grow (~70 -> ~150 batches): fixed costs amortize
STREAM_RETENTION = 1_000_000  # keep every batch of rejected_votes / deletions, so each run can be checked


@dataclass(frozen=True)
class Config:
    mode: str  # dataflow | client_ordered | state
    batch_size: int
    batches: int
    executor: str | None = None  # state mode: its server's executor

    @property
    def label(self) -> str:
        return f"{self.mode}/{self.batch_size}" if self.executor is None else f"state-{self.executor}/1"

    @property
    def server(self) -> str:
        return self.mode if self.executor is None else f"state-{self.executor}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-sizes",
        type=lambda t: tuple(sorted({int(x) for x in t.split(",")})),
        default=DEFAULT_SIZES,
        metavar="N,N",
        help="votes per atomic batch (default 1,100)",
    )
    parser.add_argument("--batches", type=int, default=None, help="batches per configuration and round")
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=ServerConfig.executor,
        help=f"executor of the dataflow and client-ordered servers (default the server's, {ServerConfig.executor})",
    )
    parser.add_argument("--max-in-flight", type=int, default=256, help="PushStream window of the producer")
    parser.add_argument("--delete-every", type=int, default=20_000, help="votes between contestant deletions")
    parser.add_argument(
        "--state",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the state-procedure voter under serial and opchain, 1-vote batches (default on)",
    )
    parser.add_argument(
        "--state-batches",
        type=int,
        default=None,
        help=f"1-vote batches per state run (default serial {STATE_BATCHES['serial']}, opchain "
        f"{STATE_BATCHES['opchain']}; --quick {QUICK_STATE_BATCHES['serial']} and {QUICK_STATE_BATCHES['opchain']})",
    )
    parser.add_argument(
        "--state-max-in-flight",
        type=int,
        default=STATE_MAX_IN_FLIGHT,
        help=f"PushStream window of the state runs' producer (default {STATE_MAX_IN_FLIGHT})",
    )
    parser.add_argument(
        "--interval-size", type=int, default=None, help="--interval-size of the opchain server (default the server's)"
    )


def batches_for(mode: str, size: int, quick: bool) -> int:
    """Batches per round: the compiled dataflow is ~100x faster than the other two, so it takes more to time."""
    if mode == "dataflow":
        if quick:
            return 1_500 if size == 1 else 24
        return 6_000 if size == 1 else 120
    if quick:
        return 120 if size == 1 else 12
    return 600 if size == 1 else 40


def state_batches_for(executor: str, args: argparse.Namespace) -> int:
    if args.state_batches:
        return args.state_batches
    return (QUICK_STATE_BATCHES if args.quick else STATE_BATCHES)[executor]


def _slice(cfg: Config) -> str:
    """Which votes a configuration takes: dataflow_duckdb and client_ordered the same ones, side by side."""
    if cfg.executor is not None or cfg.mode == "dataflow":
        return f"{cfg.server}-{cfg.batch_size}"
    return str(cfg.batch_size)


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
    from streamtx.procedures.voter.reference import SERVER_QUERIES, VoterReference
    from streamtx.procedures.voter.state import QUERIES as STATE_QUERIES
    from streamtx.server.embedded import EmbeddedServer

    config = VoterConfig(delete_every=args.delete_every)
    configs = [
        Config(mode, n, args.batches or batches_for(mode, n, args.quick)) for n in args.batch_sizes for mode in MODES
    ]
    if args.state:
        configs += [Config("state", 1, state_batches_for(e, args), e) for e in STATE_EXECUTORS]
    # votes: the two slow side-by-side modes share each (batch size, round) slice; the compiled dataflow
    # and each state server have their own
    slices: dict[str, int] = {}
    for cfg in configs:
        slices[_slice(cfg)] = cfg.batches * cfg.batch_size
    warmup = QUICK_STATE_WARMUP if args.quick else STATE_WARMUP
    warmups = {f"state-{e}": warmup[e] for e in STATE_EXECUTORS} if args.state else {}
    total_votes = sum(slices.values()) * args.rounds + sum(warmups.values())
    votes = generate_votes(total_votes, seed=11, phones=max(10_000, total_votes // 2))
    offsets: dict[tuple[str, int], int] = {}
    cursor = 0
    for server, n in warmups.items():  # the warm-up's votes come first; -1: not a timed round
        offsets[(server, -1)] = cursor
        cursor += n
    for r in range(args.rounds):
        for key, size in slices.items():
            offsets[(key, r)] = cursor
            cursor += size
    run_id = uuid.uuid4().hex[:8]

    def batches_of(cfg: Config, r: int) -> list[pa.Table]:
        start = offsets[(_slice(cfg), r)]
        return [votes.slice(start + i * cfg.batch_size, cfg.batch_size) for i in range(cfg.batches)]

    refs = {cfg.server: VoterReference(config) for cfg in configs}
    checks: dict[str, list[bool]] = {name: [] for name in refs}

    def check(cfg: Config, r: int, target: str, batches: list[pa.Table]) -> None:
        """The server after this run (r = -1: the warm-up) equals the reference fed every batch it got so far."""
        ref = refs[cfg.server]
        for batch in batches:
            ref.process_batch(list(zip(*(batch.column(c).to_pylist() for c in batch.column_names), strict=True)))
        expected = ref.tables()
        queries = STATE_QUERIES if cfg.mode == "state" else SERVER_QUERIES
        with Client(target) as c:
            ok = all(c.query(sql).fetchall() == expected[name] for name, sql in queries.items())
            if cfg.mode != "client_ordered":  # its procedures return rejections and deletions to the client
                rejected = c.query("SELECT vote_id, reason FROM rejected_votes ORDER BY vote_id").fetchall()
                deletions = c.query("SELECT contestant_number, removed_votes FROM deletions ORDER BY __ts").fetchall()
                ok = ok and rejected == sorted(ref.rejected) and deletions == ref.deletions
        checks[cfg.server].append(ok)
        if not ok:
            raise RuntimeError(f"bench voter: {cfg.label} round {r + 1}: the server's state differs from the reference")

    retain = ["--stream-retention", str(STREAM_RETENTION)]
    with ExitStack() as stack:
        servers = {
            "dataflow": stack.enter_context(EmbeddedServer(executor=args.executor, extra_args=retain)),
            "dataflow_duckdb": stack.enter_context(
                EmbeddedServer(executor=args.executor, extra_args=[*retain, "--sql-compiler", "off"])
            ),
            "client_ordered": stack.enter_context(EmbeddedServer(executor=args.executor)),
        }
        if args.state:
            for e in STATE_EXECUTORS:
                servers[f"state-{e}"] = stack.enter_context(
                    EmbeddedServer(
                        executor=e,
                        interval_size=args.interval_size if e == "opchain" else None,
                        extra_args=retain,
                    )
                )
        pids: dict[str, list[int]] = {}  # each server's partition workers, for the CPU per batch
        for name, srv in servers.items():
            with Client(srv.target) as c:
                c.deploy(deploy_script(config, "state" if name.startswith("state-") else SCRIPTS[name]))
                c.call("setup", **setup_params(config))
                pids[name] = [p["pid"] for p in c.status()["partitions"]]
        for cfg in configs:  # untimed: code paths, caches and the working set warm, as in a long-running server
            n = warmups.get(cfg.server, 0)
            if n:
                start = offsets[(cfg.server, -1)]
                warm = [votes.slice(start + i, 1) for i in range(n)]
                target = servers[cfg.server].target
                producer = f"bench-voter-{run_id}-{cfg.server}-warmup"
                asyncio.run(push_batches(target, "votes_in", producer, warm, max_in_flight=args.state_max_in_flight))
                check(cfg, -1, target, warm)
        with progress(args.quiet) as bar:
            task = bar.add_task("bench voter", total=len(configs) * args.rounds)

            def one(cfg: Config, r: int) -> Measurement:
                bar.update(task, description=f"voter {cfg.label} round {r + 1}/{args.rounds}")
                target = servers[cfg.server].target
                batches = batches_of(cfg, r)
                if cfg.mode == "client_ordered":
                    m = _client_ordered(target, batches)
                else:
                    producer = f"bench-voter-{run_id}-{cfg.server}-{cfg.batch_size}-r{r}"
                    window = args.state_max_in_flight if cfg.mode == "state" else args.max_in_flight
                    srv = servers[cfg.server]
                    meter = CpuMeter(srv.proc.pid if srv.proc else 0, pids[cfg.server])
                    m = asyncio.run(push_batches(target, "votes_in", producer, batches, max_in_flight=window))
                    m.extra["cpu_ms_per_batch"] = meter.per_batch_ms(len(batches))
                check(cfg, r, target, batches)  # after the clock stopped
                return m

            def done(cfg: Config, r: int, m: Measurement) -> None:
                bar.advance(task)
                bar.print(f"{cfg.label} round {r + 1}: {m.per_s:,.1f} batches/s")

            results = interleave(configs, one, args.rounds, on_done=done)
        states = {}
        for mode in MODES:
            with Client(servers[mode].target) as c:
                states[mode] = {name: c.query(sql).fetchall() for name, sql in SERVER_QUERIES.items()}
    lines = []
    for cfg, rounds in zip(configs, results, strict=True):
        m = median_round(rounds, key=lambda x: x.per_s)
        line = {
            "benchmark": NAME,
            "mode": cfg.mode,
            "batch_size": cfg.batch_size,
            "batches": cfg.batches,
            "batches_per_s": round_sig(m.per_s),
            "votes_per_s": round_sig(m.per_s * cfg.batch_size),
            "latency_ms": latency_summary(m.latencies),
            "rounds": len(rounds),
            "batches_per_s_rounds": [round_sig(x.per_s) for x in rounds],
            "executor": cfg.executor or args.executor,
            "guarantees": "acid (order by client)" if cfg.mode == "client_ordered" else "acid+ordered+exactly-once",
            "load_1m": m.extra.get("load_1m"),
            "matches_reference": all(checks[cfg.server]),
        }
        if cfg.mode == "state":
            line["max_in_flight"] = args.state_max_in_flight
        if "cpu_ms_per_batch" in m.extra:  # where the time goes: each process's CPU per batch, ms
            cpu = dict(m.extra["cpu_ms_per_batch"])
            line["other_cores"] = cpu.pop("other_cores")
            line["cpu_ms_per_batch"] = cpu
        lines.append(line)
    equal = states["client_ordered"] == states["dataflow_duckdb"]
    lines.append(
        {
            "benchmark": NAME,
            "states_equal": equal,
            "compared": ["dataflow_duckdb", "client_ordered"],
            "votes": total_votes,
        }
    )
    note(f"bench voter: final tables of the two modes fed the same votes {'equal' if equal else 'DIFFER'}", args.quiet)
    for n in args.batch_sizes:
        flow = next(x for x in lines if x.get("mode") == "dataflow" and x["batch_size"] == n)
        duck = next(x for x in lines if x.get("mode") == "dataflow_duckdb" and x["batch_size"] == n)
        client = next(x for x in lines if x.get("mode") == "client_ordered" and x["batch_size"] == n)
        lines.append(
            ratio_line(
                NAME,
                flow["batches_per_s"] / duck["batches_per_s"],
                COMPILED_OVER_DUCKDB_TARGET,
                f"batches/s dataflow with SQL compiled (--sql-compiler on), {n}-vote batches",
                f"batches/s the same dataflow with every statement in DuckDB (--sql-compiler off), {n}-vote batches",
                batch_size=n,
                numerator_value=flow["batches_per_s"],
                denominator_value=duck["batches_per_s"],
            )
        )
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
    if 1 in args.batch_sizes:
        flow = next(x for x in lines if x.get("mode") == "dataflow" and x["batch_size"] == 1)
        lines.append(
            ratio_line(
                NAME,
                flow["batches_per_s"],
                DATAFLOW_TARGET,
                "batches/s of the SQL dataflow compiled, 1-vote batches, one pipelined producer, all guarantees",
                "1 (an absolute rate: S-Store's 2,200 batches/s; on this 2-core machine, client included)",
                batch_size=1,
                matches_reference=flow["matches_reference"],
            )
        )
    if args.state:
        state = {x["executor"]: x for x in lines if x.get("mode") == "state"}
        opchain, serial = state["opchain"]["batches_per_s"], state["serial"]["batches_per_s"]
        lines.append(
            ratio_line(
                NAME,
                opchain,
                OPCHAIN_TARGET,
                "opchain batches/s: state-procedure voter, --executor opchain, 1-vote batches, one pipelined producer",
                "1 (an absolute rate: the target is 5,300 batches/s on this 2-core machine, client included)",
                batch_size=1,
                serial_batches_per_s=serial,
                opchain_over_serial=round_sig(opchain / serial),
                matches_reference=state["opchain"]["matches_reference"] and state["serial"]["matches_reference"],
            )
        )
    return lines


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    lines = [r for r in records if "mode" in r]
    sizes = sorted({r["batch_size"] for r in lines})
    kinds = [
        ("server-side dataflow, SQL compiled", "dataflow", None),
        ("server-side dataflow, SQL in DuckDB", "dataflow_duckdb", None),
        ("client-ordered calls", "client_ordered", None),
        ("state procedures, serial", "state", "serial"),
        ("state procedures, opchain", "state", "opchain"),
    ]
    series = {
        label: [
            next(
                (
                    r["batches_per_s"]
                    for r in lines
                    if r["mode"] == mode and r["batch_size"] == n and (executor is None or r["executor"] == executor)
                ),
                None,
            )
            for n in sizes
        ]
        for label, mode, executor in kinds
        if any(r["mode"] == mode and (executor is None or r["executor"] == executor) for r in lines)
    }
    return plot_bars(
        path,
        [f"{n} vote{'s' if n > 1 else ''}/batch" for n in sizes],
        series,
        title="Voter with leaderboards: input batches/s (median round)",
        ylabel="batches/s (log)",
        log=True,
    )
