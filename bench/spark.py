"""Spark into streamtx: rows/s of a streaming query's sink, next to Spark's `noop` sink.

Starts one embedded server with a stream `bench_spark_in(id BIGINT, k INTEGER,
v DOUBLE)` whose SQL procedure keeps per-key totals (1,000 keys), and a local
Spark session (local[2], on the same 2 cores). The input is Parquet files of
`batch_rows` rows; a streaming query reads them with maxFilesPerTrigger=1, so
every micro-batch is one file, and writes them either to streamtx (each
micro-batch one atomic batch, exactly once: staged by the task, committed by
the driver, applied by the procedure) or to Spark's `noop` sink, which drops
the rows: the ceiling of what Spark itself delivers from this input. A third
sink, `python_noop`, is a Python data source that drops the rows: the ceiling
of any sink written in Spark's Python Data Source API (the Arrow hand-over to
a Python worker, the driver-side writer and commit runners), for reference.

Each configuration (sink x micro-batch size) is one query over all its files,
interleaved for several rounds; a line reports its median round: rows/s and
micro-batches/s over the summed micro-batch durations (Spark's
triggerExecution, so query start-up is not counted), and the micro-batch
latency. Then one ratio line per size: streamtx rows/s over noop rows/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, DataSourceStreamWriter, WriterCommitMessage

from .common import (
    Measurement,
    find_line,
    interleave,
    latency_summary,
    median_round,
    note,
    parse_sizes,
    plot_bars,
    progress,
    ratio_line,
    round_sig,
)

NAME = "spark"
STREAM = "bench_spark_in"
DDL = f"""
CREATE TABLE bench_spark_totals (k INTEGER PRIMARY KEY, n BIGINT, s DOUBLE);
CREATE STREAM {STREAM} (id BIGINT, k INTEGER, v DOUBLE);
CREATE PROCEDURE bench_spark_apply ON STREAM {STREAM} AS BEGIN
    INSERT INTO bench_spark_totals SELECT k, count(*), sum(v) FROM {STREAM} GROUP BY k
        ON CONFLICT DO UPDATE SET n = bench_spark_totals.n + excluded.n, s = bench_spark_totals.s + excluded.s;
END;
"""
SINKS = ("streamtx", "noop", "python_noop")
DEFAULT_SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 10_000, 50_000)
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 1
FULL_FILES = (600_000, 6, 30)  # (rows budget, at least, at most) files per configuration
QUICK_FILES = (60_000, 3, 6)
NOOP_FRACTION_TARGET = 0.5
PYTHON_NOOP_FRACTION_TARGET = 0.8
ROWS_PER_S_TARGET = 100_000


class _DropWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Any) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 - Spark's name
        pass

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803
        pass


class PythonNoop(DataSource):
    """`format("python_noop")`: drops every row, in Spark's Python Data Source API."""

    @classmethod
    def name(cls) -> str:
        return "python_noop"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return _DropWriter()


@dataclass(frozen=True)
class Config:
    sink: str
    batch_rows: int
    batches: int

    @property
    def label(self) -> str:
        return f"{self.sink}/{self.batch_rows}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-sizes",
        type=parse_sizes,
        default=None,
        metavar="N,N,...",
        help=f"rows per micro-batch (default {','.join(map(str, DEFAULT_SIZES))}; "
        f"--quick: {','.join(map(str, QUICK_SIZES))})",
    )
    parser.add_argument(
        "--files",
        type=int,
        default=None,
        help="micro-batches (input files) per configuration and round (default: from the size; fewer with --quick)",
    )
    parser.add_argument("--master", default="local[2]", help="Spark master (default %(default)s)")


def files_for(rows: int, quick: bool) -> int:
    budget, lo, hi = QUICK_FILES if quick else FULL_FILES
    return max(lo, min(hi, budget // rows))


def write_input(directory: Path, rows: int, files: int) -> None:
    """`files` Parquet files of `rows` rows: sequential ids, 1,000 keys, random doubles."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(rows)
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows, dtype=np.int64)
        table = pa.table(
            {"id": pa.array(ids), "k": pa.array((ids % 1000).astype(np.int32)), "v": pa.array(rng.random(rows))}
        )
        pq.write_table(table, directory / f"part-{f:05d}.parquet")


def spark_session(master: str):  # noqa: ANN201 - pyspark is imported lazily
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from streamtx.client.spark import register

    builder = (
        SparkSession.builder.master(master)
        .appName("streamtx-bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    )
    if master.startswith("local"):  # everything in this process: no hostname lookups
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    try:
        spark = builder.getOrCreate()
    except Exception as e:  # noqa: BLE001 - pyspark's error class varies by version
        if "JAVA_GATEWAY_EXITED" not in str(e):
            raise
        # seen once in ~50 suite runs under load: the JVM exits before it reports its port; a second launch works
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(PythonNoop)
    return spark


def measure(spark: Any, cfg: Config, source: Path, target: str, workdir: Path) -> Measurement:
    """One streaming query over `source` into the configuration's sink."""
    df = spark.readStream.schema("id BIGINT, k INT, v DOUBLE").option("maxFilesPerTrigger", 1).parquet(str(source))
    w = df.writeStream.format(cfg.sink).option("checkpointLocation", str(workdir / uuid.uuid4().hex))
    if cfg.sink == "streamtx":
        w = w.option("target", target).option("stream", STREAM)
    query = w.trigger(availableNow=True).start()
    query.awaitTermination()
    progress_ = [p for p in query.recentProgress if p["numInputRows"] > 0]
    durations = [p["durationMs"]["triggerExecution"] / 1e3 for p in progress_]
    rows = sum(p["numInputRows"] for p in progress_)
    want = cfg.batch_rows * cfg.batches
    if rows != want:
        raise RuntimeError(f"bench spark {cfg.label}: the query read {rows} rows, expected {want}")
    return Measurement(elapsed=sum(durations), count=len(durations), latencies=durations, extra={"rows": rows})


def _line(cfg: Config, rounds: list[Measurement]) -> dict[str, Any]:
    m = median_round(rounds, key=lambda x: x.per_s)
    rows_per_s = m.extra["rows"] / m.elapsed
    line = {
        "benchmark": NAME,
        "sink": cfg.sink,
        "batch_rows": cfg.batch_rows,
        "batches": cfg.batches,
        "rows_per_s": round_sig(rows_per_s),
        "batches_per_s": round_sig(m.per_s),
        "latency_ms": latency_summary(m.latencies),
        "rounds": len(rounds),
        "rows_per_s_rounds": [round_sig(x.extra["rows"] / x.elapsed) for x in rounds],
    }
    if cfg.sink == "streamtx":
        line["rows_per_s_target"] = ROWS_PER_S_TARGET
        line["met"] = rows_per_s >= ROWS_PER_S_TARGET
    return line


def ratios(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """streamtx rows/s over noop rows/s, per micro-batch size, largest first; then over python_noop."""
    out = []
    for n in sorted({line["batch_rows"] for line in lines}, reverse=True):
        ours, noop = find_line(lines, sink="streamtx", batch_rows=n), find_line(lines, sink="noop", batch_rows=n)
        out.append(
            ratio_line(
                NAME,
                ours["rows_per_s"] / noop["rows_per_s"],
                NOOP_FRACTION_TARGET,
                f"rows/s Spark -> streamtx (SQL procedure, exactly once), {n}-row micro-batches",
                f"rows/s Spark -> noop sink (the ceiling), {n}-row micro-batches",
                batch_rows=n,
                numerator_value=ours["rows_per_s"],
                denominator_value=noop["rows_per_s"],
            )
        )
    n = max(line["batch_rows"] for line in lines)
    ours, py = find_line(lines, sink="streamtx", batch_rows=n), find_line(lines, sink="python_noop", batch_rows=n)
    out.append(
        ratio_line(
            NAME,
            ours["rows_per_s"] / py["rows_per_s"],
            PYTHON_NOOP_FRACTION_TARGET,
            f"rows/s Spark -> streamtx, {n}-row micro-batches",
            f"rows/s Spark -> python_noop (a Python data source that drops the rows), {n}-row micro-batches",
            batch_rows=n,
            numerator_value=ours["rows_per_s"],
            denominator_value=py["rows_per_s"],
        )
    )
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from streamtx.client import Client
    from streamtx.server.embedded import EmbeddedServer

    sizes = args.batch_sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    files = {n: args.files or files_for(n, args.quick) for n in sizes}
    configs = [Config(sink, n, files[n]) for n in sizes for sink in SINKS]
    # Spark first: its JVM is forked before the server's gRPC threads exist
    with (
        spark_session(args.master) as spark,
        tempfile.TemporaryDirectory(prefix="streamtx-bench-spark-") as tmp,
        EmbeddedServer() as srv,
    ):
        work = Path(tmp)
        with Client(srv.target) as c:
            c.deploy(DDL)
        for n in sizes:
            write_input(work / f"in-{n}", n, files[n])
        # untimed warm-up: JVM, Python workers, both sinks, the server's first batches
        write_input(work / "warm", 1_000, 2)
        for sink in SINKS:
            measure(spark, Config(sink, 1_000, 2), work / "warm", srv.target, work)

        with progress(args.quiet) as bar:
            task = bar.add_task("bench spark", total=len(configs) * args.rounds)

            def one(cfg: Config, r: int) -> Measurement:
                bar.update(task, description=f"spark {cfg.label} round {r + 1}/{args.rounds}")
                return measure(spark, cfg, work / f"in-{cfg.batch_rows}", srv.target, work)

            def done(cfg: Config, r: int, m: Measurement) -> None:
                bar.advance(task)
                bar.print(f"{cfg.label} round {r + 1}: {m.extra['rows'] / m.elapsed:,.0f} rows/s")

            results = interleave(configs, one, args.rounds, on_done=done)
        with Client(srv.target) as c:
            applied = c.query("SELECT sum(n) FROM bench_spark_totals").fetchall()[0][0]
    expected = sum(cfg.batch_rows * cfg.batches for cfg in configs if cfg.sink == "streamtx") * args.rounds + 2_000
    if applied != expected:
        raise RuntimeError(f"bench spark: the procedure saw {applied} rows, expected {expected} (each exactly once)")
    lines = [_line(cfg, rounds) for cfg, rounds in zip(configs, results, strict=True)]
    note(f"bench spark: {len(configs)} configurations x {args.rounds} rounds; {applied:,} rows applied", args.quiet)
    return lines + ratios(lines)


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Grouped bars: rows/s per micro-batch size, streamtx next to noop."""
    lines = [r for r in records if "sink" in r]
    sizes = sorted({r["batch_rows"] for r in lines})
    labels = {
        "streamtx": "streamtx (exactly once, SQL procedure)",
        "noop": "noop (Spark's ceiling)",
        "python_noop": "python_noop (Python data source ceiling)",
    }
    series = {labels[sink]: [find_line(lines, sink=sink, batch_rows=n)["rows_per_s"] for n in sizes] for sink in SINKS}
    return plot_bars(
        path,
        [f"{n:,} rows/micro-batch" for n in sizes],
        series,
        title="Spark structured streaming into streamtx vs the noop sink (median round)",
        xlabel="micro-batch size",
        ylabel="rows/s (log)",
        log=True,
    )
