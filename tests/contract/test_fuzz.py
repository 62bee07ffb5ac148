"""Fuzzing a live server: generated requests never get INTERNAL or UNKNOWN, never crash anything.

Hypothesis generates protobuf requests (random field values, Arrow tables of
random schemas and values, `Rows` of random values, deploy scripts from a
small SQL grammar, random text and bytes) and sends them to one real server
with 2 partitions. The properties: every answer is a precise status (not
INTERNAL, not UNKNOWN), a request the server refused changed nothing, and in
the end the server is SERVING, every worker is the one it started with (none
died), and its log holds no traceback. The number of examples is fixed so
that the suite stays fast; `FUZZ_EXAMPLES=N` in the environment runs more.
"""

from __future__ import annotations

import datetime
import decimal
import os
from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.processes import Launched

from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import table_to_ipc

pytestmark = pytest.mark.timeout(600)

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
TIMEOUT = 30.0
SC = grpc.StatusCode
BAD = {SC.INTERNAL, SC.UNKNOWN}

APP = """
CREATE TABLE fz_t (id BIGINT PRIMARY KEY, x DOUBLE, s VARCHAR, d DECIMAL(10,2), ts TIMESTAMP, ok BOOLEAN)
    PARTITION BY (id);
CREATE STREAM fz_s (id BIGINT, x DOUBLE, s VARCHAR, d DECIMAL(10,2), ts TIMESTAMP, ok BOOLEAN) PARTITION BY (id);
CREATE PROCEDURE fz_p ON STREAM fz_s AS BEGIN
    INSERT OR REPLACE INTO fz_t SELECT * FROM fz_s;
END;
CREATE PROCEDURE fz_put (id BIGINT, s VARCHAR) PARTITION ON id AS BEGIN
    INSERT OR REPLACE INTO fz_t (id, s) VALUES ($id, $s);
END;
"""

settings.register_profile(
    "fuzz",
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[Launched, pb_grpc.StreamTxStub, list[int]]]:
    # a batch id out of order waits --order-timeout for its predecessor: not long here
    srv = Launched(tmp_path_factory.mktemp("fuzz") / "data", partitions=2, extra=["--order-timeout", "0.2"])
    try:
        srv.stub.Deploy(pb.DeployRequest(sql=APP), timeout=TIMEOUT)
        pids = [p.pid for p in srv.stub.Status(pb.StatusRequest(), timeout=TIMEOUT).partitions]
        yield srv, srv.stub, pids
        health = health_pb2_grpc.HealthStub(srv.channel)
        check = health.Check(health_pb2.HealthCheckRequest(service="streamtx.v1.StreamTx"), timeout=TIMEOUT)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        status = srv.stub.Status(pb.StatusRequest(), timeout=TIMEOUT)
        assert [p.pid for p in status.partitions] == pids, "a worker died under fuzzing"
        assert status.counters.get("restarts", 0) == 0
        assert "Traceback" not in srv.stderr(), srv.stderr()[-4000:]
    finally:
        srv.close()


def status_of(call) -> SC:
    """The status a unary call ended with (OK if it returned)."""
    try:
        call()
    except grpc.RpcError as e:
        assert e.code() not in BAD, f"{e.code()}: {e.details()}"
        return e.code()
    return SC.OK


def fingerprint(stub: pb_grpc.StreamTxStub) -> tuple:
    """What a refused request must not change: the catalog and the rows of fz_t."""
    st_ = stub.Status(pb.StatusRequest(), timeout=TIMEOUT)
    rows = stub.Query(pb.QueryRequest(sql="SELECT * FROM fz_t ORDER BY id"), timeout=TIMEOUT)
    table = pa.ipc.open_stream(rows.result.arrow_ipc).read_all()
    return (tuple(st_.tables), tuple(st_.streams), tuple(st_.procedures), str(table.to_pylist()))


# --------------------------------------------------------------------------- strategies

names = st.sampled_from(["fz_s", "fz_t", "fz_p", "fz_put", "", "nope", "FZ_S", "fz_s ", "fz_s;--"]) | st.text(
    max_size=40
)
columns = st.sampled_from(["id", "x", "s", "d", "ts", "ok", "", "ID", "extra"]) | st.text(max_size=12)
ARROW_TYPES = [
    pa.int64(),
    pa.int32(),
    pa.int8(),
    pa.uint64(),
    pa.float64(),
    pa.float32(),
    pa.string(),
    pa.large_string(),
    pa.binary(),
    pa.bool_(),
    pa.decimal128(12, 3),
    pa.decimal128(38, 0),
    pa.timestamp("us"),
    pa.timestamp("ns", tz="UTC"),
    pa.date32(),
    pa.list_(pa.int64()),
    pa.null(),
]
values_of = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(allow_nan=True, allow_infinity=True),
    "text": st.text(max_size=20),
    "bool": st.booleans(),
    "bytes": st.binary(max_size=20),
    "decimal": st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**8), max_value=10**8),
    "time": st.datetimes(min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31)),
}


@st.composite
def arrow_tables(draw) -> pa.Table:
    n = draw(st.integers(0, 4))
    cols = draw(st.lists(columns, min_size=0, max_size=7))
    arrays = {}
    for name in cols:
        typ = draw(st.sampled_from(ARROW_TYPES))
        try:
            if pa.types.is_integer(typ):
                info = (-(2**63), 2**63 - 1) if typ == pa.int64() else None
                lo, hi = info or (0, 100)
                vals = draw(st.lists(st.none() | st.integers(lo, hi), min_size=n, max_size=n))
            elif pa.types.is_floating(typ):
                vals = draw(st.lists(st.none() | values_of["float"], min_size=n, max_size=n))
            elif pa.types.is_string(typ) or pa.types.is_large_string(typ):
                vals = draw(st.lists(st.none() | values_of["text"], min_size=n, max_size=n))
            elif pa.types.is_binary(typ):
                vals = draw(st.lists(st.none() | values_of["bytes"], min_size=n, max_size=n))
            elif pa.types.is_boolean(typ):
                vals = draw(st.lists(st.none() | values_of["bool"], min_size=n, max_size=n))
            elif pa.types.is_decimal(typ):
                vals = draw(
                    st.lists(
                        st.none() | st.decimals(places=0, min_value=-(10**9), max_value=10**9), min_size=n, max_size=n
                    )
                )
            elif pa.types.is_timestamp(typ) or pa.types.is_date(typ):
                vals = draw(st.lists(st.none() | values_of["time"], min_size=n, max_size=n))
                if pa.types.is_date(typ):
                    vals = [v.date() if v else v for v in vals]
            elif pa.types.is_list(typ):
                vals = draw(st.lists(st.none() | st.lists(st.integers(-5, 5), max_size=3), min_size=n, max_size=n))
            else:
                vals = [None] * n
            arrays[name] = pa.array(vals, typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, decimal.InvalidOperation):
            continue
    if not arrays:
        return pa.table({"id": pa.array(range(n), pa.int64())})
    try:
        return pa.table(arrays)
    except (pa.ArrowInvalid, ValueError):
        return pa.table({"id": pa.array(range(n), pa.int64())})


proto_values = st.deferred(
    lambda: (
        st.builds(pb.Value)
        | st.builds(lambda v: pb.Value(int_value=v), values_of["int"])
        | st.builds(lambda v: pb.Value(double_value=v), values_of["float"])
        | st.builds(
            lambda v: pb.Value(string_value=v),
            values_of["text"] | st.sampled_from(["2024-01-02 03:04:05", "1.25", "x"]),
        )
        | st.builds(lambda v: pb.Value(bool_value=v), values_of["bool"])
        | st.builds(lambda v: pb.Value(bytes_value=v), values_of["bytes"])
        | st.builds(lambda vs: pb.Value(list_value=pb.ValueList(values=vs)), st.lists(proto_values, max_size=2))
    )
)


@st.composite
def row_data(draw) -> pb.RowData:
    kind = draw(st.sampled_from(["arrow", "rows", "bytes", "empty"]))
    if kind == "arrow":
        return pb.RowData(arrow_ipc=table_to_ipc(draw(arrow_tables())))
    if kind == "bytes":
        return pb.RowData(arrow_ipc=draw(st.binary(max_size=200)))
    if kind == "empty":
        return pb.RowData()
    cols = draw(st.lists(columns, max_size=7))
    width = len(cols) if cols else draw(st.integers(0, 7))
    rows = draw(st.lists(st.lists(proto_values, min_size=width, max_size=width + draw(st.integers(0, 1))), max_size=3))
    return pb.RowData(rows=pb.Rows(columns=cols, rows=[pb.Row(values=r) for r in rows]))


push_requests = st.builds(
    pb.PushRequest,
    stream=st.sampled_from(["fz_s"]) | names,
    producer_id=st.sampled_from(["fz-a", "fz-b"]) | st.text(max_size=10),
    batch_id=st.integers(1, 40) | st.integers(-(2**63), 2**63 - 1),
    data=row_data(),
    batch_rows=st.lists(st.integers(-2, 3), max_size=3),
)

SQL_TYPES = ["BIGINT", "INTEGER", "DOUBLE", "VARCHAR", "DECIMAL(10,2)", "TIMESTAMP", "BOOLEAN", "BLOB", "FOO", "INT[]"]


@st.composite
def deploy_scripts(draw) -> str:
    """Statements from a small grammar, with random words and truncation mixed in."""
    statements = []
    for _ in range(draw(st.integers(1, 3))):
        name = "fzd_" + draw(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True))
        cols = ", ".join(
            f"{draw(st.sampled_from(['a', 'b', 'c', 'id', 'select']))} {draw(st.sampled_from(SQL_TYPES))}"
            for _ in range(draw(st.integers(0, 3)))
        )
        kind = draw(st.sampled_from(["table", "stream", "window", "procedure", "drop", "noise"]))
        if kind == "table":
            statements.append(f"CREATE TABLE {name} ({cols})")
        elif kind == "stream":
            part = draw(st.sampled_from(["", " PARTITION BY (a)", " PARTITION BY (zz)"]))
            statements.append(f"CREATE STREAM {name} ({cols}){part}")
        elif kind == "window":
            rows, slide = draw(st.integers(-1, 5)), draw(st.integers(-1, 5))
            statements.append(f"CREATE WINDOW {name} ON {draw(names)} ROWS {rows} SLIDE {slide}")
        elif kind == "procedure":
            body = draw(
                st.sampled_from(
                    [
                        "SELECT 1",
                        "INSERT INTO fz_t SELECT * FROM fz_s",
                        "INSERT INTO nope VALUES (1)",
                        "SELECT $x",
                        "DELETE FROM fz_t",
                        "SELECT (((((1)))))",
                        "COPY fz_t TO '/tmp/x'",
                    ]
                )
            )
            on = draw(st.sampled_from(["", " ON STREAM fz_s", " ON STREAM nope", " ON STREAM fz_s FOR EACH ROW"]))
            statements.append(f"CREATE PROCEDURE {name}{on} AS BEGIN {body}; END")
        elif kind == "drop":
            statements.append(f"DROP {draw(st.sampled_from(['TABLE', 'STREAM', 'PROCEDURE', 'WINDOW']))} {name}")
        else:
            statements.append(draw(st.text(max_size=30)))
    script = ";\n".join(statements) + ";"
    cut = draw(st.integers(0, len(script)))
    return script if draw(st.booleans()) else script[:cut]


call_requests = st.builds(
    pb.CallRequest,
    procedure=st.sampled_from(["fz_put", "fz_p"]) | names,
    params=st.dictionaries(st.sampled_from(["id", "s", "x", ""]) | st.text(max_size=5), proto_values, max_size=3),
)

query_texts = st.sampled_from(
    [
        "SELECT * FROM fz_t",
        "SELECT count(*) FROM fz_t WHERE id > $p",
        "SELECT * FROM nope",
        "DELETE FROM fz_t",
        "SELECT read_text('/etc/passwd')",
        "SELECT 1; SELECT 2",
        "",
        "SELECT " + "(" * 300 + "1" + ")" * 300,
        "PRAGMA version",
    ]
) | st.text(max_size=60)


# --------------------------------------------------------------------------- properties


@settings(settings.get_profile("fuzz"))
@given(requests=st.lists(push_requests, min_size=1, max_size=4))
def test_fuzzed_pushes_get_precise_answers(server, requests):
    _, stub, _ = server
    for req in requests:
        before = fingerprint(stub)
        try:
            acks = list(stub.PushStream(iter([req]), timeout=TIMEOUT))
        except grpc.RpcError as e:
            assert e.code() not in BAD, f"{e.code()}: {e.details()}"
            acks = []
        for ack in acks:
            if ack.outcome == pb.REJECTED:
                assert ack.code not in (SC.INTERNAL.value[0], SC.UNKNOWN.value[0]), ack
        if not any(ack.outcome == pb.COMMITTED for ack in acks):
            assert fingerprint(stub) == before


@settings(settings.get_profile("fuzz"))
@given(script=deploy_scripts())
def test_fuzzed_deploys_get_precise_answers_and_a_refused_one_changes_nothing(server, script):
    _, stub, _ = server
    before = fingerprint(stub)
    code = status_of(lambda: stub.Deploy(pb.DeployRequest(sql=script), timeout=TIMEOUT))
    if code != SC.OK:
        assert fingerprint(stub) == before


@settings(settings.get_profile("fuzz"))
@given(req=call_requests)
def test_fuzzed_calls_get_precise_answers_and_a_refused_one_changes_nothing(server, req):
    _, stub, _ = server
    before = fingerprint(stub)
    if status_of(lambda: stub.Call(req, timeout=TIMEOUT)) != SC.OK:
        assert fingerprint(stub) == before


@settings(settings.get_profile("fuzz"))
@given(sql=query_texts, params=st.dictionaries(st.sampled_from(["p", "q"]), proto_values, max_size=2))
def test_fuzzed_queries_get_precise_answers_and_change_nothing(server, sql, params):
    _, stub, _ = server
    before = fingerprint(stub)
    status_of(lambda: stub.Query(pb.QueryRequest(sql=sql, params=params), timeout=TIMEOUT))
    assert fingerprint(stub) == before


METHODS = [
    "Push",
    "Deploy",
    "Call",
    "Query",
    "Status",
    "Checkpoint",
    "DescribeStream",
    "ReadStream",
    "Stage",
    "CommitStaged",
    "AbortStaged",
]


@settings(settings.get_profile("fuzz"))
@given(method=st.sampled_from(METHODS), body=st.binary(max_size=300))
def test_random_bytes_as_any_request_get_a_precise_status(server, method, body):
    srv, _, _ = server
    call = srv.channel.unary_unary(f"/streamtx.v1.StreamTx/{method}")  # bytes in, bytes out
    status_of(lambda: call(body, timeout=TIMEOUT))
