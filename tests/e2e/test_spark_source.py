"""The Spark streaming source: a streamtx output stream read with batch ids as offsets.

A query reads the stream into a Parquet sink, is stopped, more batches are
pushed, and it restarts from its checkpoint (once also from the point where
Spark had planned a range but not committed it): every batch arrives exactly
once — no gap, no repeat — with its rows and batch id.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.spark import make_spark, unique

from streamtx.client import Client
from streamtx.server.embedded import EmbeddedServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = make_spark(tmp_path_factory.mktemp("spark-local"))
    yield session
    session.stop()


@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("spark-source") / "data") as s:
        yield s


def push_batches(c: Client, stream: str, first: int, count: int) -> list[tuple[int, int]]:
    """`count` batches of 3 rows; returns (vote id, batch id) of every row pushed."""
    out = []
    for b in range(first, first + count):
        ids = [b * 10 + i for i in range(3)]
        ack = c.push(stream, {"id": ids, "k": [b] * 3}).result()
        assert ack.outcome == "committed"
        out.extend((i, ack.timestamp) for i in ids)
    return out


def read_parquet(spark, path) -> list[tuple[int, int]]:
    return sorted((r.id, r["__ts"]) for r in spark.read.parquet(str(path)).collect())


def start(spark, target: str, stream: str, out, ckpt):
    df = spark.readStream.format("streamtx").option("target", target).option("stream", stream).load()
    return df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt)).start()


def test_source_reads_each_batch_once_across_restarts(spark, srv, tmp_path):
    p = unique("r")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    with Client(srv.target) as c:
        c.deploy(
            f"""
CREATE STREAM {p}_in (id BIGINT, k INTEGER);
CREATE STREAM {p}_out (id BIGINT, k INTEGER);
CREATE PROCEDURE {p}_fwd ON STREAM {p}_in AS BEGIN INSERT INTO {p}_out SELECT id, k FROM {p}_in; END;
"""
        )
        pushed = push_batches(c, f"{p}_in", 1, 5)
        q = start(spark, srv.target, f"{p}_out", out, ckpt)
        q.processAllAvailable()
        q.stop()
        assert read_parquet(spark, out) == sorted(pushed)

        pushed += push_batches(c, f"{p}_in", 6, 5)
        q = start(spark, srv.target, f"{p}_out", out, ckpt)
        q.processAllAvailable()
        last = q.lastProgress["batchId"]
        q.stop()
        assert read_parquet(spark, out) == sorted(pushed)

        # Spark planned the last range (offset log) but did not commit it: the restart
        # re-reads exactly that range, then the new batches
        (ckpt / "commits" / str(last)).unlink()
        (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)
        pushed += push_batches(c, f"{p}_in", 11, 4)
        q = start(spark, srv.target, f"{p}_out", out, ckpt)
        q.processAllAvailable()
        q.stop()
        got = read_parquet(spark, out)
        assert got == sorted(pushed)
        assert len(set(got)) == len(got) == 14 * 3

    df = spark.readStream.format("streamtx").option("target", srv.target).option("stream", f"{p}_in")
    with pytest.raises(Exception, match="consumed by a procedure"):
        df.load()
