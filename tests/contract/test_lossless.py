"""Every value a producer pushes is stored exactly, or the batch is rejected naming the column: by example.

The examples of the report (1.5 into a BIGINT was stored as 1), text read the
same way through protobuf `Rows` and Arrow, and results in ROWS format pushed
back. Random values of every type, through both paths, are in
tests/contract/test_types_roundtrip.py.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from typing import Any

import grpc
import pyarrow as pa
import pytest

from streamtx.client import Client
from streamtx.server.embedded import EmbeddedServer
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(300)

COLUMNS = {"i": "BIGINT", "s": "SMALLINT", "d": "DOUBLE", "r": "REAL", "m": "DECIMAL(10,2)", "t": "TIMESTAMP"}
DEFAULTS = {"i": 1, "s": 1, "d": 1.0, "r": 1.0, "m": 1, "t": 1}
APP = f"""
CREATE STREAM vals ({", ".join(f"{c} {t}" for c, t in COLUMNS.items())});
CREATE TABLE kept ({", ".join(f"{c} {t}" for c, t in COLUMNS.items())}, b BIGINT);
CREATE PROCEDURE keep ON STREAM vals AS BEGIN INSERT INTO kept SELECT *, $batch_id FROM vals; END;
"""


@pytest.fixture(scope="module", params=[1, 2], ids=["P1", "P2"])
def target(request, tmp_path_factory) -> Iterator[str]:
    with EmbeddedServer(tmp_path_factory.mktemp("lossless"), partitions=request.param) as srv:
        with Client(srv.target) as c:
            c.deploy(APP)
        yield srv.target


@pytest.mark.parametrize("arrow", [False, True], ids=["rows", "arrow"])
@pytest.mark.parametrize(
    "column, value, stored",
    [
        ("i", 1.5, None),
        ("i", 2.0, 2),
        ("t", 1.5, None),
        ("m", 1.234, None),
        ("m", 1.5, decimal.Decimal("1.50")),
        ("r", 1e300, None),
        ("d", 2**53 + 1, None),
    ],
)
def test_the_examples_of_the_report(target, column, value, stored, arrow):
    """1.5 into a BIGINT was committed as 1: now refused, naming the column, row and value."""
    row = {**DEFAULTS, column: value}
    batch: Any = pa.table({c: [v] for c, v in row.items()}) if arrow else {c: [v] for c, v in row.items()}
    with Client(target, arrow=arrow) as c:
        ack = c.push("vals", batch).result()
        if stored is None:
            assert ack.outcome == "rejected" and f"column {column!r} row 0: value {value!r}" in ack.reason, ack
            return
        assert ack.outcome == "committed", ack
        assert c.query(f"SELECT {column} FROM kept WHERE b = $b", {"b": ack.timestamp}).fetchall() == [(stored,)]


@pytest.mark.parametrize("arrow", [False, True], ids=["rows", "arrow"])
@pytest.mark.parametrize(
    "column, text, stored",
    [
        ("i", "12", 12),
        ("i", "1.5", None),
        ("s", "40000", None),
        ("d", "1.5", 1.5),
        ("m", "1.50", decimal.Decimal("1.50")),
        ("m", "1.505", None),
        ("t", "2024-01-02T03:04:05", 1_704_164_645_000_000),
        ("t", "2024-01-02 03:04:05.123456", 1_704_164_645_123_456),
        ("t", "2024-01-02", 1_704_153_600_000_000),
        ("t", "yesterday", None),
    ],
)
def test_text_is_read_the_same_way_through_rows_and_arrow(target, column, text, stored, arrow):
    """JSON-ish clients send numbers, decimals and ISO-8601 times as text: converted exactly, or refused by SQL type."""
    row: dict[str, Any] = {**DEFAULTS, column: text}
    batch: Any = pa.table({c: [v] for c, v in row.items()}) if arrow else {c: [v] for c, v in row.items()}
    with Client(target, arrow=arrow) as c:
        ack = c.push("vals", batch).result()
        if stored is None:
            assert ack.outcome == "rejected" and f"column {column!r} row 0" in ack.reason, ack
            assert COLUMNS[column] in ack.reason and "int64" not in ack.reason, ack.reason  # SQL type names
            return
        assert ack.outcome == "committed", ack
        read = "epoch_us(t)" if column == "t" else column
        assert c.query(f"SELECT {read} FROM kept WHERE b = $b", {"b": ack.timestamp}).fetchall() == [(stored,)]


def test_results_as_rows_come_back_in_forms_the_rows_input_reads(target):
    """Results in format ROWS need no Arrow to read, and pushed back through Rows they are stored exactly."""
    types = "a BIGINT, d DOUBLE, s VARCHAR, m DECIMAL(10,2), t TIMESTAMP, day DATE, ok BOOLEAN, l BIGINT[]"
    with Client(target) as c:
        c.deploy(f"CREATE TABLE every ({types});\nCREATE STREAM every_in ({types});")
        c.query("SELECT 1")
    values = "(7, 1.5, 'x', 1.50, TIMESTAMP '2024-01-02 03:04:05.123456', DATE '2024-01-02', true, [1, 2])"
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.StreamTxStub(channel)
        stub.Deploy(
            pb.DeployRequest(
                sql=f"CREATE PROCEDURE every_fill AS BEGIN INSERT INTO every VALUES {values}, "
                "(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL); END;"
            ),
            timeout=30,
        )
        stub.Call(pb.CallRequest(procedure="every_fill"), timeout=30)
        sql = "SELECT *, (SELECT sum(a) FROM every) AS total FROM every ORDER BY a NULLS LAST"
        rows = stub.Query(pb.QueryRequest(sql=sql, format=pb.ROWS), timeout=30).result.rows
        assert list(rows.columns) == ["a", "d", "s", "m", "t", "day", "ok", "l", "total"]
        first = [v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for v in rows.rows[0].values]
        assert first[:7] == [7, 1.5, "x", "1.50", "2024-01-02 03:04:05.123456", "2024-01-02", True]
        assert [v.int_value for v in rows.rows[0].values[7].list_value.values] == [1, 2]
        assert first[8] == 7  # SUM over BIGINT is a HUGEINT: an int_value when it fits 64 bits
        assert all(v.WhichOneof("kind") is None for v in rows.rows[1].values[:8])
        # the same rows pushed back through Rows are stored exactly
        back = pb.Rows(columns=list(rows.columns)[:8], rows=[pb.Row(values=r.values[:8]) for r in rows.rows])
        ack = stub.Push(pb.PushRequest(stream="every_in", producer_id="rows", batch_id=1, data=pb.RowData(rows=back)))
        assert ack.outcome == pb.COMMITTED, ack
        read = stub.ReadStream(pb.ReadStreamRequest(stream="every_in", format=pb.ROWS), timeout=30)
        assert [list(r.values) for r in read.batches[0].data.rows.rows] == [list(r.values) for r in back.rows]
