"""A client that knows nothing of streamtx but its address: gRPC server reflection only.

No generated streamtx stubs or messages are used here: the service and its
messages are discovered through the reflection service, messages are built
from the discovered descriptors, and methods are called by path. This is what
a client in another language, or grpcurl, does. The standard health service is
checked with its own (grpc_health) stubs.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from streamtx.server.embedded import EmbeddedServer

pytestmark = pytest.mark.timeout(120)

SERVICE = "streamtx.v1.StreamTx"
TIMEOUT = 20.0


@pytest.fixture(scope="module")
def channel(tmp_path_factory) -> Iterator[grpc.Channel]:
    with (
        EmbeddedServer(tmp_path_factory.mktemp("reflection") / "data") as srv,
        grpc.insecure_channel(srv.target) as ch,
    ):
        yield ch


class Reflected:
    """The StreamTx service as discovered by reflection: message classes and callables."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.db = ProtoReflectionDescriptorDatabase(channel)
        self.pool = descriptor_pool.DescriptorPool(self.db)
        self.service = self.pool.FindServiceByName(SERVICE)
        self.methods = {m.name: m for m in self.service.methods}
        self.channel = channel

    def message(self, full_name: str):
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full_name))

    def enum(self, full_name: str, value: str) -> int:
        return self.pool.FindEnumTypeByName(full_name).values_by_name[value].number

    def _types(self, method: str):
        m = self.methods[method]
        return (
            m,
            message_factory.GetMessageClass(m.input_type),
            message_factory.GetMessageClass(m.output_type),
        )

    def unary(self, method: str, **fields):
        m, req_cls, resp_cls = self._types(method)
        call = self.channel.unary_unary(
            f"/{self.service.full_name}/{m.name}",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        return call(req_cls(**fields), timeout=TIMEOUT)

    def bidi(self, method: str, requests: list[dict]):
        m, req_cls, resp_cls = self._types(method)
        call = self.channel.stream_stream(
            f"/{self.service.full_name}/{m.name}",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        return list(call(iter([req_cls(**r) for r in requests]), timeout=TIMEOUT))

    def value(self, v):
        """A streamtx.v1.Value built from the discovered descriptor."""
        value_cls = self.message("streamtx.v1.Value")
        if v is None:
            return value_cls()
        if isinstance(v, bool):
            return value_cls(bool_value=v)
        if isinstance(v, int):
            return value_cls(int_value=v)
        if isinstance(v, float):
            return value_cls(double_value=v)
        return value_cls(string_value=v)

    def rows(self, columns: list[str], values: list[list]):
        row_cls = self.message("streamtx.v1.Row")
        rows_cls = self.message("streamtx.v1.Rows")
        data_cls = self.message("streamtx.v1.RowData")
        rows = rows_cls(columns=columns, rows=[row_cls(values=[self.value(v) for v in r]) for r in values])
        return data_cls(rows=rows)


@pytest.fixture(scope="module")
def api(channel) -> Reflected:
    return Reflected(channel)


def test_reflection_lists_the_services(api):
    services = set(api.db.get_services())
    assert SERVICE in services
    assert "grpc.health.v1.Health" in services
    assert "grpc.reflection.v1alpha.ServerReflection" in services
    assert "grpc.reflection.v1.ServerReflection" in services


def test_reflection_v1_answers_as_current_tools_ask_it(channel):
    """grpcurl and buf curl ask `grpc.reflection.v1` first: list the services, then describe one, by raw path."""
    from google.protobuf import descriptor_pb2
    from grpc_reflection.v1alpha import reflection_pb2 as r  # the v1 messages are the same on the wire

    call = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=r.ServerReflectionRequest.SerializeToString,
        response_deserializer=r.ServerReflectionResponse.FromString,
    )
    asks = [
        r.ServerReflectionRequest(list_services=""),
        r.ServerReflectionRequest(file_containing_symbol=SERVICE),
        r.ServerReflectionRequest(file_containing_symbol="grpc.reflection.v1.ServerReflection"),
    ]
    listed, described, itself = list(call(iter(asks), timeout=TIMEOUT))
    assert {s.name for s in listed.list_services_response.service} >= {
        SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(b)
        for b in described.file_descriptor_response.file_descriptor_proto
    ]
    assert any(f.package == "streamtx.v1" and "StreamTx" in [x.name for x in f.service] for f in files)
    v1 = descriptor_pb2.FileDescriptorProto.FromString(itself.file_descriptor_response.file_descriptor_proto[0])
    assert v1.package == "grpc.reflection.v1" and v1.service[0].method[0].input_type == (
        ".grpc.reflection.v1.ServerReflectionRequest"
    )


def test_reflection_describes_the_service(api):
    assert api.service.file.package == "streamtx.v1"
    assert set(api.methods) >= {"Deploy", "Push", "PushStream", "Call", "Query", "Subscribe", "Status"}
    kinds = {name: (m.client_streaming, m.server_streaming) for name, m in api.methods.items()}
    assert kinds["Deploy"] == (False, False)
    assert kinds["Push"] == (False, False)
    assert kinds["PushStream"] == (True, True)
    assert kinds["Subscribe"] == (False, True)
    assert api.methods["Push"].input_type.full_name == "streamtx.v1.PushRequest"
    assert api.methods["Push"].output_type.full_name == "streamtx.v1.PushAck"
    row_data = api.pool.FindMessageTypeByName("streamtx.v1.RowData")
    assert set(row_data.fields_by_name) == {"arrow_ipc", "rows"}
    assert [f.name for f in row_data.oneofs_by_name["format"].fields] == ["arrow_ipc", "rows"]


def test_deploy_push_protobuf_rows_and_query_by_reflection(api):
    committed = api.enum("streamtx.v1.Outcome", "COMMITTED")
    duplicate = api.enum("streamtx.v1.Outcome", "DUPLICATE")
    resp = api.unary(
        "Deploy",
        sql=(
            "CREATE TABLE refl_totals (who VARCHAR, n BIGINT, score DOUBLE);\n"
            "CREATE STREAM refl_in (who VARCHAR, score DOUBLE, ok BOOLEAN);\n"
            "CREATE PROCEDURE refl_p ON STREAM refl_in AS BEGIN\n"
            "  INSERT INTO refl_totals SELECT who, count(*), sum(score) FROM refl_in WHERE ok GROUP BY who;\n"
            "END;"
        ),
    )
    assert {(o.kind, o.name) for o in resp.created} == {
        ("table", "refl_totals"),
        ("stream", "refl_in"),
        ("procedure", "refl_p"),
    }

    data = api.rows(
        ["score", "who", "ok"],
        [
            [1.5, "ann", True],
            [2.0, "ann", True],
            [9.0, "bob", False],
            [4.25, "cid", True],
            [None, "dan", True],
        ],
    )
    ack = api.unary("Push", stream="refl_in", producer_id="reflector", batch_id=1, data=data)
    assert ack.outcome == committed, ack
    assert ack.timestamp > 0
    again = api.unary("Push", stream="refl_in", producer_id="reflector", batch_id=1, data=data)
    assert again.outcome == duplicate

    acks = api.bidi(
        "PushStream",
        [
            {
                "stream": "refl_in",
                "producer_id": "reflector",
                "batch_id": i,
                "data": api.rows([], [[f"p{i}", float(i), True]]),
            }
            for i in (2, 3)
        ],
    )
    assert [(a.batch_id, a.outcome) for a in acks] == [(2, committed), (3, committed)]

    query_req = api.message("streamtx.v1.QueryRequest")
    q = query_req(sql="SELECT who, n, score FROM refl_totals WHERE n >= $min ORDER BY who")
    q.params["min"].int_value = 1
    call = api.channel.unary_unary(
        f"/{SERVICE}/Query",
        request_serializer=query_req.SerializeToString,
        response_deserializer=api.message("streamtx.v1.QueryResponse").FromString,
    )
    result = call(q, timeout=TIMEOUT)
    assert result.result.WhichOneof("format") == "arrow_ipc"
    table = pa.ipc.open_stream(result.result.arrow_ipc).read_all()
    assert table.to_pydict() == {
        "who": ["ann", "cid", "dan", "p2", "p3"],
        "n": [2, 1, 1, 1, 1],
        "score": [3.5, 4.25, None, 2.0, 3.0],
    }
    assert table.schema.field("n").type == pa.int64()

    status = api.unary("Status")
    assert "refl_totals" in status.tables and "refl_in" in status.streams and "refl_p" in status.procedures


def test_errors_by_reflection_are_plain_statuses(api):
    with pytest.raises(grpc.RpcError) as info:
        api.unary("Query", sql="SELECT * FROM refl_nowhere")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "refl_nowhere" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        api.unary("Call", procedure="refl_nothing")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("service", ["", SERVICE])
def test_health_reports_serving(channel, service):
    health = health_pb2_grpc.HealthStub(channel)
    resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_health_of_an_unknown_service_is_not_found(channel):
    health = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_streams_serving(channel):
    health = health_pb2_grpc.HealthStub(channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=TIMEOUT)
    try:
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    finally:
        watch.cancel()
