"""The StreamTx service on a gRPC server, with requests that fail to decode answered INVALID_ARGUMENT.

The generated `add_StreamTxServicer_to_server` decodes each request before the
servicer sees it, so a message protobuf cannot parse (a string field holding
bad UTF-8, a truncated message) ended as UNKNOWN with a DecodeError. Here
requests arrive as bytes and are decoded first thing in each call; what
cannot be decoded ends the call with INVALID_ARGUMENT naming the message
type and protobuf's reason (for PushStream: the stream, after the acks of
the messages before it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from streamtx.server.catalog.catalog import MAX_NAME_BYTES
from streamtx.v1 import streamtx_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["StreamTx"]


def add_service(servicer: Any, server: grpc.aio.Server) -> None:
    """Registers every StreamTx method of `servicer` on `server`, decoding requests itself."""
    handlers = {}
    for method in SERVICE.methods:
        request = getattr(pb, method.input_type.name)
        reply = getattr(pb, method.output_type.name)
        behavior = getattr(servicer, method.name)
        kind = (method.client_streaming, method.server_streaming)
        factory, wrapped = _WRAPPERS[kind]
        handlers[method.name] = factory(
            wrapped(behavior, request), request_deserializer=None, response_serializer=reply.SerializeToString
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))


MAX_PARAMS = 1_000
"""Parameters of one Call or Query."""
NAME_FIELDS = ("stream", "producer_id", "procedure", "name")


async def _decode(kind: type[Message], raw: bytes, context: grpc.aio.ServicerContext) -> Any:
    try:
        request = kind.FromString(raw)
    except DecodeError as e:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"cannot decode the request: {e} (string fields must be UTF-8)",
        )
    refusal = over_limits(request)
    if refusal is not None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{kind.__name__}: {refusal}")
    return request


def over_limits(request: Message) -> str | None:
    """Why a request's names or parameters exceed the limits (README, Limits), or None.

    Checked before anything looks a name up, so no answer ever echoes a name of megabytes.
    """
    names = [(f, getattr(request, f)) for f in NAME_FIELDS if f in request.DESCRIPTOR.fields_by_name]
    params = request.params if "params" in request.DESCRIPTOR.fields_by_name else {}
    if len(params) > MAX_PARAMS:
        return f"{len(params):,} parameters; at most {MAX_PARAMS:,} are accepted"
    names += [("parameter name", k) for k in params]
    for field, name in names:
        size = len(name.encode())
        if size > MAX_NAME_BYTES:
            return f"{field} {name[:32]!r}... is {size:,} bytes long; names are at most {MAX_NAME_BYTES} bytes"
    return None


def _unary_unary(behavior: Callable, kind: type[Message]) -> Callable:
    async def call(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        return await behavior(await _decode(kind, raw, context), context)

    return call


def _unary_stream(behavior: Callable, kind: type[Message]) -> Callable:
    async def call(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for reply in behavior(await _decode(kind, raw, context), context):
            yield reply

    return call


def _stream_stream(behavior: Callable, kind: type[Message]) -> Callable:
    async def call(raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async def requests() -> AsyncIterator[Any]:
            async for raw in raws:
                yield await _decode(kind, raw, context)

        async for reply in behavior(requests(), context):
            yield reply

    return call


_WRAPPERS = {
    (False, False): (grpc.unary_unary_rpc_method_handler, _unary_unary),
    (False, True): (grpc.unary_stream_rpc_method_handler, _unary_stream),
    (True, True): (grpc.stream_stream_rpc_method_handler, _stream_stream),
}
