"""TStream workloads GS, SL, OB, TP: the serial executor vs the operation-chain executor.

TStream's workloads (docs/benchmarks.md, `bench tstream`). For each workload (procedures/tstream/<w>.py) and
partition count (default 1 and 2), one embedded server per executor (`serial`,
`opchain`) gets the workload deployed and its state pre-populated (10,000
records; TP: 100 road segments), then one producer pushes generated events
(zipf θ = 0.6; TP: 0.2) as 1-event atomic batches, pipelined; the executors'
rounds are interleaved. At P > 1 the tables are partitioned by their keys and
an `--mp-ratio` share of the events (default 0.25) touches `--mp-length`
partitions (default 4, capped at P); such a batch runs coordinated, the others
on the partition of their keys (TP's reports have one segment each: never
coordinated; OB's bids have one item). Throughput is events/s (= input
batches/s), latency is per event from admission to ack. One ratio line per
workload and partition count: opchain / serial events/s (target 5).

Correctness guard: every server of a workload receives a prefix of one event
list, in order (an untimed warm-up, then its rounds' slices back to back), so
its final state must equal the sequential `Reference` run over that same
prefix; the reference runs once over the list and is snapshotted at each
prefix length. `states_equal` (and `outputs_equal`) lines report it, and the
verb fails if any differs.

Punctuation-interval sweep (`--sweep`, default on): the opchain executor on
one workload (SL), one server per interval size (a server flag), interleaved;
throughput and latency per size. With `--plot FILE.png` the bars go to
FILE.png and the sweep to FILE-sweep.png.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib
import inspect
import sys
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa

from streamtx.procedures.tstream.common import DEFAULT_MP_LENGTH, DEFAULT_MP_RATIO
from streamtx.server.config import EXECUTORS, ServerConfig

from .common import (
    Measurement,
    emit,
    interleave,
    latency_summary,
    median_round,
    note,
    plot_bars,
    plot_lines,
    progress,
    push_batches,
    ratio_line,
    round_sig,
)

NAME = "tstream"
WORKLOADS = ("gs", "sl", "ob", "tp")
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 2
OPCHAIN_OVER_SERIAL_TARGET = 5.0  # the opchain issue: opchain >= 5x serial events/s on every workload
CONTRACT = ("NAME", "INPUT_STREAM", "deploy_script", "setup_params", "generate", "Reference", "STATE_QUERIES")
DEFAULT_RECORDS, DEFAULT_THETA = 10_000, 0.6  # TStream's defaults, for a workload that names none
BATCH_SIZE = 1  # events per atomic batch
RETENTION = 10_000_000  # output-stream batches kept: more than any run pushes, so nothing is trimmed

# events per timed run: (serial, opchain) and the sweep's, full and --quick
EVENTS = {"serial": 1_000, "opchain": 5_000}
QUICK_EVENTS = {"serial": 250, "opchain": 1_250}
SWEEP_EVENTS, QUICK_SWEEP_EVENTS = 2_500, 250
WARMUP, QUICK_WARMUP = 50, 10
INTERVALS = (1, 10, 100, 1000, 5000)
QUICK_INTERVALS = (1, 100, 1000)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {text!r}")
    return value


def _names(choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(x.strip().lower() for x in text.split(",") if x.strip()))
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)}; got {text!r}")
        return names

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workloads",
        type=_names(WORKLOADS),
        default=WORKLOADS,
        metavar="W,W",
        help="workloads to run (default gs,sl,ob,tp; missing modules are skipped with a note)",
    )
    parser.add_argument(
        "--executors",
        type=_names(EXECUTORS),
        default=EXECUTORS,
        metavar="E,E",
        help="executors to compare (default serial,opchain)",
    )
    parser.add_argument(
        "--partitions", type=_ints, default=(1, 2), metavar="P,P", help="partition counts to run (default 1,2)"
    )
    parser.add_argument(
        "--mp-ratio",
        type=_ratio,
        default=DEFAULT_MP_RATIO,
        help=f"at P > 1, the share of events whose keys span several partitions (default {DEFAULT_MP_RATIO})",
    )
    parser.add_argument(
        "--mp-length",
        type=int,
        default=DEFAULT_MP_LENGTH,
        help=f"partitions such an event touches, at most P (default {DEFAULT_MP_LENGTH})",
    )
    parser.add_argument(
        "--records",
        type=int,
        default=None,
        help="records per state table (default: the workload's own, 10000; TP 100 road segments)",
    )
    parser.add_argument(
        "--theta",
        type=float,
        default=None,
        help="zipf skew of the keys (default: the workload's own, 0.6; TP 0.2)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the event generator (default 1)")
    parser.add_argument(
        "--events",
        type=int,
        default=None,
        help=f"events per timed run, both executors (default serial {EVENTS['serial']}, opchain "
        f"{EVENTS['opchain']}; --quick {QUICK_EVENTS['serial']} and {QUICK_EVENTS['opchain']})",
    )
    parser.add_argument(
        "--max-in-flight", type=int, default=512, help="PushStream window of the producer (default 512)"
    )
    parser.add_argument(
        "--interval-size",
        type=int,
        default=None,
        help=f"--interval-size of the executor comparison's servers (default the server's, "
        f"{ServerConfig.interval_size})",
    )
    parser.add_argument(
        "--stream-retention",
        type=int,
        default=RETENTION,
        help=f"--stream-retention of every server: large, so output streams are not trimmed (default {RETENTION})",
    )
    parser.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="punctuation-interval sweep of the opchain executor (default on)",
    )
    parser.add_argument(
        "--sweep-workload", type=_names(WORKLOADS), default=("sl",), metavar="W", help="workload of the sweep (sl)"
    )
    parser.add_argument(
        "--intervals",
        type=_ints,
        default=None,
        metavar="N,N",
        help=f"interval sizes of the sweep (default {','.join(map(str, INTERVALS))}; "
        f"--quick {','.join(map(str, QUICK_INTERVALS))})",
    )
    parser.add_argument(
        "--sweep-events",
        type=int,
        default=None,
        help=f"events per timed run of the sweep (default {SWEEP_EVENTS}; --quick {QUICK_SWEEP_EVENTS})",
    )


# -- workloads -------------------------------------------------------------------------


def load_workload(name: str) -> tuple[ModuleType | None, str]:
    """The workload module, or None and why it cannot run (not written yet, or incomplete)."""
    try:
        module = importlib.import_module(f"streamtx.procedures.tstream.{name}")
    except ImportError as e:
        return None, f"{type(e).__name__}: {e}"
    missing = [attr for attr in CONTRACT if not hasattr(module, attr)]
    if missing:
        return None, f"module lacks {', '.join(missing)}"
    return module, ""


@dataclass(frozen=True)
class Config:
    workload: str
    executor: str
    partitions: int
    events: int
    interval_size: int | None = None  # None: the server's default

    @property
    def label(self) -> str:
        interval = "" if self.interval_size is None else f"/interval {self.interval_size}"
        return f"{self.workload}/{self.executor}/P={self.partitions}{interval}"

    @property
    def producer(self) -> str:
        interval = "" if self.interval_size is None else f"-i{self.interval_size}"
        return f"{self.workload}-{self.executor}-p{self.partitions}{interval}"


class Plan:
    """One workload's event list and how it is split: every server gets a prefix of it, in order.

    A server pushes the warm-up (untimed), then its round r's slice
    [warmup + r * events, warmup + (r + 1) * events): its state at the end is
    that of the first `length(events)` events, which the reference reproduces.
    """

    def __init__(
        self, module: ModuleType, args: argparse.Namespace, warmup: int, runs: Sequence[int], partitions: int = 1
    ) -> None:
        self.module = module
        self.warmup = warmup
        self.rounds = args.rounds
        self.records = args.records or _default(module, "records", DEFAULT_RECORDS)
        self.theta = args.theta if args.theta is not None else _default(module, "theta", DEFAULT_THETA)
        total = max(self.length(n) for n in runs)
        placed = {}  # P = 1: the workload's own events, as before partitions existed
        if partitions > 1:
            placed = {"partitions": partitions, "mp_ratio": args.mp_ratio, "mp_length": args.mp_length}
        self.events: pa.Table = module.generate(total, seed=args.seed, records=self.records, theta=self.theta, **placed)
        if self.events.num_rows != total:
            raise RuntimeError(f"{module.NAME}.generate({total}) returned {self.events.num_rows} events")

    def length(self, per_run: int) -> int:
        return self.warmup + self.rounds * per_run

    def batches(self, start: int, count: int) -> list[pa.Table]:
        return [self.events.slice(start + i, BATCH_SIZE) for i in range(0, count, BATCH_SIZE)]

    def warmup_batches(self) -> list[pa.Table]:
        return self.batches(0, self.warmup)

    def round_batches(self, per_run: int, r: int) -> list[pa.Table]:
        return self.batches(self.warmup + r * per_run, per_run)

    def reference(self, lengths: set[int]) -> dict[int, tuple[dict[str, list], dict[str, list] | None]]:
        """The reference's (tables, outputs) after each prefix length, from one sequential run."""
        ref = self.module.Reference(self.records)
        rows = self.events.to_pylist()
        done = 0
        snapshots = {}
        for n in sorted(lengths):
            ref.process(rows[done:n])
            done = n
            outputs = ref.outputs() if hasattr(ref, "outputs") else None
            snapshots[n] = copy.deepcopy((_normalize(ref.tables()), _normalize(outputs)))  # later events go on
        return snapshots


def _default(module: ModuleType, name: str, fallback: Any) -> Any:
    """A keyword default of the workload's `generate` (TP: 100 segments, θ = 0.2), else the common one."""
    param = inspect.signature(module.generate).parameters.get(name)
    return fallback if param is None or param.default is inspect.Parameter.empty else param.default


def _normalize(result: dict[str, list] | None) -> dict[str, list[tuple]] | None:
    if result is None:
        return None
    return {name: [tuple(row) for row in rows] for name, rows in result.items()}


def _first_difference(got: dict[str, list], want: dict[str, list]) -> str:
    for name in sorted(set(got) | set(want)):
        a, b = got.get(name), want.get(name)
        if a == b:
            continue
        if a is None or b is None:
            return f"{name}: missing on the {'server' if a is None else 'reference'}"
        if len(a) != len(b):
            return f"{name}: {len(a)} rows on the server, {len(b)} in the reference"
        i = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        return f"{name}[{i}]: server {a[i]!r}, reference {b[i]!r}"
    return ""


# -- servers ---------------------------------------------------------------------------


def _start_all(stack: ExitStack, servers: list[Any]) -> None:
    """Starts the servers concurrently (each start waits for a child process); all stop with `stack`."""
    for srv in servers:
        stack.callback(srv.close)
    with ThreadPoolExecutor(len(servers)) as pool:
        for f in [pool.submit(srv.start) for srv in servers]:
            f.result()


def _server(cfg: Config, args: argparse.Namespace) -> Any:
    from streamtx.server.embedded import EmbeddedServer

    return EmbeddedServer(
        executor=cfg.executor,
        partitions=cfg.partitions,
        interval_size=cfg.interval_size,
        extra_args=["--stream-retention", str(args.stream_retention)],
    )


def _deploy(module: ModuleType, target: str, records: int) -> None:
    from streamtx.client import Client

    with Client(target) as c:
        c.deploy(module.deploy_script())
        c.call(f"setup_{module.NAME}", **module.setup_params(records))


def _read_state(module: ModuleType, target: str) -> tuple[dict[str, list], dict[str, list] | None]:
    from streamtx.client import Client

    outputs_sql = getattr(module, "OUTPUT_QUERIES", None)
    with Client(target) as c:
        tables = {name: c.query(sql).fetchall() for name, sql in module.STATE_QUERIES.items()}
        outputs = None if outputs_sql is None else {name: c.query(sql).fetchall() for name, sql in outputs_sql.items()}
    return _normalize(tables), _normalize(outputs)


def _coordinated(target: str) -> int:
    """The commands (batches and calls) the server ran coordinated, across partitions, so far."""
    from streamtx.client import Client

    with Client(target) as c:
        return int(c.status()["counters"].get("coordinated", 0))


def _push(target: str, stream: str, producer: str, batches: list[pa.Table], args: argparse.Namespace) -> Measurement:
    return asyncio.run(
        push_batches(target, stream, producer, batches, max_in_flight=args.max_in_flight, what=f"bench {NAME}")
    )


# -- one group of servers: deploy, warm up, interleaved rounds, check -----------------------


def _run_group(
    module: ModuleType,
    configs: list[Config],
    args: argparse.Namespace,
    warmup: int,
    run_id: str,
    bar: Any,
    task: int,
) -> tuple[list[list[Measurement]], dict[str, Any], Plan]:
    """Runs `configs` (one server each, one partition count) interleaved over the rounds.

    Returns their rounds, the state check, the plan.
    """
    plan = Plan(module, args, warmup, [c.events for c in configs], configs[0].partitions)
    stream = module.INPUT_STREAM
    with ExitStack() as stack:
        servers = [_server(c, args) for c in configs]
        _start_all(stack, servers)
        setup = {}  # the set-up call is coordinated at P > 1: counted apart from the events
        for cfg, srv in zip(configs, servers, strict=True):
            _deploy(module, srv.target, plan.records)
            setup[cfg] = _coordinated(srv.target)
            if warmup:
                _push(srv.target, stream, f"bench-{NAME}-{run_id}-{cfg.producer}-warm", plan.warmup_batches(), args)
        target = {cfg: srv.target for cfg, srv in zip(configs, servers, strict=True)}

        def one(cfg: Config, r: int) -> Measurement:
            bar.update(task, description=f"tstream {cfg.label} round {r + 1}/{args.rounds}")
            producer = f"bench-{NAME}-{run_id}-{cfg.producer}-r{r}"
            return _push(target[cfg], stream, producer, plan.round_batches(cfg.events, r), args)

        def done(cfg: Config, r: int, m: Measurement) -> None:
            bar.advance(task)
            bar.print(f"{cfg.label} round {r + 1}: {m.per_s:,.1f} events/s")

        results = interleave(configs, one, args.rounds, on_done=done)
        finals = {cfg: _read_state(module, target[cfg]) for cfg in configs}
        coordinated = {cfg: _coordinated(target[cfg]) - setup[cfg] for cfg in configs}
    snapshots = plan.reference({plan.length(c.events) for c in configs})
    states_equal = outputs_equal = True
    differences = []
    for cfg in configs:
        tables, outputs = finals[cfg]
        want_tables, want_outputs = snapshots[plan.length(cfg.events)]
        if tables != want_tables:
            states_equal = False
            differences.append(f"{cfg.label} state: {_first_difference(tables, want_tables)}")
        if outputs is not None and want_outputs is not None and outputs != want_outputs:
            outputs_equal = False
            differences.append(f"{cfg.label} outputs: {_first_difference(outputs, want_outputs)}")
    check = {
        "benchmark": NAME,
        "workload": configs[0].workload,
        "partitions": configs[0].partitions,
        "states_equal": states_equal,
        "outputs_equal": outputs_equal,
        "servers": [c.label for c in configs],
        "events": {c.label: plan.length(c.events) for c in configs},
        "coordinated_batches": {c.label: coordinated[c] for c in configs},
    }
    if differences:
        check["differences"] = differences
        # loud even with --quiet: the numbers of a wrong run mean nothing
        print(
            f"bench {NAME}: {configs[0].workload}: FINAL STATE DIFFERS from the reference:", file=sys.stderr, flush=True
        )
        for d in differences:
            print(f"  {d}", file=sys.stderr, flush=True)
    return results, check, plan


def _line(cfg: Config, rounds: list[Measurement], args: argparse.Namespace, plan: Plan, **extra: Any) -> dict[str, Any]:
    m = median_round(rounds, key=lambda x: x.per_s)
    return {
        "benchmark": NAME,
        "workload": cfg.workload,
        "executor": cfg.executor,
        "partitions": cfg.partitions,
        **extra,
        "events": m.count * BATCH_SIZE,
        "events_per_s": round_sig(m.per_s * BATCH_SIZE),
        "batches_per_s": round_sig(m.per_s),
        "latency_ms": latency_summary(m.latencies),
        "rounds": len(rounds),
        "events_per_s_rounds": [round_sig(x.per_s * BATCH_SIZE) for x in rounds],
        "batch_size": BATCH_SIZE,
        "records": plan.records,
        "theta": plan.theta,
        "mp_ratio": args.mp_ratio if cfg.partitions > 1 else 0.0,
        "mp_length": min(args.mp_length, cfg.partitions) if cfg.partitions > 1 else 1,
        "max_in_flight": args.max_in_flight,
        "interval_size": cfg.interval_size or ServerConfig.interval_size,
        "load_1m": m.extra.get("load_1m"),
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    run_id = uuid.uuid4().hex[:8]
    counts = QUICK_EVENTS if args.quick else EVENTS
    per_run = {e: args.events or counts[e] for e in args.executors}
    warmup = QUICK_WARMUP if args.quick else WARMUP
    intervals = args.intervals or (QUICK_INTERVALS if args.quick else INTERVALS)
    sweep_events = args.sweep_events or (QUICK_SWEEP_EVENTS if args.quick else SWEEP_EVENTS)
    sweep_name = args.sweep_workload[0]

    modules: dict[str, ModuleType] = {}
    lines: list[dict[str, Any]] = []
    for name in dict.fromkeys([*args.workloads, *([sweep_name] if args.sweep else [])]):
        module, why = load_workload(name)
        if module is None:
            note(f"bench {NAME}: workload {name} skipped ({why})", args.quiet)
            lines.append({"benchmark": NAME, "workload": name, "skipped": why})
        else:
            modules[name] = module
    workloads = [w for w in args.workloads if w in modules]
    sweep = args.sweep and sweep_name in modules

    groups = {
        (w, p): [Config(w, e, p, per_run[e], args.interval_size) for e in args.executors]
        for w in workloads
        for p in args.partitions
    }
    sweep_configs = [Config(sweep_name, "opchain", 1, sweep_events, n) for n in intervals] if sweep else []
    total = args.rounds * (sum(len(g) for g in groups.values()) + len(sweep_configs))

    config_lines: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    with progress(args.quiet) as bar:
        task = bar.add_task(f"bench {NAME}", total=total)
        for (w, _), configs in groups.items():
            results, check, plan = _run_group(modules[w], configs, args, warmup, run_id, bar, task)
            config_lines += [_line(c, rounds, args, plan) for c, rounds in zip(configs, results, strict=True)]
            checks.append(check)
        sweep_lines: list[dict[str, Any]] = []
        if sweep:
            results, check, plan = _run_group(modules[sweep_name], sweep_configs, args, warmup, run_id, bar, task)
            sweep_lines = [
                _line(c, rounds, args, plan, sweep=True) for c, rounds in zip(sweep_configs, results, strict=True)
            ]
            checks.append({**check, "sweep": True})

    ratios = []
    if {"serial", "opchain"} <= set(args.executors):
        for w in workloads:
            for p in args.partitions:
                by = {x["executor"]: x for x in config_lines if x["workload"] == w and x["partitions"] == p}
                fast, slow = by["opchain"], by["serial"]
                ratios.append(
                    ratio_line(
                        NAME,
                        fast["events_per_s"] / slow["events_per_s"],
                        OPCHAIN_OVER_SERIAL_TARGET,
                        f"events/s opchain executor, {w.upper()}, P={p}, 1-event batches, one pipelined producer",
                        f"events/s serial executor, {w.upper()}, P={p}, 1-event batches, one pipelined producer",
                        workload=w,
                        partitions=p,
                        numerator_value=fast["events_per_s"],
                        denominator_value=slow["events_per_s"],
                    )
                )
    lines += config_lines + sweep_lines + checks + ratios
    bad = [c for c in checks if not (c["states_equal"] and c["outputs_equal"])]
    if bad:
        for line in lines:  # print what was measured, then fail: main() never sees the records
            emit(line)
        raise RuntimeError(
            f"bench {NAME}: final state or outputs differ from the reference for "
            + ", ".join(f"{c['workload']}{' (sweep)' if c.get('sweep') else ''}" for c in bad)
            + "; see the differences above"
        )
    return lines


# -- plot ------------------------------------------------------------------------------------


def sweep_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(f"{path.stem}-sweep{path.suffix or '.png'}")


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Bars of events/s per workload x executor into `path`; the sweep's curves into FILE-sweep.png."""
    configs = [r for r in records if "executor" in r and not r.get("sweep")]
    keys = list(dict.fromkeys((r["workload"], r["partitions"]) for r in configs))
    many_p = len({p for _, p in keys}) > 1
    groups = [f"{w.upper()}{f' P={p}' if many_p else ''}" for w, p in keys]
    executors = list(dict.fromkeys(r["executor"] for r in configs))
    series = {
        e: [
            next(
                (r["events_per_s"] for r in configs if (r["workload"], r["partitions"]) == k and r["executor"] == e),
                None,
            )
            for k in keys
        ]
        for e in executors
    }
    out = plot_bars(
        path,
        groups,
        series,
        title="TStream workloads: events/s, 1-event batches (median round)",
        ylabel="events/s (log)",
        log=True,
    )
    sweep = sorted((r for r in records if r.get("sweep") and "executor" in r), key=lambda r: r["interval_size"])
    if sweep:
        plot_lines(
            sweep_path(path),
            [r["interval_size"] for r in sweep],
            {
                "events/s": [r["events_per_s"] for r in sweep],
                "latency p50 (ms)": [r["latency_ms"]["p50"] for r in sweep],
                "latency p99 (ms)": [r["latency_ms"]["p99"] for r in sweep],
            },
            title=f"Punctuation interval sweep: {sweep[0]['workload'].upper()}, opchain executor",
            xlabel="interval size (batches, log)",
            ylabel="events/s; latency in ms (log)",
            logx=True,
            logy=True,
        )
    return out
