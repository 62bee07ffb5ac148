"""Client tests that need no streamtx server.

Conversions, result wrappers and argument parsing are tested directly; the
pipelining, retries and error mapping against a real server are in
tests/contract/test_client.py (no fake of the server anywhere).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pandas as pd
import pyarrow as pa
import pytest

import streamtx
from streamtx import cli, errors, wire
from streamtx.client import AsyncClient, Client, DeployResult, PushResult, Result, connect
from streamtx.client.async_client import message_to_dict, rowdata_to_result, to_table
from streamtx.v1 import streamtx_pb2 as pb

# -- conversions of input rows ------------------------------------------------------

EXPECTED = pa.table({"id": [1, 2], "name": ["a", "b"]})


@pytest.mark.parametrize(
    "rows",
    [
        EXPECTED,
        EXPECTED.to_batches()[0],
        pd.DataFrame({"id": [1, 2], "name": ["a", "b"]}, index=[10, 11]),
        [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
        {"id": [1, 2], "name": ["a", "b"]},
    ],
    ids=["table", "record_batch", "dataframe", "list_of_dicts", "dict_of_lists"],
)
def test_to_table_accepts_every_row_shape(rows: Any) -> None:
    table = to_table(rows)
    assert table.column_names == ["id", "name"]
    assert table.to_pylist() == EXPECTED.to_pylist()


def test_to_table_rejects_other_shapes() -> None:
    with pytest.raises(TypeError):
        to_table("id,name\n1,a")
    with pytest.raises(TypeError):
        to_table([(1, "a")])
    with pytest.raises(errors.InvalidArgument):
        to_table({"id": [1, 2], "name": ["a"]})  # ragged columns


def test_rows_encode_both_ways() -> None:
    table = to_table([{"id": 1, "name": "a", "x": None}])
    arrow = wire.encode_rowdata(table, arrow=True)
    assert wire.ipc_to_table(arrow.arrow_ipc).equals(table)
    rows = wire.encode_rowdata(table, arrow=False)
    assert list(rows.rows.columns) == ["id", "name", "x"]
    assert rowdata_to_result(rows).to_pylist() == [{"id": 1, "name": "a", "x": None}]


# -- result wrappers ---------------------------------------------------------------------


def test_result_accessors() -> None:
    r = Result(pa.table({"k": [1, 2, 3], "v": ["x", None, "z"]}))
    assert r.num_rows == len(r) == 3
    assert r.column_names == ["k", "v"]
    assert r.fetchall() == [(1, "x"), (2, None), (3, "z")]
    assert list(r) == r.fetchall()
    assert r.to_pylist()[1] == {"k": 2, "v": None}
    assert r.arrow().num_columns == 2
    df = r.df()
    assert isinstance(df, pd.DataFrame) and list(df["k"]) == [1, 2, 3]
    text = repr(r)
    assert "k" in text and "NULL" in text and "(3 rows)" in text
    assert r == Result(pa.table({"k": [1, 2, 3], "v": ["x", None, "z"]}))


def test_result_repr_truncates_and_handles_empty() -> None:
    r = Result(pa.table({"n": list(range(100))}))
    assert "80 not shown" in repr(r)
    empty = Result(pa.table({"n": pa.array([], pa.int64())}))
    assert empty.fetchall() == [] and len(empty) == 0 and "(0 rows)" in repr(empty)
    assert Result(pa.table({})).fetchall() == []


def test_push_result_from_acks() -> None:
    base: dict[str, Any] = {"stream": "s", "producer_id": "p"}
    ok = PushResult.from_ack(pb.PushAck(**base, batch_id=3, outcome=pb.COMMITTED, timestamp=9, rows=2))
    assert ok.ok and ok.outcome == "committed" and ok.code is None and ok.original is None
    assert ok.raise_for_outcome() is ok and ok.rows == 2 and ok.timestamp == 9

    dup = PushResult.from_ack(
        pb.PushAck(stream="s", producer_id="p", batch_id=3, outcome=pb.DUPLICATE, original=pb.COMMITTED)
    )
    assert dup.ok and dup.outcome == "duplicate" and dup.original == "committed"

    bad = PushResult.from_ack(
        pb.PushAck(
            stream="s",
            producer_id="p",
            batch_id=4,
            outcome=pb.REJECTED,
            code=5,
            reason="no stream s",
        )
    )
    assert not bad.ok and bad.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(errors.NotFound, match="no stream s"):
        bad.raise_for_outcome()

    unspecified = PushResult.from_ack(pb.PushAck(**base, batch_id=5))
    assert unspecified.outcome == "rejected" and unspecified.code == grpc.StatusCode.UNKNOWN


def test_deploy_result_and_status_dict() -> None:
    d = DeployResult.from_proto(
        pb.DeployResponse(
            created=[pb.CatalogObject(kind="stream", name="votes")],
            dropped=[pb.CatalogObject(kind="table", name="old")],
        )
    )
    assert d.created == [("stream", "votes")] and d.dropped == [("table", "old")]
    status = message_to_dict(
        pb.StatusResponse(
            version="1",
            partitions=[pb.PartitionStatus(id=0, pid=42, alive=True, queued=7)],
            counters={"batches": 12},
            last_timestamp=99,
        )
    )
    assert status["counters"] == {"batches": 12}  # int64 stays int (MessageToDict gives "12")
    assert status["last_timestamp"] == 99
    assert status["partitions"][0]["queued"] == 7 and status["partitions"][0]["alive"] is True
    assert status["streams"] == []


def test_lazy_package_exports() -> None:
    assert streamtx.__version__
    assert streamtx.Client is Client and streamtx.AsyncClient is AsyncClient
    assert streamtx.connect is connect


def test_version_flag_prints_the_package_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"streamtx {streamtx.__version__}\n"


def test_cli_value_parsing() -> None:
    assert cli.parse_value("3") == 3 and isinstance(cli.parse_value("3"), int)
    assert cli.parse_value("2.5") == 2.5
    assert cli.parse_value("abc") == "abc"
    assert cli.parse_params(["a=1", "b=x=y", "c="]) == {"a": 1, "b": "x=y", "c": ""}
    with pytest.raises(errors.InvalidArgument):
        cli.parse_params(["novalue"])


def arun(coro: Any, timeout: float = 30) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


# -- errors without a server -------------------------------------------------------


def test_errors_are_never_raw_grpc() -> None:
    async def go() -> None:
        async with AsyncClient("127.0.0.1:1", retries=1) as c:  # nothing listens there
            with pytest.raises(errors.Unavailable):
                await c.status()
            fut = await c.push("s", [{"x": 1}])
            with pytest.raises(errors.Unavailable):
                await fut

    arun(go())


# -- sync client --------------------------------------------------------------------------


# -- CLI -----------------------------------------------------------------


def test_cli_help_texts(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("deploy", "sql", "call", "push", "status", "serve"):
        with pytest.raises(SystemExit) as exc:
            cli.main([cmd, "--help"])
        assert exc.value.code == 0
        assert len(capsys.readouterr().out) > 100
