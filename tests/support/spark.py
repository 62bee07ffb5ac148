"""Shared by the Spark connector tests: a local[2] session, apps, a fault-injecting proxy."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
from concurrent import futures
from pathlib import Path

import grpc
from pyspark import TaskContext

from streamtx.client.spark import StreamTxDataSource
from streamtx.client.spark.sink import StreamSinkWriter
from streamtx.v1 import streamtx_pb2 as pb

_names = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


def make_spark(tmp: Path):
    """A real local Spark: 2 cores, up to 4 attempts per task (so a failed task is retried)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    # Spark's Python workers cannot import this module (tests/ is not on their path): ship its classes by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    from streamtx.client.spark import register

    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("streamtx-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")  # local mode: no hostname lookups
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50")  # rows flow to the writer in small batches
        .config("spark.local.dir", str(tmp))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(FlakyDataSource)
    return spark


class FlakyStreamWriter(StreamSinkWriter):
    """The real stream sink, fed by an input that breaks once: the first attempt of the
    task writing micro-batch 1 fails after 150 rows, when its first chunks are staged; or,
    given `kill_pid`, SIGKILLs that process (the host it writes to) there and goes on."""

    marker = ""
    kill_pid = 0
    kill_after_write = False  # SIGKILL `kill_pid` once the task has staged every chunk, before the commit

    def write(self, iterator):
        if not self.kill_after_write:
            return super().write(self._break_once(iterator))
        staged = super().write(iterator)
        tc = TaskContext.get()
        if tc.getLocalProperty("streaming.sql.batchId") == "1" and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os.kill(self.kill_pid, signal.SIGKILL)
        return staged

    def _break_once(self, iterator):
        tc = TaskContext.get()
        first = tc.attemptNumber() == 0 and tc.getLocalProperty("streaming.sql.batchId") == "1"
        seen = 0
        for batch in iterator:
            yield batch
            seen += batch.num_rows
            if first and seen >= 150 and not os.path.exists(self.marker):
                Path(self.marker).touch()
                if self.kill_pid:
                    os.kill(self.kill_pid, signal.SIGKILL)
                    continue
                raise RuntimeError("injected task failure")


class FlakyDataSource(StreamTxDataSource):
    """`format("streamtx_flaky")`: streamtx with option fail_marker (a file created on the failure) and, to
    kill a process instead of failing, kill_pid (and kill_after_write, to kill it once the task staged all)."""

    @classmethod
    def name(cls) -> str:
        return "streamtx_flaky"

    def streamWriter(self, schema, overwrite):  # noqa: N802
        opts = dict(self.options)
        marker, kill_pid = opts.pop("fail_marker"), int(opts.pop("kill_pid", 0))
        after = opts.pop("kill_after_write", "") == "true"
        writer = FlakyStreamWriter(opts, schema, overwrite)
        writer.marker, writer.kill_pid, writer.kill_after_write = marker, kill_pid, after
        return writer


def counting_app(p: str) -> str:
    """A stream with a SQL procedure that logs every row and keeps per-key totals."""
    return f"""
CREATE TABLE {p}_log (id BIGINT, k INTEGER, v BIGINT);
CREATE TABLE {p}_totals (k INTEGER PRIMARY KEY, n BIGINT, s BIGINT);
CREATE STREAM {p}_in (id BIGINT, k INTEGER, v BIGINT);
CREATE PROCEDURE {p}_apply ON STREAM {p}_in AS BEGIN
    INSERT INTO {p}_log SELECT id, k, v FROM {p}_in;
    INSERT INTO {p}_totals SELECT k, count(*), sum(v) FROM {p}_in GROUP BY k
        ON CONFLICT DO UPDATE SET n = {p}_totals.n + excluded.n, s = {p}_totals.s + excluded.s;
END;
"""


def write_json_files(directory: Path, first_file: int, files: int, rows_per_file: int) -> list[dict]:
    """Files of rows {id, k, v} (ids unique across files); returns all rows written."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for f in range(first_file, first_file + files):
        chunk = [{"id": f * 100_000 + i, "k": i % 7, "v": f * 1000 + i} for i in range(rows_per_file)]
        tmp = directory / f".f{f:04d}.tmp"
        tmp.write_text("\n".join(json.dumps(r) for r in chunk) + "\n")
        tmp.rename(directory / f"f{f:04d}.json")
        rows.extend(chunk)
    return rows


def expected_totals(rows: list[dict]) -> list[tuple[int, int, int]]:
    acc: dict[int, list[int]] = {}
    for r in rows:
        t = acc.setdefault(r["k"], [0, 0])
        t[0] += 1
        t[1] += r["v"]
    return sorted((k, n, s) for k, (n, s) in acc.items())


class DropAckProxy:
    """A gRPC proxy in front of the server that loses the acknowledgement of chosen commits.

    Every call is forwarded as raw bytes; for a CommitStaged whose batch id is
    in `drop`, the commit reaches the server and is applied, but the client
    gets UNAVAILABLE instead of the ack — as when a connection breaks at the
    worst moment. Each chosen batch is dropped once.
    """

    def __init__(self, upstream: str, drop: set[int]) -> None:
        self.drop = set(drop)
        self.dropped: list[int] = []
        self.channel = grpc.insecure_channel(upstream)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers([self])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        forward = self.channel.unary_unary(method)

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                reply = forward(request, timeout=60)
            except grpc.RpcError as e:
                context.abort(e.code(), e.details())
            if method.endswith("/CommitStaged"):
                batch_id = pb.CommitStagedRequest.FromString(request).batch_id
                if batch_id in self.drop:
                    self.drop.discard(batch_id)
                    self.dropped.append(batch_id)
                    context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost (test proxy dropped the ack)")
            return reply

        return grpc.unary_unary_rpc_method_handler(handle)

    def close(self) -> None:
        self.server.stop(0)
        self.channel.close()
