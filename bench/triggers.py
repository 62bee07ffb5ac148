"""S-Store's trigger micro-benchmarks (docs/benchmarks.md): EE and PE triggers, n = 1..10.

EE triggers: a procedure inserts each batch into stream s0; a chain of n EE
triggers moves the tuples s0 -> s1 -> ... -> a table, inside the same TE (the
streams are consumed by the triggers only, so their tuples are never stored).
Against it: the same work as SQL statements the procedure issues itself, the
H-Store way, through tables (INSERT into the next, DELETE from the previous).

PE triggers: a dataflow of n procedures, each moving its input batch to its
output stream, which PE triggers feed to the next, in exact order; one
pipelined producer. Against it: n OLTP procedures that move the batch through
tables, which the client calls one after another, synchronously, per batch.

Every configuration lives on one server, deployed once; runs are interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamtx.server.config import EXECUTORS, ServerConfig

from .common import (
    Measurement,
    Stopwatch,
    interleave,
    latency_summary,
    median_round,
    plot_lines,
    progress,
    push_batches,
    ratio_line,
    round_sig,
)

NAME = "triggers"
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 2
ROWS = 10  # tuples per atomic batch
EE_TARGET = 2.5  # at 9 triggers (the SQL compiler issue's figure); printed for every n
PE_TARGET = 5.0


@dataclass(frozen=True)
class Config:
    kind: str  # ee | pe
    variant: str  # trigger | client (pe) / sql (ee)
    n: int
    batches: int

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.variant}/{self.n}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-n", type=int, default=10, help="longest chain (default %(default)s)")
    parser.add_argument("--batches", type=int, default=None, help="batches per configuration and round")
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=ServerConfig.executor,
        help=f"the server's executor (default the server's, {ServerConfig.executor})",
    )


def ee_script(n: int) -> str:
    p = f"ee{n}"
    lines = [f"CREATE STREAM {p}_in (id BIGINT, v DOUBLE);", f"CREATE TABLE {p}_out (id BIGINT, v DOUBLE);"]
    lines += [f"CREATE STREAM {p}_s{i} (id BIGINT, v DOUBLE);" for i in range(n)]
    lines.append(f"CREATE PROCEDURE {p} ON STREAM {p}_in AS BEGIN INSERT INTO {p}_s0 SELECT * FROM {p}_in; END;")
    for i in range(n):
        dest = f"{p}_s{i + 1}" if i + 1 < n else f"{p}_out"
        lines.append(
            f"CREATE TRIGGER {p}_t{i} ON STREAM {p}_s{i} AS BEGIN INSERT INTO {dest} SELECT * FROM {p}_s{i}; END;"
        )
    q = f"sq{n}"
    lines += [f"CREATE STREAM {q}_in (id BIGINT, v DOUBLE);", f"CREATE TABLE {q}_out (id BIGINT, v DOUBLE);"]
    lines += [f"CREATE TABLE {q}_t{i} (id BIGINT, v DOUBLE);" for i in range(n)]
    body = [f"INSERT INTO {q}_t0 SELECT * FROM {q}_in"]
    for i in range(n):
        dest = f"{q}_t{i + 1}" if i + 1 < n else f"{q}_out"
        body += [f"INSERT INTO {dest} SELECT * FROM {q}_t{i}", f"DELETE FROM {q}_t{i}"]
    lines.append(f"CREATE PROCEDURE {q} ON STREAM {q}_in AS BEGIN {'; '.join(body)}; END;")
    return "\n".join(lines)


def pe_script(n: int) -> str:
    p = f"pe{n}"
    lines = [f"CREATE TABLE {p}_out (id BIGINT, v DOUBLE);"]
    lines += [f"CREATE STREAM {p}_s{i} (id BIGINT, v DOUBLE);" for i in range(n)]
    for i in range(n):
        dest = f"{p}_s{i + 1}" if i + 1 < n else f"{p}_out"
        lines.append(
            f"CREATE PROCEDURE {p}_p{i} ON STREAM {p}_s{i} AS BEGIN INSERT INTO {dest} SELECT * FROM {p}_s{i}; END;"
        )
    q = f"pc{n}"
    lines += [f"CREATE TABLE {q}_out (id BIGINT, v DOUBLE);"]
    lines += [f"CREATE TABLE {q}_t{i} (id BIGINT, v DOUBLE);" for i in range(n)]
    lines.append(
        f"CREATE PROCEDURE {q}_p0 (ids BIGINT[], vs DOUBLE[]) AS BEGIN "
        f"INSERT INTO {q}_{'t1' if n > 1 else 'out'} SELECT unnest($ids), unnest($vs); END;"
    )
    for i in range(1, n):
        dest = f"{q}_t{i + 1}" if i + 1 < n else f"{q}_out"
        lines.append(
            f"CREATE PROCEDURE {q}_p{i} AS BEGIN INSERT INTO {dest} SELECT * FROM {q}_t{i}; DELETE FROM {q}_t{i}; END;"
        )
    return "\n".join(lines)


def chain_lengths(max_n: int, quick: bool) -> list[int]:
    return [n for n in (1, 5, 10) if n <= max_n] if quick else list(range(1, max_n + 1))


def _calls(target: str, n: int, batches: list[pa.Table]) -> Measurement:
    from streamtx.client import Client

    latencies = []
    with Client(target) as client:
        client.status()
        with Stopwatch() as sw:
            for batch in batches:
                t0 = time.perf_counter()
                client.call(f"pc{n}_p0", ids=batch.column("id").to_pylist(), vs=batch.column("v").to_pylist())
                for i in range(1, n):
                    client.call(f"pc{n}_p{i}")
                latencies.append(time.perf_counter() - t0)
    return Measurement(sw.elapsed, len(batches), latencies)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from streamtx.client import Client
    from streamtx.server.embedded import EmbeddedServer

    ns = chain_lengths(args.max_n, args.quick)
    count = args.batches or (30 if args.quick else 300)
    configs = [
        Config(kind, variant, n, count)
        for n in ns
        for kind, variants in (("ee", ("trigger", "sql")), ("pe", ("trigger", "client")))
        for variant in variants
    ]
    batch = pa.table({"id": pa.array(range(ROWS), pa.int64()), "v": pa.array([0.5] * ROWS)})
    run_id = uuid.uuid4().hex[:8]
    with EmbeddedServer(executor=args.executor) as srv:
        with Client(srv.target) as c:
            c.deploy("\n".join(ee_script(n) + "\n" + pe_script(n) for n in ns))
        with progress(args.quiet) as bar:
            task = bar.add_task("bench triggers", total=len(configs) * args.rounds)

            def one(cfg: Config, r: int) -> Measurement:
                bar.update(task, description=f"triggers {cfg.label} round {r + 1}/{args.rounds}")
                batches = [batch] * cfg.batches
                producer = f"bench-triggers-{run_id}-{cfg.label}-r{r}"
                if cfg.kind == "ee":
                    stream = f"ee{cfg.n}_in" if cfg.variant == "trigger" else f"sq{cfg.n}_in"
                    return asyncio.run(push_batches(srv.target, stream, producer, batches, what="bench triggers"))
                if cfg.variant == "trigger":
                    return asyncio.run(
                        push_batches(srv.target, f"pe{cfg.n}_s0", producer, batches, what="bench triggers")
                    )
                return _calls(srv.target, cfg.n, batches)

            def done(cfg: Config, r: int, m: Measurement) -> None:
                bar.advance(task)

            results = interleave(configs, one, args.rounds, on_done=done)
        with Client(srv.target) as c:
            for n in ns:  # every variant moved every tuple to its end
                counts = {
                    p: c.query(f"SELECT count(*) FROM {p}{n}_out").fetchall()[0][0] for p in ("ee", "sq", "pe", "pc")
                }
                expected = count * ROWS * args.rounds
                if any(v != expected for v in counts.values()):
                    raise RuntimeError(f"bench triggers n={n}: rows at the end {counts}, expected {expected} each")
    lines = []
    for cfg, rounds in zip(configs, results, strict=True):
        m = median_round(rounds, key=lambda x: x.per_s)
        lines.append(
            {
                "benchmark": NAME,
                "kind": cfg.kind,
                "variant": cfg.variant,
                "n": cfg.n,
                "batch_rows": ROWS,
                "batches": cfg.batches,
                "batches_per_s": round_sig(m.per_s),
                "latency_ms": latency_summary(m.latencies),
                "rounds": len(rounds),
                "executor": args.executor,
            }
        )
    for n in ns:
        for kind, base, target, num, den in (
            ("ee", "sql", EE_TARGET, "EE trigger chain", "the same moves as SQL statements (INSERT+DELETE)"),
            ("pe", "client", PE_TARGET, "PE-triggered dataflow, pipelined", "client calling each procedure"),
        ):
            a = next(x for x in lines if x.get("kind") == kind and x["variant"] == "trigger" and x["n"] == n)
            b = next(x for x in lines if x.get("kind") == kind and x["variant"] == base and x["n"] == n)
            lines.append(
                ratio_line(
                    f"{NAME}-{kind}",
                    a["batches_per_s"] / b["batches_per_s"],
                    target,
                    f"batches/s, {num}, n={n}",
                    f"batches/s, {den}, n={n}",
                    n=n,
                )
            )
    return lines


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    lines = [r for r in records if "kind" in r]
    ns = sorted({r["n"] for r in lines})
    names = {
        ("ee", "trigger"): "EE trigger chain",
        ("ee", "sql"): "SQL statements (H-Store)",
        ("pe", "trigger"): "PE-trigger dataflow",
        ("pe", "client"): "client-ordered calls (H-Store)",
    }
    series = {
        label: [
            next((r["batches_per_s"] for r in lines if (r["kind"], r["variant"], r["n"]) == (*key, n)), None)
            for n in ns
        ]
        for key, label in names.items()
    }
    return plot_lines(
        path,
        ns,
        series,
        title="S-Store trigger micro-benchmarks (median round)",
        xlabel="n (triggers / procedures in the chain)",
        ylabel="input batches/s (log)",
        logy=True,
    )
