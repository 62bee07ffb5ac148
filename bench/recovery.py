"""S-Store's logging experiment (docs/benchmarks.md): strong vs weak command logging, n = 1..10.

The PE-trigger dataflow of `bench triggers` (n procedures, each moving its
input batch to the next stream, 10 tuples per batch), with the command log
on. Throughput: one pipelined producer against a server with
`--durability strong` (every TE logged) and one with `--durability weak`
(only the pushed batches), both alive and measured interleaved, each with
group commit (the default, `--group-commit-ms 2`) and without it
(`--group-commit-ms 0`: every record fsynced alone before the partition goes
on, the setting of S-Store's Figure 8(a)). Recovery:
for each mode and n, a fresh server takes the input batches, is killed with
SIGKILL, and is started again on its data directory; the time from start to
serving is the recovery time (replay of the log; no checkpoint), next to the
start-up time of an empty server.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from .common import (
    Measurement,
    Stopwatch,
    find_line,
    interleave,
    latency_summary,
    median_round,
    progress,
    push_batches,
    ratio_line,
    round_sig,
    save_figure,
)
from .triggers import pe_script

NAME = "recovery"
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 1
ROWS = 10
MODES = ("strong", "weak")
COMMITS = {"group": 2.0, "none": 0.0}  # --group-commit-ms of each commit setting
THROUGHPUT_TARGET = 3.0  # weak / strong at n = 10 (S-Store: up to 4x)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=int, default=0, help="batches per throughput run (default 400; quick 80)")
    parser.add_argument(
        "--recovery-batches", type=int, default=0, help="input batches before the crash (default 5000; quick 300)"
    )
    parser.add_argument("--max-n", type=int, default=10, help="longest chain of procedures (default 10)")
    parser.add_argument(
        "--commits",
        default="group,none",
        help="log commit settings to measure: group (group commit, the default) and/or none "
        "(each record fsynced alone, S-Store's setting) (default %(default)s)",
    )


def chain_lengths(max_n: int, quick: bool) -> list[int]:
    return [n for n in (1, 5, 10) if n <= max_n] if quick else [n for n in (1, 2, 4, 6, 8, 10) if n <= max_n]


def _batch() -> pa.Table:
    return pa.table({"id": pa.array(range(ROWS), pa.int64()), "v": pa.array([0.5] * ROWS)})


def _recovery_time(mode: str, n: int, batches: int, tmp: Path) -> dict[str, float]:
    from streamtx.client import Client
    from streamtx.server.embedded import EmbeddedServer

    data = tmp / f"recovery-{mode}-{n}"
    srv = EmbeddedServer(data, durability=mode, startup_timeout=1800).start()
    try:
        with Client(srv.target) as c:
            c.deploy(pe_script(n))
        asyncio.run(push_batches(srv.target, f"pe{n}_s0", "bench-recovery", [_batch()] * batches, what="recovery"))
        srv.kill()
        with Stopwatch() as sw:
            srv.start()
        with Client(srv.target) as c:
            moved = c.query(f"SELECT count(*) FROM pe{n}_out").fetchall()[0][0]
            counters = c.status()["counters"]
        if moved != batches * ROWS:
            raise RuntimeError(f"bench recovery {mode} n={n}: {moved} rows after recovery, expected {batches * ROWS}")
        return {
            "seconds": sw.elapsed,
            "replayed": int(counters.get("partition0.recovered_records", 0)),
            "replay_ms": int(counters.get("partition0.recovery_ms", 0)),
        }
    finally:
        srv.close()


def _startup_time(tmp: Path) -> float:
    from streamtx.server.embedded import EmbeddedServer

    srv = EmbeddedServer(tmp / f"empty-{uuid.uuid4().hex[:6]}", durability="strong")
    with Stopwatch() as sw:
        srv.start()
    srv.close()
    return sw.elapsed


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from streamtx.client import Client
    from streamtx.server.embedded import EmbeddedServer

    ns = chain_lengths(args.max_n, args.quick)
    count = args.batches or (80 if args.quick else 400)
    crash_batches = args.recovery_batches or (300 if args.quick else 5000)
    run_id = uuid.uuid4().hex[:8]
    commits = [c for c in args.commits.split(",") if c]
    unknown = set(commits) - set(COMMITS)
    if unknown or not commits:
        raise SystemExit(f"bench recovery: --commits takes group and/or none, not {args.commits!r}")
    configs = [(mode, commit, n) for n in ns for commit in commits for mode in MODES]
    lines: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="streamtx-bench-recovery-") as tmp_name:
        tmp = Path(tmp_name)
        servers = {
            (mode, commit): EmbeddedServer(
                tmp / f"throughput-{mode}-{commit}",
                durability=mode,
                extra_args=["--group-commit-ms", str(COMMITS[commit])],
            ).start()
            for mode in MODES
            for commit in commits
        }
        try:
            for srv in servers.values():
                with Client(srv.target) as c:
                    c.deploy("\n".join(pe_script(n) for n in ns))
            with progress(args.quiet) as bar:
                task = bar.add_task("bench recovery", total=len(configs) * args.rounds + len(ns) * len(MODES))

                def one(cfg: tuple[str, str, int], r: int) -> Measurement:
                    mode, commit, n = cfg
                    bar.update(task, description=f"recovery: throughput {mode} commit={commit} n={n} round {r + 1}")
                    producer = f"bench-recovery-{run_id}-{mode}-{commit}-{n}-r{r}"
                    target = servers[(mode, commit)].target
                    return asyncio.run(push_batches(target, f"pe{n}_s0", producer, [_batch()] * count, what=NAME))

                results = interleave(configs, one, args.rounds, on_done=lambda *_: bar.advance(task))
                for (mode, commit, n), rounds in zip(configs, results, strict=True):
                    m = median_round(rounds, key=lambda x: x.per_s)
                    lines.append(
                        {
                            "benchmark": NAME,
                            "measure": "throughput",
                            "durability": mode,
                            "group_commit": commit == "group",
                            "n": n,
                            "batch_rows": ROWS,
                            "batches": count,
                            "batches_per_s": round_sig(m.per_s),
                            "latency_ms": latency_summary(m.latencies),
                            "rounds": len(rounds),
                        }
                    )
                for srv in servers.values():
                    srv.close()
                startup = _startup_time(tmp)
                for mode, n in [(mode, n) for n in ns for mode in MODES]:
                    bar.update(task, description=f"recovery: {crash_batches} batches, {mode} n={n}")
                    rec = _recovery_time(mode, n, crash_batches, tmp)
                    bar.advance(task)
                    lines.append(
                        {
                            "benchmark": NAME,
                            "measure": "recovery",
                            "durability": mode,
                            "n": n,
                            "input_batches": crash_batches,
                            "recovery_s": round_sig(rec["seconds"]),
                            "replay_s": round_sig(rec["replay_ms"] / 1000),
                            "records_replayed": rec["replayed"],
                            "empty_start_s": round_sig(startup),
                        }
                    )
        finally:
            for srv in servers.values():
                srv.close()

    def value(measure: str, mode: str, n: int, key: str, **match: Any) -> float:
        return find_line(lines, measure=measure, durability=mode, n=n, **match)[key]

    top = max(ns)
    for commit in commits:
        group = commit == "group"
        weak = value("throughput", "weak", top, "batches_per_s", group_commit=group)
        strong = value("throughput", "strong", top, "batches_per_s", group_commit=group)
        setting = "group commit" if group else "no group commit (S-Store's setting)"
        lines.append(
            ratio_line(
                f"{NAME}-throughput" + ("" if group else "-no-group-commit"),
                weak / strong,
                THROUGHPUT_TARGET,
                f"batches/s with weak logging, n={top}, {setting}",
                f"batches/s with strong logging, n={top}, {setting}",
                n=top,
                group_commit=group,
            )
        )
    lines.append(
        ratio_line(
            f"{NAME}-recovery",
            value("recovery", "strong", top, "replay_s") / max(value("recovery", "weak", top, "replay_s"), 1e-3),
            1.0,
            f"replay seconds with strong logging, n={top}",
            f"replay seconds with weak logging, n={top}",
            n=top,
        )
    )
    return lines


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, measure, key, label in (
        (left, "throughput", "batches_per_s", "input batches/s"),
        (right, "recovery", "replay_s", "replay seconds"),
    ):
        for mode in MODES:
            for group in (True, False):
                pts = sorted(
                    (r["n"], r[key])
                    for r in records
                    if r.get("measure") == measure and r["durability"] == mode and r.get("group_commit", True) == group
                )
                if pts:
                    style = "-" if group else "--"
                    series = f"{mode} logging" + ("" if group or measure == "recovery" else ", no group commit")
                    ax.plot([n for n, _ in pts], [v for _, v in pts], style, marker="o", label=series)
        ax.set_xlabel("procedures in the dataflow (n)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_title("throughput under command logging")
    right.set_title("recovery: replaying the log of the input batches")
    return save_figure(fig, path)
