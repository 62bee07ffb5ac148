"""Partitioning: throughput at P = 1 vs P = 2 partitions, and what multi-partition transactions cost.

Three measurements, each configuration on a fresh embedded server (started
together at the beginning of every round, idle until their turn), interleaved
for several rounds; each configuration reports its median round:

- **sensors** (procedures/partitioned): a partition-friendly application. The
  stream `readings` and every table its procedure writes are partitioned by
  `sensor`; each batch (a few thousand readings) takes its sensors from one
  partition, so at P = 2 the front sends it to that partition alone and both
  workers run in parallel. P = 1 and P = 2 push *the same batches*. This pair
  makes the `ratio` line: P = 2 over P = 1 batches/s (paired per round, the
  median over rounds), target 1.6 on 2 cores.
- **multi-partition cost**: at P = 2, a share of the batches (0 %, 10 %, 25 %,
  50 %) takes half its rows from each partition; the front coordinates those
  TE by TE with two-phase commit, holding every partition meanwhile.
- **voter** (procedures/voter) at P = 1 and P = 2, the
  SQL dataflow in 100-vote batches. Its vote procedure runs on the partition of
  each phone and its leaderboard on the home partition; `vote` is FOR EACH ROW,
  so at P = 2 a 100-vote batch, which holds phones of both partitions, runs in
  a flow row by row (front/flows.py), after untimed 1-vote warm-up votes.
- **voter-1**: the same SQL dataflow in 1-vote batches, and **voter-state**:
  the voter as state procedures (procedures/voter/state.sql, the `opchain`
  executor's workload) in 1-vote batches, as a user who starts the server with
  its default of one partition per core pushes them; the same votes at P = 1
  and P = 2 after untimed warm-up votes, 1,024 in flight. At P = 2 their
  batches run as flows (front/flows.py: vote where the phone lives, then
  leaderboard at home, queued batches together), cut at each deletion.

Each voter pair has a ratio line holding P = 2 against P = 1 with a target of
1: a second partition must not make the voter slower.

Every run is checked before its line is printed, or the verb fails: sensors
runs against the expected row counts, sums and per-partition placement (and
the number of coordinated batches), voter runs against the sequential
reference implementation.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .common import (
    CpuMeter,
    Measurement,
    find_line,
    latency_summary,
    median,
    median_round,
    note,
    progress,
    push_batches,
    ratio_line,
    round_sig,
    save_figure,
)

if TYPE_CHECKING:
    from streamtx.server.embedded import EmbeddedServer

NAME = "partitions"
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 1  # nine servers per round; one round keeps --quick well under a minute
P2_OVER_P1_TARGET = 1.6  # the partition-friendly workload on a 2-core machine
DEFAULT_SHARES = (0.0, 0.10, 0.25, 0.50)
# 50,000 sensors per partition at P = 2, so a batch rarely repeats a sensor: DuckDB's upsert
# (INSERT ... ON CONFLICT DO UPDATE) took ~8x the CPU per batch when a 16,000-row batch named
# each of 5,000 keys about 3 times, which would measure that quirk instead of partitioning.
SENSORS = 100_000
BATCH_ROWS = 4_000
FULL_BATCHES, QUICK_BATCHES = 240, 40
VOTER_BATCH = 100
FULL_VOTER_BATCHES, QUICK_VOTER_BATCHES = 100, 10
FULL_STATE_VOTES, QUICK_STATE_VOTES = 10_000, 1_000  # 1-vote batches
STATE_WARMUP, QUICK_STATE_WARMUP = 500, 200
STATE_MAX_IN_FLIGHT = 1_024
VOTER_P2_OVER_P1_TARGET = 1.0
VOTERS = {  # workload: (deploy mode, votes per batch, what the plot calls it)
    "voter": ("dataflow", VOTER_BATCH, "voter, SQL\n100 votes\nper batch"),
    "voter-1": ("dataflow", 1, "voter, SQL\n1 vote\nper batch"),
    "voter-state": ("state", 1, "voter, state\nprocedures,\n1 vote per batch"),
}
WARMUP_BATCHES = 4


@dataclass(frozen=True)
class Config:
    """One measured setting: a workload on a fresh server with `partitions` partitions."""

    workload: str  # sensors, or one of VOTERS
    partitions: int
    spanning_share: float = 0.0  # sensors: share of batches whose keys span both partitions

    @property
    def label(self) -> str:
        span = f" {self.spanning_share:.0%} spanning" if self.workload == "sensors" and self.partitions > 1 else ""
        return f"{self.workload} P={self.partitions}{span}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batches",
        type=int,
        default=None,
        help=f"sensor batches per configuration and round (default {FULL_BATCHES}, {QUICK_BATCHES} with --quick)",
    )
    parser.add_argument("--batch-rows", type=int, default=BATCH_ROWS, help="readings per sensor batch")
    parser.add_argument("--sensors", type=int, default=SENSORS, help="distinct sensors (keys)")
    parser.add_argument(
        "--shares",
        type=_shares,
        default=DEFAULT_SHARES,
        metavar="S,S,...",
        help="shares of multi-partition batches at P = 2 (default 0,0.1,0.25,0.5; 0 is always measured)",
    )
    parser.add_argument(
        "--voter-batches",
        type=int,
        default=None,
        help=f"voter batches of {VOTER_BATCH} votes per configuration and round "
        f"(default {FULL_VOTER_BATCHES}, {QUICK_VOTER_BATCHES} with --quick; 0 skips the voter)",
    )
    parser.add_argument(
        "--state-votes",
        type=int,
        default=None,
        help=f"1-vote batches of the state-procedure voter per configuration and round "
        f"(default {FULL_STATE_VOTES}, {QUICK_STATE_VOTES} with --quick; 0 skips it)",
    )
    parser.add_argument(
        "--sql-votes",
        type=int,
        default=None,
        help=f"1-vote batches of the SQL voter per configuration and round "
        f"(default {FULL_STATE_VOTES}, {QUICK_STATE_VOTES} with --quick; 0 skips it)",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=128,
        help="PushStream window of the producer (default %(default)s)",
    )


def _shares(text: str) -> tuple[float, ...]:
    try:
        shares = {float(s) for s in text.split(",") if s.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if any(not 0 <= s <= 1 for s in shares):
        raise argparse.ArgumentTypeError("shares are between 0 and 1")
    return tuple(sorted(shares | {0.0}))


def configurations(
    shares: tuple[float, ...], voter: bool, state_voter: bool = False, sql_voter: bool = False
) -> list[Config]:
    """Sensors at P = 1 and P = 2 (0 % spanning), the rest of the sweep, then the voter pairs.

    The first two are the pair of the ratio line; `run` relies on that order.
    """
    configs = [Config("sensors", 1), *(Config("sensors", 2, s) for s in shares)]
    for workload, wanted in (("voter", voter), ("voter-1", sql_voter), ("voter-state", state_voter)):
        if wanted:
            configs += [Config(workload, 1), Config(workload, 2)]
    return configs


# -- the sensors workload ------------------------------------------------------------


@dataclass
class SensorsInput:
    """One configuration's batches for one round, built before anything is timed."""

    warmup: list[pa.Table]
    batches: list[pa.Table]
    spanning: int  # batches whose keys span partitions (coordinated at P = 2)


def sensor_input(cfg: Config, rows: int, count: int, sensors: int, seed: int) -> SensorsInput:
    """Batches aimed at the partitions of P = 2 (P = 1 takes the same ones: same rows, same work)."""
    from streamtx.procedures.partitioned.app import BINS, sensor_batches
    from streamtx.server.partitioning import PartitionMap

    batches = sensor_batches(count, rows, sensors=sensors, partitions=2, spanning_share=cfg.spanning_share, seed=seed)
    warmup = sensor_batches(WARMUP_BATCHES, rows, sensors=sensors, partitions=2, seed=seed + 1)
    spanning = 0
    if cfg.partitions > 1:
        pmap = PartitionMap.round_robin(cfg.partitions, BINS)
        spanning = sum(len(np.unique(pmap.owners(b.column("sensor")))) > 1 for b in batches)
    return SensorsInput(warmup, batches, spanning)


def prepare_sensors(target: str, sensors: int) -> None:
    from streamtx.client import Client
    from streamtx.procedures.partitioned.app import deploy_script, setup_params

    with Client(target) as c:
        c.deploy(deploy_script())
        c.call("setup", **setup_params(sensors))


def check_sensors(
    target: str, partitions: int, pushed: list[pa.Table], coordinated: int, expected_coordinated: int
) -> None:
    """Raises unless the server holds exactly the pushed readings, each on the partition owning its sensor."""
    from streamtx.client import Client
    from streamtx.procedures.partitioned.app import BINS, CHECK_QUERY, expected_totals
    from streamtx.server.partitioning import PartitionMap

    want = expected_totals(pushed)
    with Client(target) as c:
        readings, value_sum, stats_readings, sensors = c.query(CHECK_QUERY).fetchall()[0]
        counters = c.status()["counters"]
    problems = []
    if readings != want["readings"] or int(stats_readings) != want["readings"]:
        problems.append(f"{readings} logged / {stats_readings} aggregated readings, expected {want['readings']}")
    if not math.isclose(float(value_sum), want["value_sum"], rel_tol=1e-9):
        problems.append(f"sum of values {value_sum}, expected {want['value_sum']}")
    if sensors != want["sensors"]:
        problems.append(f"{sensors} sensors aggregated, expected {want['sensors']}")
    if partitions > 1:
        owners = PartitionMap.round_robin(partitions, BINS).owners(
            pa.chunked_array([b.column("sensor") for b in pushed])
        )
        for p in range(partitions):
            held = counters.get(f"partition{p}.rows.reading_log", 0)
            if held != int(np.sum(owners == p)):
                problems.append(f"partition {p} holds {held} readings, expected {int(np.sum(owners == p))}")
    if coordinated != expected_coordinated:
        problems.append(f"{coordinated} batches coordinated, expected {expected_coordinated}")
    if problems:
        raise RuntimeError(f"bench {NAME}: sensors P={partitions} run is wrong: " + "; ".join(problems))


def measure_sensors(srv: EmbeddedServer, cfg: Config, data: SensorsInput, max_in_flight: int, tag: str) -> Measurement:
    """Untimed warm-up batches, then the timed pipelined push, then the check."""
    from streamtx.client import Client

    # The warm-up runs every path once (the front's first partitioned push imports code, DuckDB
    # plans its first statements) so that the clock measures the steady state only.
    asyncio.run(push_batches(srv.target, "readings", f"{tag}-warmup", data.warmup, what=f"bench {NAME} warm-up"))
    with Client(srv.target) as c:
        status = c.status()
    before = status["counters"].get("coordinated", 0)
    meter = CpuMeter(srv.proc.pid if srv.proc else 0, [p["pid"] for p in status["partitions"]])
    m = asyncio.run(
        push_batches(
            srv.target, "readings", tag, data.batches, max_in_flight=max_in_flight, what=f"bench {NAME} {cfg.label}"
        )
    )
    m.extra["cpu_ms_per_batch"] = cpu = meter.per_batch_ms(len(data.batches))
    m.extra["other_cores"] = cpu.pop("other_cores")
    with Client(srv.target) as c:
        coordinated = c.status()["counters"].get("coordinated", 0) - before
    check_sensors(srv.target, cfg.partitions, data.warmup + data.batches, coordinated, data.spanning)
    m.extra["coordinated"] = coordinated
    return m


# -- the voter -----------------------------------------------------------------------


def prepare_voter(target: str, mode: str = "dataflow") -> None:
    from streamtx.client import Client
    from streamtx.procedures.voter.app import VoterConfig, deploy_script, setup_params

    config = VoterConfig()
    with Client(target) as c:
        c.deploy(deploy_script(config, mode))
        c.call("setup", **setup_params(config))


@dataclass(frozen=True)
class VoterInput:
    """Votes to push timed, after untimed warm-up votes (both in the reference's order)."""

    warmup: list[pa.Table]
    batches: list[pa.Table]


def voter_input(count: int, seed: int, size: int = VOTER_BATCH, warmup: int = 0) -> VoterInput:
    from streamtx.procedures.voter.app import generate_votes

    total = count * size + warmup
    votes = generate_votes(total, seed=seed, phones=max(10_000, total // 2))
    return VoterInput(
        [votes.slice(i, 1) for i in range(warmup)],
        [votes.slice(warmup + i * size, size) for i in range(count)],
    )


def check_voter(target: str, cfg: Config, batches: list[pa.Table]) -> None:
    """Raises unless the final tables equal the sequential reference's (procedures/voter/reference.py)."""
    from streamtx.client import Client
    from streamtx.procedures.voter.app import VoterConfig
    from streamtx.procedures.voter.reference import SERVER_QUERIES, VoterReference
    from streamtx.procedures.voter.state import QUERIES as STATE_QUERIES

    ref = VoterReference(VoterConfig())
    for b in batches:
        ref.process_batch(list(zip(*(b.column(c).to_pylist() for c in b.column_names), strict=True)))
    expected = ref.tables()
    queries = STATE_QUERIES if VOTERS[cfg.workload][0] == "state" else SERVER_QUERIES
    with Client(target) as c:
        for name, sql in queries.items():
            got = c.query(sql).fetchall()
            if got != expected[name]:
                raise RuntimeError(
                    f"bench {NAME}: {cfg.label}: table {name} differs from the reference "
                    f"({len(got)} rows, expected {len(expected[name])})"
                )


def measure_voter(srv: EmbeddedServer, cfg: Config, data: VoterInput, max_in_flight: int, tag: str) -> Measurement:
    from streamtx.client import Client

    if data.warmup:  # untimed: code paths, caches and the working set warm, as in a long-running server
        asyncio.run(push_batches(srv.target, "votes_in", f"{tag}-warmup", data.warmup, max_in_flight=max_in_flight))
    with Client(srv.target) as c:
        status = c.status()
    before = status["counters"]
    meter = CpuMeter(srv.proc.pid if srv.proc else 0, [p["pid"] for p in status["partitions"]])
    m = asyncio.run(
        push_batches(
            srv.target, "votes_in", tag, data.batches, max_in_flight=max_in_flight, what=f"bench {NAME} {cfg.label}"
        )
    )
    m.extra["cpu_ms_per_batch"] = cpu = meter.per_batch_ms(len(data.batches))
    m.extra["other_cores"] = cpu.pop("other_cores")
    with Client(srv.target) as c:
        after = c.status()["counters"]
    for key, counter in (("coordinated", "coordinated"), ("flow_batches", "flow_batches"), ("flows", "flows")):
        m.extra[key] = after.get(counter, 0) - before.get(counter, 0)
    check_voter(srv.target, cfg, data.warmup + data.batches)
    return m


# -- the verb ------------------------------------------------------------------------


def _start_servers(configs: list[Config], sensors: int) -> list[EmbeddedServer]:
    """A fresh server per configuration, started and set up concurrently (idle until measured).

    Starting them together takes a fraction of the time of one after another
    (start-up is mostly waiting for child processes); an idle server uses no CPU.
    """
    from streamtx.server.embedded import EmbeddedServer

    servers = [EmbeddedServer(partitions=cfg.partitions) for cfg in configs]

    def start(i: int) -> None:
        srv, cfg = servers[i], configs[i]
        srv.start()
        if cfg.workload == "sensors":
            prepare_sensors(srv.target, sensors)
        else:
            prepare_voter(srv.target, VOTERS[cfg.workload][0])

    try:
        with ThreadPoolExecutor(max_workers=len(servers)) as pool:
            list(pool.map(start, range(len(servers))))
    except BaseException:
        _stop_servers(servers)
        raise
    return servers


def _stop_servers(servers: list[EmbeddedServer]) -> None:
    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        list(pool.map(lambda s: s.close(), servers))


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    sensor_count = args.batches or (QUICK_BATCHES if args.quick else FULL_BATCHES)
    voter_count = (
        args.voter_batches
        if args.voter_batches is not None
        else (QUICK_VOTER_BATCHES if args.quick else FULL_VOTER_BATCHES)
    )
    state_votes = (
        args.state_votes if args.state_votes is not None else (QUICK_STATE_VOTES if args.quick else FULL_STATE_VOTES)
    )
    sql_votes = (
        args.sql_votes if args.sql_votes is not None else (QUICK_STATE_VOTES if args.quick else FULL_STATE_VOTES)
    )
    state_warmup = QUICK_STATE_WARMUP if args.quick else STATE_WARMUP
    configs = configurations(args.shares, voter_count > 0, state_votes > 0, sql_votes > 0)
    run_id = uuid.uuid4().hex[:8]
    results: list[list[Measurement]] = [[] for _ in configs]
    with progress(args.quiet) as bar:
        task = bar.add_task(f"bench {NAME}", total=len(configs) * args.rounds)
        for r in range(args.rounds):
            # Inputs first, untimed. Sensors P = 1 and P = 2 (0 %) share a seed: the same batches, so
            # the same rows and the same work; only the partition count differs. Both voter servers
            # get the same votes too (each checked against the sequential reference).
            inputs: list[Any] = []
            for cfg in configs:
                if cfg.workload == "sensors":
                    seed = 1_000 * r + round(cfg.spanning_share * 100)
                    inputs.append(sensor_input(cfg, args.batch_rows, sensor_count, args.sensors, seed))
                elif cfg.workload == "voter":
                    inputs.append(voter_input(voter_count, seed=11 + r, warmup=state_warmup))
                else:
                    count = state_votes if cfg.workload == "voter-state" else sql_votes
                    inputs.append(voter_input(count, seed=31 + r, size=1, warmup=state_warmup))
            bar.update(task, description=f"{NAME} round {r + 1}/{args.rounds}: starting {len(configs)} servers")
            servers = _start_servers(configs, args.sensors)
            try:
                for i, cfg in enumerate(configs):
                    bar.update(task, description=f"{NAME} {cfg.label} round {r + 1}/{args.rounds}")
                    tag = f"bench-{NAME}-{run_id}-r{r}-{i}"
                    if cfg.workload == "sensors":
                        m = measure_sensors(servers[i], cfg, inputs[i], args.max_in_flight, tag)
                    else:
                        m = measure_voter(servers[i], cfg, inputs[i], _window(cfg, args), tag)
                    results[i].append(m)
                    bar.advance(task)
                    bar.print(f"{cfg.label} round {r + 1}: {m.per_s:,.1f} batches/s")
            finally:
                _stop_servers(servers)
    counts = {"sensors": sensor_count, "voter": voter_count, "voter-1": sql_votes, "voter-state": state_votes}
    lines = [_line(cfg, rounds, args, counts[cfg.workload]) for cfg, rounds in zip(configs, results, strict=True)]
    _relative(lines)
    p1 = find_line(lines, workload="sensors", partitions=1)
    p2 = find_line(lines, workload="sensors", partitions=2, spanning_share=0.0)
    lines.append(
        _pair_line(
            "sensors",
            (results[0], p1),
            (results[1], p2),
            P2_OVER_P1_TARGET,
            f"batches/s of the sensors workload at P = 2 ({args.batch_rows}-row batches, each on one partition)",
            "batches/s of the same batches at P = 1 in the same round (median over rounds of the per-round ratio)",
            args.quiet,
            other_cores_rounds=[
                [a.extra["other_cores"], b.extra["other_cores"]] for a, b in zip(results[0], results[1], strict=True)
            ],
        )
    )
    for workload, (_, size, _) in VOTERS.items():
        pair = [i for i, cfg in enumerate(configs) if cfg.workload == workload]
        if pair:
            what = f"{size}-vote batches/s of the {'state-procedure' if workload == 'voter-state' else 'SQL'} voter"
            lines.append(
                _pair_line(
                    workload,
                    (results[pair[0]], lines[pair[0]]),
                    (results[pair[1]], lines[pair[1]]),
                    VOTER_P2_OVER_P1_TARGET,
                    f"{what} at P = 2",
                    f"{what} at P = 1 on the same votes in the same round (median over rounds of the ratio)",
                    args.quiet,
                )
            )
    return lines


def _window(cfg: Config, args: argparse.Namespace) -> int:
    """Batches in flight: 1,024 for 1-vote batches (one pipelined producer, as `bench voter`)."""
    return STATE_MAX_IN_FLIGHT if cfg.workload in VOTERS and VOTERS[cfg.workload][1] == 1 else args.max_in_flight


def _pair_line(
    workload: str,
    one: tuple[list[Measurement], dict[str, Any]],
    two: tuple[list[Measurement], dict[str, Any]],
    target: float,
    numerator: str,
    denominator: str,
    quiet: bool,
    **extra: Any,
) -> dict[str, Any]:
    """The ratio line of P = 2 (`two`: its rounds and line) over P = 1, paired per round.

    The two run back to back on the same input in each round, so a change in
    what the rest of the shared machine does between rounds hits both; the
    claim is the median pair.
    """
    pairs = [b.per_s / a.per_s for a, b in zip(one[0], two[0], strict=True)]
    ratio = median(pairs)
    note(f"bench {NAME}: {workload} P=2 / P=1 = {ratio:.3f} (target {target}); every run checked", quiet)
    return ratio_line(
        NAME,
        ratio,
        target,
        numerator,
        denominator,
        workload=workload,
        numerator_value=two[1]["batches_per_s"],
        denominator_value=one[1]["batches_per_s"],
        ratio_rounds=[round(x, 3) for x in pairs],
        **extra,
    )


def _line(cfg: Config, rounds: list[Measurement], args: argparse.Namespace, batches: int) -> dict[str, Any]:
    m = median_round(rounds, key=lambda x: x.per_s)
    rows = args.batch_rows if cfg.workload == "sensors" else VOTERS[cfg.workload][1]
    line: dict[str, Any] = {
        "benchmark": NAME,
        "workload": cfg.workload,
        "partitions": cfg.partitions,
    }
    if cfg.workload == "sensors":
        line["spanning_share"] = cfg.spanning_share
    line.update(
        {
            "batch_rows": rows,
            "batches": batches,
            "batches_per_s": round_sig(m.per_s),
            "rows_per_s": round_sig(m.per_s * rows),
            "latency_ms": latency_summary(m.latencies),
            "rounds": len(rounds),
            "batches_per_s_rounds": [round_sig(x.per_s) for x in rounds],
            "coordinated_batches": m.extra["coordinated"],
            "flow_batches": m.extra.get("flow_batches", 0),  # batches that ran in flows (front/flows.py)
            "flows": m.extra.get("flows", 0),
            "cpu_ms_per_batch": m.extra["cpu_ms_per_batch"],
            "other_cores": m.extra["other_cores"],  # CPU the rest of the shared machine used meanwhile
            "checked": True,  # every round passed its check (a failed check stops the verb)
            "max_in_flight": _window(cfg, args),
            "load_1m": m.extra.get("load_1m"),
        }
    )
    return line


def _relative(lines: list[dict[str, Any]]) -> None:
    """Adds each P = 2 line's throughput relative to its P = 1 line / the 0 % spanning line."""
    local = find_line(lines, workload="sensors", partitions=2, spanning_share=0.0)["batches_per_s"]
    for line in lines:
        if line["workload"] == "sensors" and line["partitions"] == 2:
            line["vs_all_local"] = round(line["batches_per_s"] / local, 3)
    for workload in ("sensors", *VOTERS):
        try:
            one = find_line(lines, workload=workload, partitions=1)["batches_per_s"]
            two = find_line(
                lines, workload=workload, partitions=2, spanning_share=0.0 if workload == "sensors" else None
            )
        except KeyError:
            continue
        two["vs_p1"] = round(two["batches_per_s"] / one, 3)


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Left: batches/s at P = 1 vs P = 2 per workload. Right: the sensors throughput as batches span partitions."""
    from .common import _pyplot

    plt = _pyplot()
    path = Path(path)
    lines = [r for r in records if "workload" in r and "batches_per_s" in r]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    groups = [w for w in ("sensors", *VOTERS) if any(r["workload"] == w for r in lines)]
    x = np.arange(len(groups))
    for i, p in enumerate((1, 2)):
        ys = []
        for w in groups:
            match = [r for r in lines if r["workload"] == w and r["partitions"] == p and not r.get("spanning_share")]
            ys.append(match[0]["batches_per_s"] if match else np.nan)
        bars = left.bar(x + (i - 0.5) * 0.38, ys, 0.38, label=f"P = {p}")
        labels = ["" if np.isnan(y) else f"{y:,.0f}" if y >= 100 else f"{y:.3g}" for y in ys]
        left.bar_label(bars, labels=labels, fontsize=8, padding=1)
    ratio = next((r for r in records if "ratio" in r and r.get("workload") == "sensors"), None)
    names = {"sensors": "sensors\n(partition-\nfriendly)", **{w: v[2] for w, v in VOTERS.items()}}
    left.set_xticks(x, [names[w] for w in groups], fontsize=8)
    left.set_yscale("log")  # 100-vote and 4,000-reading batches next to 1-vote ones
    left.set_ylabel("input batches/s (median round, log scale)")
    title = "P = 1 vs P = 2 partitions"
    if ratio is not None and ratio.get("ratio") is not None:
        title += f" (sensors P2/P1 = {ratio['ratio']:.2f}x)"
    left.set_title(title)
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=8)
    sweep = sorted(
        (r for r in lines if r["workload"] == "sensors" and r["partitions"] == 2), key=lambda r: r["spanning_share"]
    )
    if sweep:
        xs = [100 * r["spanning_share"] for r in sweep]
        right.plot(xs, [r["batches_per_s"] for r in sweep], marker="o", label="P = 2")
        p1 = [r for r in lines if r["workload"] == "sensors" and r["partitions"] == 1]
        if p1:
            right.axhline(p1[0]["batches_per_s"], color="gray", linestyle="--", label="P = 1, all local")
        right.set_ylim(bottom=0)
        right.set_xlabel("multi-partition batches (% of all, coordinated by two-phase commit)")
        right.set_ylabel("input batches/s (median round)")
        right.set_title("Cost of multi-partition transactions (sensors, P = 2)")
        right.grid(alpha=0.3)
        right.legend(fontsize=8)
    return save_figure(fig, path)
