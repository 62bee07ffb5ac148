"""The gRPC service: protobuf in, calls on `Front`, protobuf out.

Every StreamTxError becomes a gRPC status with its message; anything else is
a bug, logged and returned as INTERNAL, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import sys
import traceback
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from streamtx.errors import StreamTxError, Unauthenticated
from streamtx.server.front.front import Front
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import decode_rowdata, encode_rowdata, params_from_proto

OUTCOMES = {
    "committed": pb.COMMITTED,
    "duplicate": pb.DUPLICATE,
    "rejected": pb.REJECTED,
    "": pb.OUTCOME_UNSPECIFIED,
}


def version() -> str:
    try:
        return importlib.metadata.version("streamtx")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def rpc(admin: bool = False) -> Callable:
    """Maps StreamTxError onto the call's status; checks the token for admin verbs."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        async def handler(self: StreamTxService, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                if admin:
                    self.authorize(context, method.__name__)
                return await method(self, request, context)
            except StreamTxError as e:
                await context.abort(e.code, e.message)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if isinstance(e, grpc.aio.AbortError):
                    raise
                traceback.print_exc(file=sys.stderr)
                await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

        return handler

    return wrap


class StreamTxService(pb_grpc.StreamTxServicer):
    def __init__(self, front: Front) -> None:
        self.front = front

    def authorize(self, context: grpc.aio.ServicerContext, verb: str) -> None:
        token = self.front.config.token
        if not token:
            return
        metadata = dict(context.invocation_metadata() or ())
        given = metadata.get("authorization", "")
        if given != f"Bearer {token}":
            why = "no token given" if not given else "wrong token"
            raise Unauthenticated(
                f"{verb} is an admin verb and this server requires a token ({why}); send "
                "metadata 'authorization: Bearer <token>'"
            )

    @rpc(admin=True)
    async def Deploy(self, request: pb.DeployRequest, context: Any) -> pb.DeployResponse:
        created, dropped = await self.front.deploy(request.sql)
        return pb.DeployResponse(
            created=[pb.CatalogObject(kind=k, name=n) for k, n in created],
            dropped=[pb.CatalogObject(kind=k, name=n) for k, n in dropped],
        )

    @rpc()
    async def Push(self, request: pb.PushRequest, context: Any) -> pb.PushAck:
        return await self._push(request)

    async def PushStream(
        self, request_iterator: AsyncIterator[pb.PushRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PushAck]:
        """Reads batches as fast as admission allows; acks go back in send order."""
        acks: asyncio.Queue[asyncio.Future | None] = asyncio.Queue()
        front = self.front

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await front.admission.acquire()
                    fut = asyncio.ensure_future(self._push_admitted(request))
                    await acks.put(fut)
            finally:
                await acks.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                fut = await acks.get()
                if fut is None:
                    break
                yield await fut
            await reader
        finally:
            reader.cancel()

    async def _push_admitted(self, request: pb.PushRequest) -> pb.PushAck:
        try:
            return await self._push(request)
        finally:
            self.front.admission.release()

    def _start_push(self, request: pb.PushRequest, ack: pb.PushAck) -> asyncio.Future:
        front = self.front
        what = f"push to {request.stream!r} (producer {request.producer_id!r}, batch {request.batch_id})"
        schema = front.check_push(request.stream, request.producer_id, request.batch_id)
        try:
            table = decode_rowdata(request.data, schema, what)
            ack.rows = table.num_rows
            front.check_rows(request.stream, table)
        except StreamTxError as e:  # a well-addressed batch with bad rows: its id is used up, rejected
            return front.reject(request.stream, request.producer_id, request.batch_id, e)
        return front.push(request.stream, request.producer_id, request.batch_id, table)

    async def _push(self, request: pb.PushRequest) -> pb.PushAck:
        ack = pb.PushAck(stream=request.stream, producer_id=request.producer_id, batch_id=request.batch_id)
        try:
            outcome = await self._start_push(request, ack)
        except StreamTxError as e:
            self.front.counters["rejected"] += 1
            ack.outcome = pb.REJECTED
            ack.code = e.code.value[0]
            ack.reason = e.message
            return ack
        ack.outcome = OUTCOMES[outcome["outcome"]]
        ack.timestamp = outcome["ts"]
        ack.code = outcome.get("code", 0)
        ack.reason = outcome.get("reason", "")
        ack.original = OUTCOMES[outcome.get("original", "")]
        aborted = outcome.get("aborted_tes")
        if aborted and not ack.reason:
            ack.reason = "downstream TE aborted: " + "; ".join(aborted)
        return ack

    @rpc()
    async def Call(self, request: pb.CallRequest, context: Any) -> pb.CallResponse:
        ts, results = await self.front.call(request.procedure, params_from_proto(request.params))
        return pb.CallResponse(timestamp=ts, results=[encode_rowdata(t) for t in results])

    @rpc()
    async def Query(self, request: pb.QueryRequest, context: Any) -> pb.QueryResponse:
        table = await self.front.query(request.sql, params_from_proto(request.params))
        return pb.QueryResponse(result=encode_rowdata(table))

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamBatch]:
        front = self.front
        try:
            front.check_subscribe(request.stream)
            next_batch = max(request.from_batch, 0)
            while True:
                event = front.stream_event(request.stream)
                batches = await front.read_stream(request.stream, next_batch)
                for batch_id, table in batches:
                    yield pb.StreamBatch(stream=request.stream, batch_id=batch_id, data=encode_rowdata(table))
                    next_batch = batch_id + 1
                if not batches:
                    try:
                        await asyncio.wait_for(event.wait(), timeout=1.0)
                    except TimeoutError:
                        pass
        except StreamTxError as e:
            await context.abort(e.code, e.message)

    @rpc()
    async def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        front = self.front
        st = await front.status()
        cat = front.catalog
        return pb.StatusResponse(
            version=version(),
            executor=front.config.executor,
            partitions=[pb.PartitionStatus(**p) for p in st["partitions"]],
            tables=cat.names("table"),
            streams=cat.names("stream"),
            windows=cat.names("window"),
            procedures=cat.names("procedure"),
            triggers=cat.names("trigger"),
            counters=st["counters"],
            last_timestamp=st["last_timestamp"],
        )


__all__ = ["StreamTxService"]
