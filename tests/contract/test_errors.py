"""Bad input against a real server: precise statuses, no state change, the server keeps serving.

Every test sends something wrong over raw gRPC stubs and checks three things:
the status code (for Push, the REJECTED ack's code), a message that names the
offending stream, column, row, parameter or statement, and that nothing
changed (checked with Query or Status); then a good request still works.

Most tests share one module-scoped server and use their own object names; the
tests that need special server flags start their own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import grpc
import pyarrow as pa
import pytest

from streamtx.server.embedded import EmbeddedServer
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import py_to_value, table_to_ipc

pytestmark = pytest.mark.timeout(120)

CALL_TIMEOUT = 20.0
SC = grpc.StatusCode
_CODES = {code.value[0]: code for code in grpc.StatusCode}


# --------------------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("errors") / "data") as s:
        yield s


@pytest.fixture(scope="module")
def stub(srv) -> Iterator[pb_grpc.StreamTxStub]:
    with grpc.insecure_channel(srv.target) as channel:
        yield pb_grpc.StreamTxStub(channel)


@pytest.fixture(autouse=True)
def still_serving(request) -> Iterator[None]:
    """After every test: the module server (if the test used it) is alive and answers."""
    yield
    if "stub" in request.fixturenames:
        srv = request.getfixturevalue("srv")
        assert srv.proc.poll() is None, "the server died"
        st = request.getfixturevalue("stub").Status(pb.StatusRequest(), timeout=CALL_TIMEOUT)
        assert all(p.alive for p in st.partitions), st.partitions


@pytest.fixture(scope="module")
def limits(tmp_path_factory) -> Iterator[EmbeddedServer]:
    """A server with small limits: 10 rows per batch, 1 MiB messages, 1 s order timeout."""
    args = ["--max-batch-rows", "10", "--max-message-bytes", str(1 << 20), "--order-timeout", "1"]
    with EmbeddedServer(tmp_path_factory.mktemp("limits") / "data", extra_args=args) as s:
        yield s


@pytest.fixture(scope="module")
def limits_stub(limits) -> Iterator[pb_grpc.StreamTxStub]:
    with grpc.insecure_channel(limits.target) as channel:
        yield pb_grpc.StreamTxStub(channel)


# --------------------------------------------------------------------------- helpers

_names = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


def deploy(stub, sql: str, metadata=None) -> pb.DeployResponse:
    return stub.Deploy(pb.DeployRequest(sql=sql), timeout=CALL_TIMEOUT, metadata=metadata)


def rpc_error(fn, request, **kw) -> grpc.RpcError:
    """Calls a unary RPC that must fail; returns the error."""
    with pytest.raises(grpc.RpcError) as info:
        fn(request, timeout=CALL_TIMEOUT, **kw)
    return info.value


def query(stub, sql: str, **params: Any) -> pa.Table:
    resp = stub.Query(
        pb.QueryRequest(sql=sql, params={k: py_to_value(v) for k, v in params.items()}),
        timeout=CALL_TIMEOUT,
    )
    return pa.ipc.open_stream(resp.result.arrow_ipc).read_all()


def rows(stub, table: str, order: str = "a") -> list[tuple]:
    t = query(stub, f"SELECT * FROM {table} ORDER BY {order}")
    return list(zip(*(t.column(i).to_pylist() for i in range(t.num_columns)), strict=True))


def status(stub) -> pb.StatusResponse:
    return stub.Status(pb.StatusRequest(), timeout=CALL_TIMEOUT)


def catalog_names(stub) -> set[str]:
    st = status(stub)
    return set(st.tables) | set(st.streams) | set(st.windows) | set(st.procedures) | set(st.triggers)


def arrow(table: pa.Table) -> pb.RowData:
    return pb.RowData(arrow_ipc=table_to_ipc(table))


def pbrows(columns: list[str], values: list[list[Any]]) -> pb.RowData:
    return pb.RowData(rows=pb.Rows(columns=columns, rows=[pb.Row(values=[py_to_value(v) for v in r]) for r in values]))


def push(stub, stream: str, batch_id: int, data: pb.RowData, producer: str = "prod") -> pb.PushAck:
    req = pb.PushRequest(stream=stream, producer_id=producer, batch_id=batch_id, data=data)
    return stub.Push(req, timeout=CALL_TIMEOUT)


def push_rejection(stub, request: pb.PushRequest) -> tuple[grpc.StatusCode, str]:
    """The status of a rejected push: a REJECTED ack's code and reason, or the call's status."""
    try:
        ack = stub.Push(request, timeout=CALL_TIMEOUT)
    except grpc.RpcError as e:
        return e.code(), e.details()
    assert ack.outcome == pb.REJECTED, ack
    assert ack.code != 0, ack
    assert ack.reason, ack
    return _CODES[ack.code], ack.reason


def assert_mentions(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, f"{part!r} not in message {message!r}"


class Sink:
    """A stream `s` whose procedure copies every tuple into table `t`."""

    def __init__(self, stub, prefix: str = "e") -> None:
        name = unique(prefix)
        self.stub = stub
        self.stream, self.table, self.proc = f"{name}_s", f"{name}_t", f"{name}_p"
        deploy(
            stub,
            f"CREATE TABLE {self.table} (a BIGINT, b VARCHAR, c DOUBLE);\n"
            f"CREATE STREAM {self.stream} (a BIGINT, b VARCHAR, c DOUBLE);\n"
            f"CREATE PROCEDURE {self.proc} ON STREAM {self.stream} AS BEGIN\n"
            f"  INSERT INTO {self.table} SELECT a, b, c FROM {self.stream};\n"
            "END;",
        )

    def rows(self) -> list[tuple]:
        return rows(self.stub, self.table)

    def good(self, batch_id: int = 1, producer: str = "prod", a: int = 1) -> pb.PushAck:
        """Pushes one good row and checks it committed."""
        ack = push(self.stub, self.stream, batch_id, arrow(good_row(a)), producer)
        assert ack.outcome == pb.COMMITTED, ack
        assert ack.timestamp > 0
        return ack


def good_row(a: int = 1) -> pa.Table:
    return pa.table({"a": [a], "b": ["x"], "c": [0.5]})


@pytest.fixture
def sink(stub) -> Sink:
    return Sink(stub)


# --------------------------------------------------------------------------- bad rows

_IPC = table_to_ipc(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"], "c": [1.0, 2.0, 3.0]}))

BAD_ROWS = {
    "malformed-arrow": (pb.RowData(arrow_ipc=b"this is not an Arrow IPC stream"), ["Arrow"]),
    "truncated-arrow": (pb.RowData(arrow_ipc=_IPC[: len(_IPC) // 2]), ["Arrow", "truncated"]),
    "arrow-schema-only": (pb.RowData(arrow_ipc=_IPC[:100]), ["Arrow"]),
    "empty-arrow": (pb.RowData(arrow_ipc=b""), ["empty"]),
    "no-data": (pb.RowData(), ["no rows"]),
    "arrow-missing-column": (arrow(pa.table({"a": [1], "b": ["x"]})), ["missing", "'c'"]),
    "arrow-unknown-column": (
        arrow(pa.table({"a": [1], "b": ["x"], "c": [1.0], "d": [1]})),
        ["unknown column", "'d'"],
    ),
    "arrow-uncastable-string": (
        arrow(pa.table({"a": ["1", "2", "zz"], "b": ["x", "y", "z"], "c": [1.0, 2.0, 3.0]})),
        ["'a'", "row 2", "zz"],
    ),
    "arrow-fractional-into-bigint": (
        arrow(pa.table({"a": [1.0, 2.5], "b": ["x", "y"], "c": [1.0, 2.0]})),
        ["'a'", "row 1"],
    ),
    "arrow-uint64-overflow": (
        arrow(pa.table({"a": pa.array([1, 2**64 - 1], pa.uint64()), "b": ["x", "y"], "c": [1.0, 2.0]})),
        ["'a'", "row 1"],
    ),
    "rows-wrong-count": (pbrows([], [[1, "x", 1.0], [2, "y", 2.0], [3, "z"]]), ["row 2", "2 values"]),
    "rows-wrong-count-named": (pbrows(["c", "a", "b"], [[1.0, 1, "x"], [2.0, 2, "y", 9]]), ["row 1"]),
    "rows-wrong-type": (pbrows([], [[1, "x", 1.0], ["two", "y", 2.0]]), ["'a'", "row 1", "two"]),
    "rows-string-for-double": (pbrows(["a", "b", "c"], [[1, "x", "nan?"]]), ["'c'", "row 0"]),
    "rows-int-for-string": (pbrows(["b", "a", "c"], [["x", 1, 1.0], [5, 2, 2.0]]), ["'b'", "row 1"]),
    "rows-unknown-column": (pbrows(["a", "b", "zz"], [[1, "x", 1.0]]), ["unknown column", "'zz'"]),
    "rows-missing-column": (pbrows(["a", "b"], [[1, "x"]]), ["missing", "'c'"]),
    "rows-duplicate-column": (pbrows(["a", "b", "a"], [[1, "x", 2]]), ["'a'", "twice"]),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_rows_are_invalid_argument_and_change_nothing(stub, sink, case):
    data, parts = BAD_ROWS[case]
    code, message = push_rejection(stub, pb.PushRequest(stream=sink.stream, producer_id="p", batch_id=1, data=data))
    assert code == SC.INVALID_ARGUMENT, message
    assert_mentions(message, sink.stream, *parts)
    assert sink.rows() == []
    # the rejected batch used up batch id 1 (so a pipeline goes on): a re-send is a duplicate
    # with the original rejection, and the next id commits
    again = push(stub, sink.stream, 1, arrow(good_row()), "p")
    assert again.outcome == pb.DUPLICATE and again.original == pb.REJECTED, again
    assert_mentions(again.reason, *parts)
    sink.good(batch_id=2, producer="p")
    assert sink.rows() == [(1, "x", 0.5)]


def test_bad_rows_in_a_batch_reject_the_whole_batch(stub, sink):
    data = pbrows(["a", "b", "c"], [[1, "x", 1.0], [2, "y", 2.0], [3, "z", "three"]])
    code, message = push_rejection(stub, pb.PushRequest(stream=sink.stream, producer_id="p", batch_id=1, data=data))
    assert code == SC.INVALID_ARGUMENT
    assert_mentions(message, "'c'", "row 2")
    assert sink.rows() == []  # not even rows 0 and 1


# --------------------------------------------------------------------------- addressing


def test_unknown_stream_is_not_found(stub, sink):
    code, message = push_rejection(
        stub, pb.PushRequest(stream="no_such_stream", producer_id="p", batch_id=1, data=arrow(good_row()))
    )
    assert code == SC.NOT_FOUND
    assert_mentions(message, "no_such_stream")
    sink.good()


def test_empty_stream_name_is_invalid_argument(stub, sink):
    code, message = push_rejection(stub, pb.PushRequest(stream="", producer_id="p", batch_id=1, data=arrow(good_row())))
    assert code == SC.INVALID_ARGUMENT
    assert_mentions(message, "stream")


@pytest.mark.parametrize("batch_id", [0, -1, -(2**63)])
def test_batch_id_below_one_is_invalid_argument(stub, sink, batch_id):
    req = pb.PushRequest(stream=sink.stream, producer_id="p", batch_id=batch_id, data=arrow(good_row()))
    code, message = push_rejection(stub, req)
    assert code == SC.INVALID_ARGUMENT
    assert_mentions(message, sink.stream, "batch_id", str(batch_id))
    assert sink.rows() == []
    sink.good(batch_id=1, producer="p")


def test_empty_producer_id_is_invalid_argument(stub, sink):
    code, message = push_rejection(
        stub, pb.PushRequest(stream=sink.stream, producer_id="", batch_id=1, data=arrow(good_row()))
    )
    assert code == SC.INVALID_ARGUMENT
    assert_mentions(message, sink.stream, "producer_id")
    assert sink.rows() == []
    sink.good()


def test_push_to_a_procedure_output_stream_is_failed_precondition(stub):
    name = unique("out")
    deploy(
        stub,
        f"CREATE STREAM {name}_in (a BIGINT);\n"
        f"CREATE STREAM {name}_out (a BIGINT);\n"
        f"CREATE PROCEDURE {name}_fwd ON STREAM {name}_in AS BEGIN\n"
        f"  INSERT INTO {name}_out SELECT a * 10 FROM {name}_in;\n"
        "END;",
    )
    req = pb.PushRequest(stream=f"{name}_out", producer_id="p", batch_id=1, data=arrow(pa.table({"a": [1]})))
    code, message = push_rejection(stub, req)
    assert code == SC.FAILED_PRECONDITION
    assert_mentions(message, f"{name}_out", f"{name}_fwd")
    # nothing appeared on the output stream; the border stream still works
    first = push(stub, f"{name}_in", 1, arrow(pa.table({"a": [7]})), producer="p")
    assert first.outcome == pb.COMMITTED
    sub = stub.Subscribe(pb.SubscribeRequest(stream=f"{name}_out"), timeout=CALL_TIMEOUT)
    try:
        batch = next(sub)
    finally:
        sub.cancel()
    assert batch.ts == first.timestamp
    assert pa.ipc.open_stream(batch.data.arrow_ipc).read_all().to_pydict() == {"a": [70]}


def test_subscribe_errors(stub, sink):
    err = rpc_error(lambda r, **kw: next(stub.Subscribe(r, **kw)), pb.SubscribeRequest(stream="no_such_stream"))
    assert err.code() == SC.NOT_FOUND
    assert_mentions(err.details(), "no_such_stream")
    err = rpc_error(lambda r, **kw: next(stub.Subscribe(r, **kw)), pb.SubscribeRequest(stream=sink.stream))
    assert err.code() == SC.FAILED_PRECONDITION
    assert_mentions(err.details(), sink.stream, sink.proc)


# --------------------------------------------------------------------------- limits


def test_batch_over_max_batch_rows_is_resource_exhausted(limits_stub):
    sink = Sink(limits_stub)
    eleven = pa.table({"a": list(range(11)), "b": ["x"] * 11, "c": [0.0] * 11})
    for batch_id, data in enumerate((arrow(eleven), pbrows(["a", "b", "c"], [[i, "x", 0.0] for i in range(11)])), 1):
        req = pb.PushRequest(stream=sink.stream, producer_id="p", batch_id=batch_id, data=data)
        code, message = push_rejection(limits_stub, req)
        assert code == SC.RESOURCE_EXHAUSTED
        assert_mentions(message, sink.stream, "11", "10")
        assert sink.rows() == []
    ten = eleven.slice(0, 10)
    ack = push(limits_stub, sink.stream, 3, arrow(ten), producer="p")
    assert ack.outcome == pb.COMMITTED, ack
    assert len(sink.rows()) == 10


def test_batch_ids_past_64_bits_in_one_message_are_invalid_argument(stub):
    sink = Sink(stub)
    two = pa.table({"a": [1, 2], "b": ["x", "y"], "c": [0.0, 0.0]})
    req = pb.PushRequest(stream=sink.stream, producer_id="p", batch_id=2**63 - 1, data=arrow(two), batch_rows=[1, 1])
    with pytest.raises(grpc.RpcError) as info:
        list(stub.PushStream(iter([req]), timeout=CALL_TIMEOUT))
    assert info.value.code() == SC.INVALID_ARGUMENT
    assert_mentions(info.value.details(), sink.stream, str(2**63 - 1), "64 bits")
    assert sink.rows() == []


def test_message_over_max_message_bytes_is_resource_exhausted(limits, limits_stub):
    sink = Sink(limits_stub)
    big = pa.table({"a": [1], "b": ["x" * (2 << 20)], "c": [0.0]})  # 2 MiB > 1 MiB limit
    with pytest.raises(grpc.RpcError) as info:
        push(limits_stub, sink.stream, 1, arrow(big), producer="p")
    assert info.value.code() == SC.RESOURCE_EXHAUSTED
    assert sink.rows() == []
    assert limits.proc.poll() is None
    sink.good(batch_id=1, producer="p")
    assert sink.rows() == [(1, "x", 0.5)]


# --------------------------------------------------------------------------- query


def test_query_unknown_table_names_it(stub):
    err = rpc_error(stub.Query, pb.QueryRequest(sql="SELECT * FROM no_such_table"))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), "no_such_table")


@pytest.mark.parametrize(
    "sql, parts",
    [
        ("SELEC 1", ["SELEC", "LINE 1"]),
        ("SELECT a\nFROM t\nWHERE a = = 1", ["LINE 3"]),
        ("SELECT (1", ["LINE 1"]),
    ],
)
def test_query_syntax_error_carries_the_position(stub, sql, parts):
    err = rpc_error(stub.Query, pb.QueryRequest(sql=sql))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), *parts)


@pytest.mark.parametrize(
    "template, kind",
    [
        ("INSERT INTO {t} VALUES (9, 'evil', 9.0)", "INSERT"),
        ("UPDATE {t} SET a = 9", "UPDATE"),
        ("DELETE FROM {t}", "DELETE"),
        ("CREATE TABLE {t}_new (a INT)", "CREATE"),
        ("DROP TABLE {t}", "DROP"),
        ("ALTER TABLE {t} ADD COLUMN d INT", "ALTER"),
        ("TRUNCATE {t}", "DELETE"),
        ("EXPLAIN ANALYZE DELETE FROM {t}", "EXPLAIN"),
        ("ATTACH ':memory:' AS m", "ATTACH"),
        ("COPY {t} TO '/tmp/streamtx-copy.csv'", "COPY"),
        ("SELECT 1; DELETE FROM {t}", "statement"),
        ("DELETE FROM {t}; SELECT 1", "statement"),
    ],
)
def test_query_rejects_writes_and_changes_nothing(stub, sink, template, kind):
    sink.good(a=4)
    before = sink.rows()
    err = rpc_error(stub.Query, pb.QueryRequest(sql=template.format(t=sink.table)))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), kind)
    assert sink.rows() == before
    assert sink.table in status(stub).tables
    assert f"{sink.table}_new" not in status(stub).tables


def test_query_empty_sql_and_missing_parameter(stub, sink):
    err = rpc_error(stub.Query, pb.QueryRequest(sql="  "))
    assert err.code() == SC.INVALID_ARGUMENT
    err = rpc_error(stub.Query, pb.QueryRequest(sql=f"SELECT * FROM {sink.table} WHERE a = $wanted"))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), "wanted")
    sink.good(a=3)
    assert query(stub, f"SELECT b FROM {sink.table} WHERE a = $wanted", wanted=3).to_pydict() == {"b": ["x"]}


def test_query_cannot_read_files(stub):
    err = rpc_error(stub.Query, pb.QueryRequest(sql="SELECT * FROM read_csv('/etc/passwd')"))
    assert err.code() == SC.INVALID_ARGUMENT


# --------------------------------------------------------------------------- call


@pytest.fixture
def kv(stub) -> str:
    name = unique("kv")
    deploy(
        stub,
        f"CREATE TABLE {name} (a BIGINT, b VARCHAR);\n"
        f"CREATE PROCEDURE {name}_put (k BIGINT, v VARCHAR) AS BEGIN\n"
        f"  INSERT INTO {name} VALUES ($k, $v);\n"
        f"  SELECT error('negative key ' || $k) WHERE $k < 0;\n"
        f"  SELECT count(*) AS n FROM {name};\n"
        "END;",
    )
    return name


def call(stub, procedure: str, **params: Any) -> pb.CallResponse:
    req = pb.CallRequest(procedure=procedure, params={k: py_to_value(v) for k, v in params.items()})
    return stub.Call(req, timeout=CALL_TIMEOUT)


def call_error(stub, procedure: str, params: dict[str, pb.Value]) -> grpc.RpcError:
    return rpc_error(stub.Call, pb.CallRequest(procedure=procedure, params=params))


@pytest.mark.parametrize(
    "params, parts",
    [
        ({"k": py_to_value(1)}, ["missing", "'v'"]),
        ({}, ["missing", "'k'"]),
        ({"k": py_to_value(1), "v": py_to_value("x"), "extra": py_to_value(2)}, ["unknown", "'extra'"]),
        ({"k": py_to_value("not a number"), "v": py_to_value("x")}, ["'k'", "BIGINT"]),
        ({"k": py_to_value(b"\x00\x01"), "v": py_to_value("x")}, ["'k'"]),
    ],
)
def test_call_bad_parameters_are_invalid_argument(stub, kv, params, parts):
    err = call_error(stub, f"{kv}_put", params)
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), f"{kv}_put", *parts)
    assert rows(stub, kv) == []
    resp = call(stub, f"{kv}_put", k=1, v="one")
    assert pa.ipc.open_stream(resp.results[-1].arrow_ipc).read_all().to_pydict() == {"n": [1]}


def test_call_unknown_procedure_is_not_found(stub):
    err = call_error(stub, "no_such_procedure", {})
    assert err.code() == SC.NOT_FOUND
    assert_mentions(err.details(), "no_such_procedure")


def test_call_of_a_stream_procedure_is_failed_precondition(stub, sink):
    err = call_error(stub, sink.proc, {})
    assert err.code() == SC.FAILED_PRECONDITION
    assert_mentions(err.details(), sink.proc, sink.stream)
    assert sink.rows() == []


def test_call_abort_is_aborted_and_undoes_the_transaction(stub, kv):
    call(stub, f"{kv}_put", k=1, v="one")
    err = call_error(stub, f"{kv}_put", {"k": py_to_value(-5), "v": py_to_value("bad")})
    assert err.code() == SC.ABORTED
    assert_mentions(err.details(), "negative key -5")
    assert rows(stub, kv) == [(1, "one")]  # the INSERT before the error() was rolled back
    call(stub, f"{kv}_put", k=2, v="two")
    assert rows(stub, kv) == [(1, "one"), (2, "two")]


def test_call_string_for_bigint_parameter_is_coerced_or_rejected(stub):
    name = unique("inc")
    deploy(stub, f"CREATE PROCEDURE {name} (x BIGINT) AS BEGIN SELECT $x + 1 AS r; END;")
    try:
        resp = call(stub, name, x="42")
    except grpc.RpcError as e:
        assert e.code() == SC.INVALID_ARGUMENT, e.details()
        assert_mentions(e.details(), "'x'")
    else:
        assert pa.ipc.open_stream(resp.results[0].arrow_ipc).read_all().to_pydict() == {"r": [43]}


def test_call_fractional_double_for_bigint_parameter_is_rejected_or_bigint(stub):
    name = unique("inc")
    deploy(stub, f"CREATE PROCEDURE {name} (x BIGINT) AS BEGIN SELECT $x + 1 AS r; END;")
    try:
        resp = call(stub, name, x=1.5)
    except grpc.RpcError as e:
        assert e.code() == SC.INVALID_ARGUMENT, e.details()
        assert_mentions(e.details(), "'x'")
    else:
        result = pa.ipc.open_stream(resp.results[0].arrow_ipc).read_all()
        assert pa.types.is_integer(result.schema.field("r").type), result


# --------------------------------------------------------------------------- deploy


@pytest.mark.parametrize(
    "script, parts",
    [
        # a parser-level error: the script line and column
        ("CREATE TABLE {p}a (x INT);\nCREATE STREAM {p}b (x INT);\nCREATE STREM {p}c (x INT);", ["line 3"]),
        ("CREATE TABLE {p}a (x INT);\n\nCREATE TABLE {p}b (x INT", ["line 3", "column"]),
        ("CREATE STREAM {p}a (x INT NOT NULL);", ["line 1", "NOT NULL"]),
        ("CREATE WINDOW {p}w ON nowhere ROWS 0 SLIDE 1;", ["line 1", "ROWS"]),
        # DuckDB's parser for a table body: names the table and points into it
        ("CREATE TABLE {p}a (x INT);\nCREATE TABLE {p}b (x INT NOT NUL);", ["{p}b", "NUL", "LINE 1"]),
        # sqlglot's parser for a procedure body: the script line of the statement and the column
        (
            "CREATE TABLE {p}t (x BIGINT);\nCREATE STREAM {p}s (x BIGINT);\n"
            "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN\n  INSERT INTO {p}t SELEC x FROM {p}s;\nEND;",
            ["{p}p", "line 4", "column"],
        ),
    ],
)
def test_deploy_syntax_error_carries_the_position_and_deploys_nothing(stub, script, parts):
    p = unique("syn")
    before = catalog_names(stub)
    err = rpc_error(stub.Deploy, pb.DeployRequest(sql=script.format(p=p)))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), *(part.format(p=p) for part in parts))
    assert catalog_names(stub) == before


def bad_utf8(message: Any, text: str) -> bytes:
    """The message's bytes with `text` (3 bytes, in a string field) replaced by invalid UTF-8."""
    raw = message.SerializeToString()
    assert raw.count(text.encode()) == 1
    return raw.replace(text.encode(), b"\xff\xfe\xfd")


def test_a_request_with_invalid_utf8_is_invalid_argument_on_every_kind_of_call(srv, stub, sink):
    raw = {"request_serializer": None, "response_deserializer": None}
    with grpc.insecure_channel(srv.target) as ch:
        for method, message in [
            ("Deploy", pb.DeployRequest(sql="CREATE TABLE Zq9 (x INT);")),
            ("Push", pb.PushRequest(stream="Zq9", producer_id="p", batch_id=1, data=arrow(good_row()))),
            ("Query", pb.QueryRequest(sql="SELECT 'Zq9'")),
            ("Subscribe", pb.SubscribeRequest(stream="Zq9")),
        ]:
            call = (ch.unary_stream if method == "Subscribe" else ch.unary_unary)(
                f"/streamtx.v1.StreamTx/{method}", **raw
            )
            with pytest.raises(grpc.RpcError) as info:
                result = call(bad_utf8(message, "Zq9"), timeout=CALL_TIMEOUT)
                list(result) if method == "Subscribe" else result
            assert info.value.code() == SC.INVALID_ARGUMENT, (method, info.value)
            assert_mentions(info.value.details(), "cannot decode the request", "UTF-8", message.DESCRIPTOR.full_name)
        # PushStream: the message before the bad one is acknowledged, then the stream ends INVALID_ARGUMENT
        stream = ch.stream_stream("/streamtx.v1.StreamTx/PushStream", **raw)
        good = pb.PushRequest(stream=sink.stream, producer_id="utf8", batch_id=1, data=arrow(good_row(7)))
        bad = pb.PushRequest(stream=sink.stream, producer_id="Zq9", batch_id=1, data=arrow(good_row(8)))
        acks = []
        with pytest.raises(grpc.RpcError) as info:
            for reply in stream(iter([good.SerializeToString(), bad_utf8(bad, "Zq9")]), timeout=CALL_TIMEOUT):
                acks.append(pb.PushAck.FromString(reply))
        assert info.value.code() == SC.INVALID_ARGUMENT and "UTF-8" in info.value.details()
    assert [a.outcome for a in acks] in ([pb.COMMITTED], [])  # the good one's ack may be cut by the abort
    assert sink.rows() == [(7, "x", 0.5)]
    assert "zq9" not in {n.lower() for n in catalog_names(stub)}


def test_sql_longer_than_the_limit_is_invalid_argument_and_changes_nothing(stub):
    """A 300,000-element IN list took a minute to deploy, the front busy all along: SQL text is bounded."""
    p = unique("long")
    before = catalog_names(stub)
    values = ", ".join(str(i) for i in range(60_000))  # ~400 KB
    script = (
        f"CREATE TABLE {p}t (x BIGINT); CREATE PROCEDURE {p}p AS BEGIN SELECT x FROM {p}t WHERE x IN ({values}); END;"
    )
    err = rpc_error(stub.Deploy, pb.DeployRequest(sql=script))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), "deploy:", f"{len(script):,} bytes of SQL; at most 262,144")
    assert catalog_names(stub) == before
    err = rpc_error(stub.Query, pb.QueryRequest(sql=f"SELECT 1 WHERE 1 IN ({values})"))
    assert err.code() == SC.INVALID_ARGUMENT and "query:" in err.details() and "at most 262,144" in err.details()
    deploy(stub, script.replace(values, ", ".join(str(i) for i in range(5_000))))  # ~30 KB deploys


def nested(depth: int) -> str:
    return "(" * depth + "1" + ")" * depth


@pytest.mark.parametrize("depth", [50, 200, 256])
def test_deeply_nested_sql_deploys_and_queries(stub, depth):
    """Generated SQL nests deep: 50 levels answered INTERNAL (RecursionError); up to 256 compile and run."""
    p = unique("deep")
    deploy(
        stub,
        f"CREATE TABLE {p}t (x BIGINT); CREATE PROCEDURE {p}p AS BEGIN INSERT INTO {p}t SELECT {nested(depth)}; END;",
    )
    stub.Call(pb.CallRequest(procedure=f"{p}p"), timeout=CALL_TIMEOUT)
    reply = stub.Query(pb.QueryRequest(sql=f"SELECT x + {nested(depth)} FROM {p}t"), timeout=CALL_TIMEOUT)
    assert reply.result.arrow_ipc


def test_sql_nested_past_the_limit_is_invalid_argument_and_changes_nothing(stub):
    p = unique("deeper")
    before = catalog_names(stub)
    script = f"CREATE TABLE {p}t (x BIGINT);\nCREATE PROCEDURE {p}p AS BEGIN SELECT {nested(257)}; END;"
    err = rpc_error(stub.Deploy, pb.DeployRequest(sql=script))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), f"{p}p", "parentheses nest 257 levels deep; at most 256")
    assert catalog_names(stub) == before
    err = rpc_error(stub.Query, pb.QueryRequest(sql=f"SELECT {nested(5000)}"))
    assert err.code() == SC.INVALID_ARGUMENT and "depth" in err.details()  # DuckDB's parser: 1,000 levels
    # parentheses inside literals and comments do not count
    deploy(
        stub,
        f"CREATE TABLE {p}u (s VARCHAR); CREATE PROCEDURE {p}q AS BEGIN "
        f"INSERT INTO {p}u SELECT '{'(' * 300}'; -- {'(' * 300}\nEND;",
    )


@pytest.fixture(scope="module")
def base(stub) -> dict[str, Any]:
    """Objects every deploy-error case refers to: a table, a stream with a procedure, a window."""
    b = unique("base")
    deploy(
        stub,
        f"CREATE TABLE {b}_t (a BIGINT, b VARCHAR);\n"
        f"CREATE STREAM {b}_s (a BIGINT, b VARCHAR);\n"
        f"CREATE PROCEDURE {b}_p ON STREAM {b}_s AS BEGIN INSERT INTO {b}_t SELECT a, b FROM {b}_s; END;\n"
        f"CREATE STREAM {b}_ws (x INTEGER);\n"
        f"CREATE TABLE {b}_wt (n BIGINT);\n"
        f"CREATE WINDOW {b}_w ON {b}_ws ROWS 4 SLIDE 2;\n"
        f"CREATE PROCEDURE {b}_wp ON STREAM {b}_ws AS BEGIN INSERT INTO {b}_wt SELECT count(*) FROM {b}_w; END;",
    )
    ack = push(stub, f"{b}_s", 1, arrow(pa.table({"a": [1], "b": ["one"]})), producer="base")
    assert ack.outcome == pb.COMMITTED, ack
    return {"b": b, "batches": 1}


DEPLOY_ERRORS = {
    "unknown-table": (
        "CREATE STREAM {p}s (a BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN INSERT INTO {p}nosuch SELECT a FROM {p}s; END;",
        ["{p}p", "{p}nosuch"],
    ),
    "unknown-table-in-select": (
        "CREATE TABLE {p}t (a BIGINT);\nCREATE STREAM {p}s (a BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN\n"
        "  INSERT INTO {p}t SELECT a FROM {p}s WHERE a IN (SELECT a FROM {p}nosuch);\nEND;",
        ["{p}p", "{p}nosuch"],
    ),
    "unknown-column": (
        "CREATE TABLE {p}t (a BIGINT);\nCREATE STREAM {p}s (a BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN INSERT INTO {p}t SELECT nocol FROM {p}s; END;",
        ["{p}p", "nocol"],
    ),
    "unknown-target-column": (
        "CREATE TABLE {p}t (a BIGINT);\nCREATE STREAM {p}s (a BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN INSERT INTO {p}t (a, nocol) SELECT a, a FROM {p}s; END;",
        ["{p}p", "nocol"],
    ),
    "unknown-stream-column-in-emit": (
        "CREATE STREAM {p}s (a BIGINT);\nCREATE STREAM {p}o (a BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN INSERT INTO {p}o (a, zz) SELECT a, a FROM {p}s; END;",
        ["{p}p", "{p}o", "zz"],
    ),
    "unknown-parameter": (
        "CREATE TABLE {p}t (a BIGINT);\nCREATE PROCEDURE {p}p (x BIGINT) AS BEGIN INSERT INTO {p}t VALUES ($y); END;",
        ["{p}p", "$y"],
    ),
    "type-mismatch": (
        "CREATE TABLE {p}t (a BIGINT);\nCREATE STREAM {p}s (a BIGINT, b VARCHAR);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN INSERT INTO {p}t SELECT a + b FROM {p}s; END;",
        ["{p}p", "VARCHAR"],
    ),
    "wrong-value-count": (
        "CREATE TABLE {p}t (a BIGINT);\nCREATE STREAM {p}s (a BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN INSERT INTO {p}t SELECT a, a FROM {p}s; END;",
        ["{p}p", "{p}t"],
    ),
    "window-of-another-procedure": (
        "CREATE STREAM {p}s (x INTEGER);\nCREATE TABLE {p}t (n BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN INSERT INTO {p}t SELECT count(*) FROM {b}_w; END;",
        ["{p}p", "{b}_w", "{b}_wp"],
    ),
    "window-with-two-owners": (
        "CREATE TABLE {p}t (n BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {b}_ws AS BEGIN INSERT INTO {p}t SELECT sum(x) FROM {b}_w; END;",
        ["{b}_w", "{p}p", "{b}_wp"],
    ),
    "insert-into-window": (
        "CREATE PROCEDURE {p}p AS BEGIN INSERT INTO {b}_w VALUES (1); END;",
        ["{p}p", "{b}_w"],
    ),
    "reads-stream-that-is-not-its-input": (
        "CREATE STREAM {p}s (a BIGINT);\nCREATE TABLE {p}t (a BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN INSERT INTO {p}t SELECT a FROM {b}_s; END;",
        ["{p}p", "{b}_s", "{p}s"],
    ),
    "oltp-procedure-reads-a-stream": (
        "CREATE TABLE {p}t (a BIGINT);\nCREATE PROCEDURE {p}p AS BEGIN INSERT INTO {p}t SELECT a FROM {b}_s; END;",
        ["{p}p", "{b}_s"],
    ),
    "writes-a-stream-with-delete": (
        "CREATE STREAM {p}s (a BIGINT);\nCREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN DELETE FROM {p}s; END;",
        ["{p}p", "{p}s"],
    ),
    "procedure-on-unknown-stream": (
        "CREATE TABLE {p}t (a BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}nosuch AS BEGIN INSERT INTO {p}t VALUES (1); END;",
        ["{p}p", "{p}nosuch"],
    ),
    "window-on-unknown-stream": ("CREATE WINDOW {p}w ON {p}nosuch ROWS 4 SLIDE 2;", ["{p}w", "{p}nosuch"]),
    "system-column-on-a-stream": ("CREATE STREAM {p}s (a BIGINT, __TS BIGINT);", ["{p}s", "'__ts' is reserved"]),
    "cycle": (
        "CREATE STREAM {p}s1 (a BIGINT);\nCREATE STREAM {p}s2 (a BIGINT);\n"
        "CREATE PROCEDURE {p}p1 ON STREAM {p}s1 AS BEGIN INSERT INTO {p}s2 SELECT a FROM {p}s1; END;\n"
        "CREATE PROCEDURE {p}p2 ON STREAM {p}s2 AS BEGIN INSERT INTO {p}s1 SELECT a FROM {p}s2; END;",
        ["cycle", "{p}p1", "{p}p2", "{p}s1", "{p}s2"],
    ),
    "self-loop": (
        "CREATE STREAM {p}s (a BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}s AS BEGIN INSERT INTO {p}s SELECT a + 1 FROM {p}s; END;",
        ["cycle", "{p}p", "{p}s"],
    ),
    "bad-table-in-the-middle": (
        "CREATE TABLE {p}a (x INT);\nCREATE STREAM {p}b (x INT);\n"
        "CREATE TABLE {p}c (x INT NOT NUL);\nCREATE TABLE {p}d (x INT);",
        ["{p}c"],
    ),
    "unsupported-statement-in-the-middle": (
        "CREATE TABLE {p}a (x INT);\nCREATE TABEL {p}b (x INT);\nCREATE TABLE {p}c (x INT);",
        ["line 2", "TABEL"],
    ),
    "bad-procedure-in-the-middle": (
        "CREATE TABLE {p}a (x BIGINT);\nCREATE STREAM {p}b (x BIGINT);\n"
        "CREATE PROCEDURE {p}p ON STREAM {p}b AS BEGIN INSERT INTO {p}a SELECT y FROM {p}b; END;\n"
        "CREATE TABLE {p}d (x INT);",
        ["{p}p", "y"],
    ),
    "duplicate-name-in-the-middle": (
        "CREATE TABLE {p}a (x INT);\nCREATE STREAM {p}a (x INT);\nCREATE TABLE {p}c (x INT);",
        ["line 2", "{p}a", "exists"],
    ),
    "existing-name": (
        "CREATE TABLE {p}a (x INT);\nCREATE TABLE {b}_t (x INT);",
        ["line 2", "{b}_t", "exists"],
    ),
    "drop-of-a-used-stream": ("CREATE TABLE {p}a (x INT);\nDROP STREAM {b}_s;", ["{b}_s", "{b}_p"]),
    "drop-then-fail": (
        "DROP TABLE {b}_t;\nDROP PROCEDURE {b}_p;\nCREATE TABLE {p}x (a INT NOT NUL);",
        ["{p}x"],
    ),
    "drop-then-analysis-fails": (
        "DROP PROCEDURE {b}_p;\nDROP TABLE {b}_t;\nCREATE TABLE {p}x (a BIGINT);\n"
        "CREATE PROCEDURE {p}q AS BEGIN INSERT INTO {p}x SELECT a FROM {p}nosuch; END;",
        ["{p}q", "{p}nosuch"],
    ),
    "drop-of-a-used-table": ("DROP TABLE {b}_t;", ["{b}_t"]),
    "drop-of-nothing": ("CREATE TABLE {p}a (x INT);\nDROP TABLE {p}nosuch;", ["line 2", "{p}nosuch"]),
    "empty-script": ("  -- nothing here\n", ["no statement"]),
}


@pytest.mark.parametrize("case", list(DEPLOY_ERRORS))
def test_deploy_error_names_the_problem_and_deploys_nothing(stub, base, case):
    b = base["b"]
    p = unique("d")
    script, parts = DEPLOY_ERRORS[case]
    before = catalog_names(stub)
    data_before = rows(stub, f"{b}_t")
    err = rpc_error(stub.Deploy, pb.DeployRequest(sql=script.format(p=p, b=b)))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), *(part.format(p=p, b=b) for part in parts))
    after = catalog_names(stub)
    assert after == before
    assert not any(name.startswith(p) for name in after)
    # what was there still works, with its data
    assert rows(stub, f"{b}_t") == data_before
    batch = base["batches"] + 1
    ack = push(stub, f"{b}_s", batch, arrow(pa.table({"a": [batch], "b": [case]})), producer="base")
    assert ack.outcome == pb.COMMITTED, ack
    base["batches"] = batch
    assert rows(stub, f"{b}_t")[-1] == (batch, case)


def test_deploy_accepts_parameter_insert_into_primary_key(stub):
    """Deploy validation binds statements; it must not run them with NULL parameters."""
    name = unique("pk")
    deploy(
        stub,
        f"CREATE TABLE {name} (k VARCHAR PRIMARY KEY, v BIGINT);\n"
        f"CREATE PROCEDURE {name}_put (k VARCHAR, v BIGINT) AS BEGIN INSERT INTO {name} VALUES ($k, $v); END;",
    )
    call(stub, f"{name}_put", k="a", v=1)
    assert query(stub, f"SELECT * FROM {name}").to_pydict() == {"k": ["a"], "v": [1]}


def test_deploy_accepts_abort_guard_that_is_true_on_empty_tables(stub):
    """Deploy validation binds statements; it must not run them on the empty schema."""
    name = unique("guard")
    deploy(
        stub,
        f"CREATE TABLE {name}_c (id INTEGER);\nCREATE TABLE {name}_v (id INTEGER);\n"
        f"CREATE STREAM {name}_s (id INTEGER);\n"
        f"CREATE PROCEDURE {name}_p ON STREAM {name}_s AS BEGIN\n"
        f"  SELECT error('no contestants yet') WHERE NOT EXISTS (SELECT 1 FROM {name}_c);\n"
        f"  INSERT INTO {name}_v SELECT id FROM {name}_s;\n"
        "END;",
    )
    ack = push(stub, f"{name}_s", 1, arrow(pa.table({"id": pa.array([1], pa.int32())})))
    assert ack.outcome == pb.REJECTED and "no contestants yet" in ack.reason


def test_deploy_rejects_insert_of_date_column_into_bigint_column(stub):
    name = unique("tm")
    script = (
        f"CREATE TABLE {name}_t (b BIGINT);\nCREATE STREAM {name}_s (d DATE);\n"
        f"CREATE PROCEDURE {name}_p ON STREAM {name}_s AS BEGIN INSERT INTO {name}_t SELECT d FROM {name}_s; END;"
    )
    err = rpc_error(stub.Deploy, pb.DeployRequest(sql=script))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), f"{name}_p")


def test_deploy_rejects_bigint_parameter_into_date_column(stub):
    name = unique("tm")
    script = (
        f"CREATE TABLE {name}_t (d DATE);\n"
        f"CREATE PROCEDURE {name}_p (x BIGINT) AS BEGIN INSERT INTO {name}_t VALUES ($x); END;"
    )
    err = rpc_error(stub.Deploy, pb.DeployRequest(sql=script))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), f"{name}_p")


# --------------------------------------------------------------------------- token


def test_admin_token(tmp_path):
    with EmbeddedServer(tmp_path / "data", token="s3cret") as srv, grpc.insecure_channel(srv.target) as ch:
        stub = pb_grpc.StreamTxStub(ch)
        admin = (("authorization", "Bearer s3cret"),)
        script = (
            "CREATE TABLE tok_t (a BIGINT);\nCREATE STREAM tok_s (a BIGINT);\n"
            "CREATE PROCEDURE tok_p ON STREAM tok_s AS BEGIN INSERT INTO tok_t SELECT a FROM tok_s; END;"
        )
        for metadata, why in [
            (None, "no token"),
            ((("authorization", "Bearer wrong"),), "wrong token"),
            ((("authorization", "s3cret"),), "wrong token"),
            ((("authorization", "Basic s3cret"),), "wrong token"),
            ((("x-token", "Bearer s3cret"),), "no token"),
        ]:
            err = rpc_error(stub.Deploy, pb.DeployRequest(sql=script), metadata=metadata)
            assert err.code() == SC.UNAUTHENTICATED, metadata
            assert_mentions(err.details(), "Deploy", "token", why)
            assert "s3cret" not in err.details()
            assert not stub.Status(pb.StatusRequest(), timeout=CALL_TIMEOUT, metadata=admin).tables
        resp = deploy(stub, script, metadata=admin)
        assert {(o.kind, o.name) for o in resp.created} == {
            ("table", "tok_t"),
            ("stream", "tok_s"),
            ("procedure", "tok_p"),
        }
        # with a token set, every verb needs one (tests/contract/test_security.py has the roles)
        for fn, request in [
            (stub.Push, pb.PushRequest(stream="tok_s", producer_id="prod", batch_id=1)),
            (stub.Query, pb.QueryRequest(sql="SELECT a FROM tok_t")),
            (stub.Status, pb.StatusRequest()),
        ]:
            err = rpc_error(fn, request)
            assert err.code() == SC.UNAUTHENTICATED and "no token given" in err.details(), err
        request = pb.PushRequest(stream="tok_s", producer_id="prod", batch_id=1, data=arrow(pa.table({"a": [5]})))
        assert stub.Push(request, timeout=CALL_TIMEOUT, metadata=admin).outcome == pb.COMMITTED
        result = stub.Query(pb.QueryRequest(sql="SELECT a FROM tok_t"), timeout=CALL_TIMEOUT, metadata=admin)
        assert pa.ipc.open_stream(result.result.arrow_ipc).read_all().to_pydict() == {"a": [5]}
        acks = list(
            stub.PushStream(
                iter(
                    [pb.PushRequest(stream="tok_s", producer_id="prod", batch_id=2, data=arrow(pa.table({"a": [6]})))]
                ),
                timeout=CALL_TIMEOUT,
                metadata=admin,
            )
        )
        assert [a.outcome for a in acks] == [pb.COMMITTED]


# --------------------------------------------------------------------------- procedure aborts


@pytest.fixture
def voter(stub) -> str:
    """Votes for known contestants only: a batch with an unknown contestant aborts as a whole."""
    v = unique("voter")
    deploy(
        stub,
        f"CREATE TABLE {v}_contestants (id INTEGER, name VARCHAR);\n"
        f"CREATE TABLE {v}_votes (phone BIGINT, contestant INTEGER);\n"
        f"CREATE STREAM {v}_in (phone BIGINT, contestant INTEGER);\n"
        f"CREATE PROCEDURE {v}_vote ON STREAM {v}_in AS BEGIN\n"
        f"  INSERT INTO {v}_votes SELECT phone, contestant FROM {v}_in;\n"
        f"  SELECT error('no such contestant') FROM {v}_in\n"
        f"    WHERE contestant NOT IN (SELECT id FROM {v}_contestants);\n"
        "END;\n"
        f"CREATE PROCEDURE {v}_add (id INTEGER, name VARCHAR) AS BEGIN\n"
        f"  INSERT INTO {v}_contestants VALUES ($id, $name);\n"
        "END;",
    )
    call(stub, f"{v}_add", id=1, name="Ann")
    call(stub, f"{v}_add", id=2, name="Bob")
    return v


def votes(phone_contestant: list[tuple[int, int]]) -> pb.RowData:
    return pbrows(["phone", "contestant"], [list(pc) for pc in phone_contestant])


def test_procedure_abort_rejects_the_batch_and_a_resend_is_a_duplicate(stub, voter):
    v = voter
    ok = push(stub, f"{v}_in", 1, votes([(100, 1), (101, 2)]))
    assert ok.outcome == pb.COMMITTED, ok
    bad = push(stub, f"{v}_in", 2, votes([(102, 1), (103, 9), (104, 2)]))
    assert bad.outcome == pb.REJECTED, bad
    assert bad.code == SC.ABORTED.value[0]
    assert_mentions(bad.reason, "no such contestant")
    assert bad.timestamp > ok.timestamp
    # nothing of batch 2 is applied, not even the rows inserted before error()
    assert rows(stub, f"{v}_votes", order="phone") == [(100, 1), (101, 2)]
    again = push(stub, f"{v}_in", 2, votes([(102, 1), (103, 9), (104, 2)]))
    assert again.outcome == pb.DUPLICATE, again
    assert again.original == pb.REJECTED
    assert again.code == SC.ABORTED.value[0]
    assert_mentions(again.reason, "no such contestant")
    assert again.timestamp == bad.timestamp
    # a re-send with other rows is still batch 2: a duplicate, not applied
    fixed = push(stub, f"{v}_in", 2, votes([(102, 1)]))
    assert fixed.outcome == pb.DUPLICATE and fixed.original == pb.REJECTED
    assert rows(stub, f"{v}_votes", order="phone") == [(100, 1), (101, 2)]
    nxt = push(stub, f"{v}_in", 3, votes([(105, 2)]))
    assert nxt.outcome == pb.COMMITTED, nxt
    dup = push(stub, f"{v}_in", 1, votes([(100, 1), (101, 2)]))
    assert dup.outcome == pb.DUPLICATE and dup.original == pb.COMMITTED
    assert rows(stub, f"{v}_votes", order="phone") == [(100, 1), (101, 2), (105, 2)]


# --------------------------------------------------------------------------- PushStream


def stream_requests(stream: str, producer: str, datas: list[pb.RowData]) -> list[pb.PushRequest]:
    return [
        pb.PushRequest(stream=stream, producer_id=producer, batch_id=i, data=d) for i, d in enumerate(datas, start=1)
    ]


def test_push_stream_procedure_abort_in_the_middle(stub, voter):
    v = voter
    datas = [votes([(200 + i, 1 + i % 2)]) for i in range(6)]
    datas[2] = votes([(202, 1), (299, 7)])
    acks = list(stub.PushStream(iter(stream_requests(f"{v}_in", "pipe", datas)), timeout=CALL_TIMEOUT))
    assert [a.batch_id for a in acks] == [1, 2, 3, 4, 5, 6]
    assert [a.outcome for a in acks] == [pb.COMMITTED, pb.COMMITTED, pb.REJECTED] + [pb.COMMITTED] * 3
    assert acks[2].code == SC.ABORTED.value[0]
    assert_mentions(acks[2].reason, "no such contestant")
    assert rows(stub, f"{v}_votes", order="phone") == [(200 + i, 1 + i % 2) for i in (0, 1, 3, 4, 5)]


@pytest.mark.parametrize(
    "bad",
    [
        pb.RowData(arrow_ipc=b"garbage, not Arrow"),
        pbrows(["phone", "contestant"], [[1, "one"]]),
    ],
    ids=["malformed-arrow", "ill-typed-rows"],
)
def test_push_stream_invalid_batch_in_the_middle_is_rejected(limits_stub, bad):
    """The bad batch gets REJECTED with code and reason; the batches before it commit."""
    v = unique("pipe")
    deploy(
        limits_stub,
        f"CREATE TABLE {v}_t (phone BIGINT, contestant INTEGER);\n"
        f"CREATE STREAM {v}_in (phone BIGINT, contestant INTEGER);\n"
        f"CREATE PROCEDURE {v}_p ON STREAM {v}_in AS BEGIN INSERT INTO {v}_t SELECT * FROM {v}_in; END;",
    )
    datas = [votes([(i, 1)]) for i in range(1, 6)]
    datas[2] = bad
    acks = list(limits_stub.PushStream(iter(stream_requests(f"{v}_in", "pipe", datas)), timeout=CALL_TIMEOUT))
    assert [a.batch_id for a in acks] == [1, 2, 3, 4, 5]
    assert acks[0].outcome == acks[1].outcome == pb.COMMITTED
    assert acks[2].outcome == pb.REJECTED
    assert acks[2].code == SC.INVALID_ARGUMENT.value[0]
    assert_mentions(acks[2].reason, f"{v}_in", "batch 3")
    assert rows(limits_stub, f"{v}_t", order="phone")[:2] == [(1, 1), (2, 1)]


@pytest.mark.parametrize(
    "bad",
    [
        pb.RowData(arrow_ipc=b"garbage, not Arrow"),
        pbrows(["phone", "contestant"], [[1, "one"]]),
    ],
    ids=["malformed-arrow", "ill-typed-rows"],
)
def test_push_stream_batches_after_an_invalid_batch_commit(limits_stub, bad):
    v = unique("pipe")
    deploy(
        limits_stub,
        f"CREATE TABLE {v}_t (phone BIGINT, contestant INTEGER);\n"
        f"CREATE STREAM {v}_in (phone BIGINT, contestant INTEGER);\n"
        f"CREATE PROCEDURE {v}_p ON STREAM {v}_in AS BEGIN INSERT INTO {v}_t SELECT * FROM {v}_in; END;",
    )
    datas = [votes([(i, 1)]) for i in range(1, 6)]
    datas[2] = bad
    acks = list(limits_stub.PushStream(iter(stream_requests(f"{v}_in", "pipe", datas)), timeout=CALL_TIMEOUT))
    assert [a.outcome for a in acks] == [
        pb.COMMITTED,
        pb.COMMITTED,
        pb.REJECTED,
        pb.COMMITTED,
        pb.COMMITTED,
    ], [(a.batch_id, a.code, a.reason) for a in acks]
    assert rows(limits_stub, f"{v}_t", order="phone") == [(1, 1), (2, 1), (4, 1), (5, 1)]


def test_push_stream_addressing_errors_are_acked_not_fatal(stub, sink):
    reqs = [
        pb.PushRequest(stream=sink.stream, producer_id="ps", batch_id=1, data=arrow(good_row(1))),
        pb.PushRequest(stream="no_such_stream", producer_id="ps", batch_id=1, data=arrow(good_row(2))),
        pb.PushRequest(stream=sink.stream, producer_id="", batch_id=1, data=arrow(good_row(3))),
        pb.PushRequest(stream=sink.stream, producer_id="ps", batch_id=0, data=arrow(good_row(4))),
        pb.PushRequest(stream=sink.stream, producer_id="ps", batch_id=2, data=arrow(good_row(5))),
    ]
    acks = list(stub.PushStream(iter(reqs), timeout=CALL_TIMEOUT))
    assert [(a.stream, a.batch_id, a.outcome) for a in acks] == [
        (sink.stream, 1, pb.COMMITTED),
        ("no_such_stream", 1, pb.REJECTED),
        (sink.stream, 1, pb.REJECTED),
        (sink.stream, 0, pb.REJECTED),
        (sink.stream, 2, pb.COMMITTED),
    ]
    assert [a.code for a in acks[1:4]] == [SC.NOT_FOUND.value[0]] + [SC.INVALID_ARGUMENT.value[0]] * 2
    assert_mentions(acks[1].reason, "no_such_stream")
    assert_mentions(acks[2].reason, "producer_id")
    assert_mentions(acks[3].reason, "batch_id")
    assert [r[0] for r in sink.rows()] == [1, 5]


# --------------------------------------------------------------------------- limits on names, parameters, statements


def test_names_longer_than_256_bytes_are_invalid_argument_wherever_they_appear(stub):
    sink = Sink(stub)
    before = catalog_names(stub)
    long = "n" * 300
    cases = [
        (stub.Push, pb.PushRequest(stream=long, producer_id="p", batch_id=1, data=arrow(pa.table({"a": [1]})))),
        (stub.Push, pb.PushRequest(stream=sink.stream, producer_id="é" * 200, batch_id=1)),
        (stub.Call, pb.CallRequest(procedure=long)),
        (stub.Call, pb.CallRequest(procedure=sink.proc, params={long: py_to_value(1)})),
        (stub.DescribeStream, pb.DescribeStreamRequest(stream=long)),
    ]
    for fn, request in cases:
        err = rpc_error(fn, request)
        assert err.code() == SC.INVALID_ARGUMENT, err.details()
        assert_mentions(err.details(), "bytes long; names are at most 256 bytes")
    err = rpc_error(stub.Deploy, pb.DeployRequest(sql=f"CREATE TABLE {long} (a INT);"))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), "table", "300 bytes", "at most 256 bytes")
    assert catalog_names(stub) == before
    assert sink.rows() == []


def test_more_than_1000_parameters_or_statements_are_invalid_argument(stub):
    before = catalog_names(stub)
    params = {f"p{i}": py_to_value(i) for i in range(1001)}
    err = rpc_error(stub.Call, pb.CallRequest(procedure="anything", params=params))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), "1,001 parameters", "at most 1,000")
    err = rpc_error(stub.Query, pb.QueryRequest(sql="SELECT 1", params=params))
    assert err.code() == SC.INVALID_ARGUMENT
    name = unique("many")
    script = "\n".join(f"CREATE TABLE {name}_{i} (a INT);" for i in range(1001))
    err = rpc_error(stub.Deploy, pb.DeployRequest(sql=script))
    assert err.code() == SC.INVALID_ARGUMENT
    assert_mentions(err.details(), "1,001 statements", "at most 1,000")
    assert catalog_names(stub) == before
