"""The Spark sinks against a real server, from a real local[2] Spark session.

- Streaming sink: every micro-batch reaches its stream exactly once while a task
  fails once (its partial staging is discarded), while the query is stopped and
  restarted from its checkpoint — including from the worst point, the batch
  applied in streamtx but not yet in Spark's commit log — and while a commit's
  acknowledgement is lost (the re-sent commit is answered DUPLICATE), and while
  a partition worker is killed three times under the running query. The final
  tables equal those of the same input applied once.
- Batch sink: a DataFrame is one atomic batch, or batches of a chosen size in order.
- Options are checked on the driver before any row moves: unknown stream,
  schema mismatch, unreachable server, unknown option.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.spark import DropAckProxy, counting_app, expected_totals, make_spark, unique, write_json_files

from streamtx.client import Client
from streamtx.server.embedded import EmbeddedServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCHEMA = "id BIGINT, k INT, v BIGINT"


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = make_spark(tmp_path_factory.mktemp("spark-local"))
    yield session
    session.stop()


@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("spark-sink") / "data") as s:
        yield s


@pytest.fixture
def app(srv) -> Iterator[tuple[Client, str]]:
    p = unique("s")
    with Client(srv.target) as c:
        c.deploy(counting_app(p))
        yield c, p


def tables(c: Client, p: str) -> tuple[list, int, int]:
    totals = [tuple(r) for r in c.query(f"SELECT k, n, s FROM {p}_totals ORDER BY k").fetchall()]
    n, distinct = c.query(f"SELECT count(*), count(DISTINCT id) FROM {p}_log").fetchall()[0]
    return totals, n, distinct


def counter(c: Client, name: str) -> int:
    return int(c.status()["counters"].get(name, 0))


def start_query(
    spark,
    src: Path,
    ckpt: Path,
    target: str,
    stream: str,
    fail_marker: Path | None = None,
    kill_pid: int = 0,
    **options: str,
):
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
    w = df.writeStream.format("streamtx")
    if fail_marker is not None:
        w = df.writeStream.format("streamtx_flaky").option("fail_marker", str(fail_marker))
        w = w.option("kill_pid", str(kill_pid))
    for key, value in options.items():
        w = w.option(key, value)
    return (
        w.option("target", target)
        .option("stream", stream)
        .option("chunk_rows", 50)
        .option("checkpointLocation", str(ckpt))
        .start()
    )


def test_stream_sink_exactly_once_across_task_failure_and_restarts(spark, srv, app, tmp_path):
    c, p = app
    src, ckpt, marker = tmp_path / "in", tmp_path / "ckpt", tmp_path / "failed-once"
    rows = write_json_files(src, 1, 4, 300)

    q = start_query(spark, src, ckpt, srv.target, f"{p}_in", fail_marker=marker)
    q.processAllAvailable()
    assert marker.exists(), "the injected task failure did not happen"
    assert counter(c, "staged_parts_discarded") >= 1  # the failed attempt's staged rows
    last = q.lastProgress["batchId"]
    q.stop()
    assert last == 3
    assert tables(c, p) == (expected_totals(rows), len(rows), len(rows))

    # The worst moment to stop: the batch is applied in streamtx, Spark's commit log
    # does not have it yet. Spark re-runs it on restart; streamtx must not apply it again.
    (ckpt / "commits" / str(last)).unlink()
    (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)
    duplicates = counter(c, "duplicate")
    rows += write_json_files(src, 5, 4, 300)

    q = start_query(spark, src, ckpt, srv.target, f"{p}_in")
    q.processAllAvailable()
    q.stop()
    assert counter(c, "duplicate") >= duplicates + 1  # the re-run micro-batch was answered DUPLICATE
    assert tables(c, p) == (expected_totals(rows), len(rows), len(rows))

    # a stop in the middle of a run, then a restart: still each row once
    rows += write_json_files(src, 9, 6, 300)
    q = start_query(spark, src, ckpt, srv.target, f"{p}_in")
    while (q.lastProgress or {}).get("batchId", 0) < 10:
        q.awaitTermination(0.2)
    q.stop()
    q = start_query(spark, src, ckpt, srv.target, f"{p}_in")
    q.processAllAvailable()
    q.stop()
    assert tables(c, p) == (expected_totals(rows), len(rows), len(rows))


def test_stream_sink_lost_commit_ack_applies_once(spark, srv, app, tmp_path):
    c, p = app
    src, ckpt = tmp_path / "in", tmp_path / "ckpt"
    rows = write_json_files(src, 1, 4, 200)
    duplicates = counter(c, "duplicate")
    proxy = DropAckProxy(srv.target, drop={2, 3})  # the acks of micro-batches 1 and 2
    try:
        q = start_query(spark, src, ckpt, proxy.target, f"{p}_in")
        q.processAllAvailable()
        q.stop()
    finally:
        proxy.close()
    assert proxy.dropped == [2, 3]
    assert counter(c, "duplicate") == duplicates + 2  # each re-sent commit was answered DUPLICATE
    assert tables(c, p) == (expected_totals(rows), len(rows), len(rows))
    batches = c.query(f"SELECT count(*) FROM {p}_log GROUP BY id // 100000").fetchall()
    assert sorted(b[0] for b in batches) == [200] * 4


def test_batch_sink_one_atomic_batch_and_sized_batches(spark, srv, app):
    c, p = app
    rows = [{"id": i, "k": i % 7, "v": i * 3} for i in range(1, 2001)]
    df = spark.createDataFrame(rows, SCHEMA).repartition(3)
    before = counter(c, "committed")
    df.write.format("streamtx").option("target", srv.target).option("stream", f"{p}_in").mode("append").save()
    assert counter(c, "committed") == before + 1
    assert tables(c, p) == (expected_totals(rows), len(rows), len(rows))

    producer = unique("batchjob")
    (
        df.write.format("streamtx")
        .option("target", srv.target)
        .option("stream", f"{p}_in")
        .option("batch_size", 300)
        .option("producer_id", producer)
        .mode("append")
        .save()
    )
    # each task's rows in batches of at most 300: every row once more, in 3 tasks
    sizes = [r[0] for r in c.query(f"SELECT count(*) FROM {p}_log GROUP BY id ORDER BY 1").fetchall()]
    assert sizes == [2] * len(rows)
    assert counter(c, "committed") >= before + 1 + 7


def test_options_are_checked_on_the_driver_before_any_data_moves(spark, srv, app, tmp_path):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    c, p = app
    staged = counter(c, "staged_chunks")
    df = spark.createDataFrame([(1, 2, 3)], SCHEMA)

    def save(frame, **opts) -> str:
        w = frame.write.format("streamtx").mode("append")
        for k, v in opts.items():
            w = w.option(k, v)
        with pytest.raises((PySparkException, Py4JJavaError)) as e:
            w.save()
        return str(e.value)

    assert "unknown stream 'nope'" in save(df, target=srv.target, stream="nope")
    text = save(df.withColumnRenamed("v", "w"), target=srv.target, stream=f"{p}_in")
    assert "schema mismatch" in text and "missing column(s) 'v'" in text
    text = save(df.withColumn("k", df.k.cast("bigint")), target=srv.target, stream=f"{p}_in")
    assert "column 'k' is bigint in the DataFrame but int32 in the stream" in text
    assert "unreachable" in save(df, target="127.0.0.1:1", stream=f"{p}_in", timeout="2")
    assert "unknown option(s) 'strem'" in save(df, target=srv.target, strem="x")

    # the streaming sink: the query fails on the driver when it plans its first micro-batch
    from pyspark.errors import StreamingQueryException

    write_json_files(tmp_path / "in", 1, 1, 5)
    stream = spark.readStream.schema("id BIGINT, k BIGINT, v BIGINT").json(str(tmp_path / "in"))
    q = (
        stream.writeStream.format("streamtx")
        .option("target", srv.target)
        .option("stream", f"{p}_in")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    with pytest.raises(StreamingQueryException, match="column 'k' is bigint in the DataFrame but int32"):
        q.awaitTermination(120)
    assert counter(c, "staged_chunks") == staged
    assert tables(c, p) == ([], 0, 0)


def test_stream_sink_rides_through_three_worker_deaths_exactly_once(spark, tmp_path):
    """A worker of a 2-partition server is killed three times while the query runs; it never stops."""
    p = unique("w")
    app = counting_app(p)
    for table in (
        f"{p}_log (id BIGINT, k INTEGER, v BIGINT)",
        f"{p}_in (id BIGINT, k INTEGER, v BIGINT)",
        f"{p}_totals (k INTEGER PRIMARY KEY, n BIGINT, s BIGINT)",
    ):
        app = app.replace(table, f"{table} PARTITION BY (k)")  # micro-batches span both partitions
    src, ckpt = tmp_path / "in", tmp_path / "ckpt"
    rows = write_json_files(src, 1, 12, 300)
    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target) as c:
        c.deploy(app)
        q = start_query(spark, src, ckpt, srv.target, f"{p}_in")
        for i, at in enumerate((1, 4, 7)):
            while (q.lastProgress or {}).get("batchId", -1) < at:
                assert q.isActive, q.exception()
                q.awaitTermination(0.05)
            os.kill(c.status()["partitions"][i % 2]["pid"], signal.SIGKILL)
        q.processAllAvailable()
        assert q.isActive and q.exception() is None
        q.stop()
        assert tables(c, p) == (expected_totals(rows), len(rows), len(rows))
        assert counter(c, "restarts") == 3


@pytest.mark.parametrize(
    ("when", "copies", "rides_through"),
    [("mid_task", "1", True), ("before_commit", "2", True), ("before_commit", "1", False)],
)
def test_stream_sink_to_a_cluster_goes_on_on_another_host_when_its_host_dies(
    spark, tmp_path, when, copies, rides_through
):
    """Cluster mode: the query names two hosts; the first, where tasks stage, is SIGKILLed by the task writing
    micro-batch 1. Mid-task (its first chunks staged): its next chunk cannot reach that host, the task fails and
    Spark runs it again, on the host left. Once the task staged everything, before the commit: the commit goes to
    the other host, which holds a copy of every part with `stage_copies` 2 (the default); with 1 it holds none,
    the commit fails and the query stops, until restarted from its checkpoint. Each row lands once."""
    from pyspark.errors import StreamingQueryException
    from support.processes import Launched

    from streamtx.server.cluster.natsd import NatsCluster

    p = unique("c")
    src, ckpt, marker = tmp_path / "in", tmp_path / "ckpt", tmp_path / "killed"
    rows = write_json_files(src, 1, 6, 300)
    with NatsCluster(tmp_path / "nats", 1) as nats:
        flags = ["--cluster", nats.urls[0], "--log-replicas", "1"]
        a, b = (Launched(tmp_path / h, 1, [*flags, "--host-id", h]) for h in "ab")
        try:
            with Client(a.target) as c:
                c.deploy(counting_app(p))  # through the log: b has it too
            target = f"{a.target},{b.target}"
            options = {"stage_copies": copies, "kill_after_write": str(when == "before_commit").lower()}
            q = start_query(spark, src, ckpt, target, f"{p}_in", fail_marker=marker, kill_pid=a.proc.pid, **options)
            if rides_through:
                q.processAllAvailable()
                assert q.isActive and q.exception() is None
                q.stop()
            else:
                with pytest.raises(StreamingQueryException, match="unreachable"):
                    q.processAllAvailable()
                q = start_query(spark, src, ckpt, target, f"{p}_in", stage_copies=copies)
                q.processAllAvailable()
                q.stop()
            assert marker.exists() and a.proc.wait(10) == -signal.SIGKILL
            with Client(b.target) as c:
                assert tables(c, p) == (expected_totals(rows), len(rows), len(rows))
        finally:
            a.close()
            b.close()
