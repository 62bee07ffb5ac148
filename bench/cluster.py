"""Cluster mode on this machine: the voter through a replicated input log, against one standalone host.

The state-procedure voter (WORKLOADS.md §1, 1-vote batches, one pipelined
producer, opchain, one partition per host) runs in four setups side by side,
interleaved round by round, each fed its own votes:

- **standalone**: one server, its own command log, no NATS;
- **R1**: one cluster host on a log kept by one NATS server;
- **R3**: one cluster host on a log kept by three NATS servers (three copies,
  each append fsynced by a majority before it is acknowledged);
- **R3, 2 hosts**: two hosts on that log, the producer on the first; both run
  every batch, on the same two cores.

Every NATS node fsyncs each append (`sync_interval: always`). **Checked:**
after each round every host's tables equal the sequential reference fed the
same votes (the second host once it has caught up; how long that took after
the last ack is `second_host_behind_s`). Then the log alone: pipelined appends
of 64 B and 6.4 KB entries (a 100-vote batch), R1 and R3. Last, catching
up on the R3 log once every round has run: a third host started on an empty
data directory runs the whole log; then host 0 checkpoints (shared, the log
trimmed below it) and a fourth host, empty, installs that snapshot and runs
the rest; each timed from its start until its tables equal the reference
(`catch_up_s`, start-up included). Ratio lines:
votes/s of R1 over standalone (what the log costs one host; target 0.8), and
of R3 over R1 (what two more copies cost; target 0.8).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

NAME = "cluster"
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 1
BATCHES, QUICK_BATCHES = 12_000, 2_000
WARMUP, QUICK_WARMUP = 2_000, 500
MAX_IN_FLIGHT = 1_024
CATCH_UP_TIMEOUT_S = 120.0
LOG_TARGET = 0.8
REPLICATION_TARGET = 0.8
APPEND_SIZES = (64, 6_400)


@dataclass(frozen=True)
class Setup:
    name: str
    nats_nodes: int  # 0: standalone
    hosts: int


SETUPS = (Setup("standalone", 0, 1), Setup("R1", 1, 1), Setup("R3", 3, 1), Setup("R3, 2 hosts", 3, 2))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batches",
        type=int,
        default=None,
        help=f"1-vote batches per run (default {BATCHES:,}; --quick {QUICK_BATCHES:,})",
    )
    parser.add_argument(
        "--appends", type=int, default=None, help="entries per log-append run (default 20,000; --quick 4,000)"
    )


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from streamtx.client import Client
    from streamtx.errors import StreamTxError
    from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params
    from streamtx.procedures.voter.reference import VoterReference
    from streamtx.procedures.voter.state import QUERIES
    from streamtx.server.cluster.natsd import NatsCluster
    from streamtx.server.embedded import EmbeddedServer

    count = args.batches or (QUICK_BATCHES if args.quick else BATCHES)
    warmup = QUICK_WARMUP if args.quick else WARMUP
    per_setup = warmup + count * args.rounds
    votes = generate_votes(per_setup * len(SETUPS), seed=13, phones=max(10_000, per_setup))
    config = VoterConfig()
    run_id = uuid.uuid4().hex[:8]
    refs = {s.name: VoterReference(config) for s in SETUPS}
    behind: dict[str, list[float]] = {s.name: [] for s in SETUPS}

    def slice_of(i: int, start: int, n: int) -> list[pa.Table]:
        base = i * per_setup + start
        return [votes.slice(base + j, 1) for j in range(n)]

    with ExitStack() as stack, progress(args.quiet) as bar:
        task = bar.add_task("bench cluster: starting", total=len(SETUPS) * (args.rounds + 1))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamtx-bench-cluster-")))
        nodes = sorted({s.nats_nodes for s in SETUPS} - {0})
        nats = {n: stack.enter_context(NatsCluster(tmp / f"nats-{n}", n)) for n in nodes}
        hosts: dict[str, list[EmbeddedServer]] = {}
        for i, s in enumerate(SETUPS):
            extra = ["--stream-retention", "1000000"]
            servers = []
            for h in range(s.hosts):
                flags = list(extra)
                if s.nats_nodes:
                    urls = ",".join(nats[s.nats_nodes].urls)
                    flags += ["--cluster", urls, "--host-id", f"h{h}", "--cluster-log", f"bench{i}{run_id}"]
                    flags += ["--log-replicas", str(s.nats_nodes)]
                servers.append(stack.enter_context(EmbeddedServer(partitions=1, executor="opchain", extra_args=flags)))
            hosts[s.name] = servers
            with Client(servers[0].target) as c:
                c.deploy(deploy_script(config, "state"))
                c.call("setup", **setup_params(config))

        def check(s: Setup, batches: list[pa.Table], timed: bool = True) -> None:
            ref = refs[s.name]
            for b in batches:
                ref.process_batch(list(zip(*(b.column(c).to_pylist() for c in b.column_names), strict=True)))
            expected = ref.tables()
            acked = time.perf_counter()
            for h, srv in enumerate(hosts[s.name]):
                deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
                while True:
                    with Client(srv.target) as c:
                        same = all(c.query(sql).fetchall() == expected[name] for name, sql in QUERIES.items())
                    if same:
                        break
                    if h == 0 or time.monotonic() > deadline:
                        raise RuntimeError(f"bench {NAME}: {s.name}, host {h}: the tables differ from the reference")
                    time.sleep(0.05)
                if h == 1 and timed:
                    behind[s.name].append(time.perf_counter() - acked)

        for i, s in enumerate(SETUPS):  # untimed: code paths, caches and the working set warm
            bar.update(task, description=f"cluster: warming up {s.name}")
            warm = slice_of(i, 0, warmup)
            target = hosts[s.name][0].target
            asyncio.run(push_batches(target, "votes_in", f"{run_id}-{i}-warm", warm, max_in_flight=MAX_IN_FLIGHT))
            check(s, warm, timed=False)
            bar.advance(task)

        def one(s: Setup, r: int) -> Measurement:
            bar.update(task, description=f"cluster: {s.name} round {r + 1}/{args.rounds}")
            i = SETUPS.index(s)
            batches = slice_of(i, warmup + r * count, count)
            srv = hosts[s.name][0]
            with Client(srv.target) as c:
                pids = [p["pid"] for p in c.status()["partitions"]]
            meter = CpuMeter(srv.proc.pid if srv.proc else 0, pids)
            producer = f"{run_id}-{i}-r{r}"
            m = asyncio.run(push_batches(srv.target, "votes_in", producer, batches, max_in_flight=MAX_IN_FLIGHT))
            m.extra["cpu_ms_per_batch"] = meter.per_batch_ms(len(batches))
            check(s, batches)  # after the clock stopped
            bar.advance(task)
            return m

        results = interleave(list(SETUPS), one, args.rounds)
        bar.update(task, description="cluster: a new host catching up, from the log and from a snapshot")
        last = SETUPS[-1]
        log_flags = ["--cluster", ",".join(nats[last.nats_nodes].urls), "--log-replicas", str(last.nats_nodes)]
        log_flags += ["--cluster-log", f"bench{SETUPS.index(last)}{run_id}", "--stream-retention", "1000000"]
        expected = refs[last.name].tables()

        def caught_up(host: str) -> float:
            started = time.perf_counter()
            flags = [*log_flags, "--host-id", host]
            srv = stack.enter_context(EmbeddedServer(partitions=1, executor="opchain", extra_args=flags))
            deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
            while True:
                try:
                    with Client(srv.target) as c:
                        if all(c.query(sql).fetchall() == expected[name] for name, sql in QUERIES.items()):
                            return time.perf_counter() - started
                except StreamTxError:  # not deployed there yet
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench {NAME}: new host {host} did not catch up")
                time.sleep(0.05)

        from_log = caught_up("h2")
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while True:  # a trim is skipped when reading the hosts' positions is slow; the next checkpoint tries again
            with Client(hosts[last.name][0].target) as c:
                c.checkpoint()
            shared = asyncio.run(_trimmed(nats[last.nats_nodes].urls, f"bench{SETUPS.index(last)}{run_id}"))
            if shared is not None:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"bench {NAME}: the log was not trimmed after checkpoints")
        from_snapshot = caught_up("h3")
        catch_up_line = {
            "benchmark": NAME,
            "setup": "catch-up",
            "log_replicas": last.nats_nodes,
            "votes": warmup + count * args.rounds,
            "log_entries": shared["last"],
            "catch_up_s": {"whole log": round(from_log, 2), "snapshot + rest of the log": round(from_snapshot, 2)},
            "snapshot_bytes": shared["snapshot_bytes"],
            "log_first_after_trim": shared["first"],
        }
        bar.update(task, description="cluster: log appends")
        appends = args.appends or (4_000 if args.quick else 20_000)
        append_lines = [
            asyncio.run(_appends(nats[n].urls, n, size, appends, f"append{n}{size}{run_id}"))
            for n in sorted(nats)
            for size in APPEND_SIZES
        ]

    lines: list[dict[str, Any]] = []
    per = dict(zip([s.name for s in SETUPS], results, strict=True))
    for s, rounds in zip(SETUPS, results, strict=True):
        m = median_round(rounds, key=lambda x: x.per_s)
        cpu = dict(m.extra["cpu_ms_per_batch"])
        line = {
            "benchmark": NAME,
            "setup": s.name,
            "nats_nodes": s.nats_nodes,
            "log_replicas": s.nats_nodes or None,
            "hosts": s.hosts,
            "batches": count,
            "votes_per_s": round_sig(m.per_s),
            "votes_per_s_rounds": [round_sig(x.per_s) for x in rounds],
            "latency_ms": latency_summary(m.latencies),
            "other_cores": cpu.pop("other_cores"),
            "cpu_ms_per_batch": cpu,
            "load_1m": m.extra.get("load_1m"),
            "matches_reference": True,
        }
        if s.hosts > 1:
            line["second_host_behind_s"] = [round(b, 3) for b in behind[s.name]]
        lines.append(line)
    lines += [*append_lines, catch_up_line]
    for num, den, target, what in (
        ("R1", "standalone", LOG_TARGET, "what the log costs one host"),
        ("R3", "R1", REPLICATION_TARGET, "what two more copies of the log cost"),
    ):
        paired = [a.per_s / b.per_s for a, b in zip(per[num], per[den], strict=True)]
        lines.append(
            ratio_line(
                NAME,
                median(paired),
                target,
                f"votes/s, {num}",
                f"votes/s, {den} ({what}; median of the rounds' ratios)",
                rounds=[round(x, 3) for x in paired],
            )
        )
    return lines


async def _trimmed(urls: list[str], name: str, wait: float = 3.0) -> dict[str, Any] | None:
    """Once a host has shared a snapshot and trimmed the log below it (None if not within `wait` seconds): the
    snapshot's size and the log's ends."""
    from streamtx.server.cluster.inputlog import InputLog

    log = InputLog(",".join(urls), name, 3)
    await log.open(create=False)
    try:
        deadline = time.monotonic() + wait
        while True:
            info, shots = await log.info(), await log.snapshots()
            if info["first"] > 1 and shots:
                return {"first": info["first"], "last": info["last"], "snapshot_bytes": max(s.bytes for s in shots)}
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.1)
    finally:
        await log.close()


async def _appends(urls: list[str], replicas: int, size: int, count: int, name: str) -> dict[str, Any]:
    """Pipelined appends of `size`-byte entries to a fresh log, every acknowledgement awaited."""
    from streamtx.server.cluster.inputlog import InputLog

    log = InputLog(",".join(urls), name, replicas)
    await log.open()
    try:
        body = b"x" * size
        started = time.perf_counter()
        acks = [await log.append("push", body, "") for _ in range(count)]
        await asyncio.gather(*acks)
        seconds = time.perf_counter() - started
        await log.delete()
    finally:
        await log.close()
    return {
        "benchmark": NAME,
        "setup": "log appends",
        "log_replicas": replicas,
        "entry_bytes": size,
        "appends": count,
        "appends_per_s": round_sig(count / seconds),
        "mb_per_s": round_sig(count * size / seconds / 1e6),
    }


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Votes/s of each setup (the median round)."""
    runs = [r for r in records if "votes_per_s" in r]
    return plot_bars(
        path,
        [r["setup"] for r in runs],
        {"votes/s": [r["votes_per_s"] for r in runs]},
        title="voter, 1-vote batches: standalone vs cluster mode, one machine",
        ylabel="votes/s",
    )
