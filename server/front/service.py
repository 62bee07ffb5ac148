"""The gRPC service: protobuf in, calls on `Front`, protobuf out.

Every StreamTxError becomes a gRPC status with its message; anything else is
a bug, logged and returned as INTERNAL, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import sys
import traceback
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa

import streamtx
from streamtx.errors import (
    FAULTS,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Overloaded,
    ResourceExhausted,
    StreamTxError,
)
from streamtx.server.front.admission import Admission
from streamtx.server.front.front import Front
from streamtx.server.front.rebalance import BinMove, Intent, Progress, bins_per_partition
from streamtx.server.front.staging import PartSpec, Staging
from streamtx.server.partitioning import PartitionMap
from streamtx.server.protocol import Outcome, StatementPlan
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import Decoded, decode_batches, decode_rowdata, encode_rowdata, params_from_proto

if TYPE_CHECKING:
    from streamtx.server.cluster.replica import Replica

OUTCOMES = {
    "committed": pb.COMMITTED,
    "duplicate": pb.DUPLICATE,
    "rejected": pb.REJECTED,
    "": pb.OUTCOME_UNSPECIFIED,
}


def rpc() -> Callable:
    """Maps StreamTxError onto the call's status (tokens are checked before: server/front/auth.py)."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        async def handler(self: StreamTxService, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await method(self, request, context)
            except StreamTxError as e:
                await context.abort(e.code, e.message, e.trailers())
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if isinstance(e, grpc.aio.AbortError):
                    raise
                traceback.print_exc(file=sys.stderr)
                await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

        return handler

    return wrap


TAKEN_REMEMBERED = 10_000
"""Committed staging keys remembered, so that a re-sent commit is answered DUPLICATE even
while the original is still waiting in the sequencer for an earlier batch id."""

READ_MAX_BATCHES = 1024
INT64_MAX = 2**63 - 1


class StreamTxService(pb_grpc.StreamTxServicer):
    def __init__(self, front: Front) -> None:
        self.front = front
        self.staging = Staging(front.config.staging_max_bytes, front.config.staging_ttl)
        self._taken: collections.OrderedDict[tuple[str, str, int], None] = collections.OrderedDict()
        self._sweep: asyncio.TimerHandle | None = None
        self.replica: Replica | None = None  # cluster mode: requests that change state go through the log

    async def run_logged(self, kind: str, request: Any) -> Any:
        """A call or deploy read from the cluster's log, run here as a standalone server runs it."""
        return await (self._call(request) if kind == "call" else self._deploy(request))

    @rpc()
    async def Checkpoint(self, request: pb.CheckpointRequest, context: Any) -> pb.CheckpointResponse:
        ts, parts = await self.front.checkpoint()
        return pb.CheckpointResponse(
            timestamp=ts,
            partitions=[pb.PartitionCheckpoint(partition=i, path=p.path, lsn=p.lsn) for i, p in enumerate(parts)],
        )

    @rpc()
    async def Deploy(self, request: pb.DeployRequest, context: Any) -> pb.DeployResponse:
        if self.replica is not None:
            return await (await self.replica.submit("deploy", request))
        return await self._deploy(request)

    async def _deploy(self, request: pb.DeployRequest) -> pb.DeployResponse:
        created, dropped, plans = await self.front.deploy(request.sql)
        return pb.DeployResponse(
            created=[pb.CatalogObject(kind=k, name=n) for k, n in created],
            dropped=[pb.CatalogObject(kind=k, name=n) for k, n in dropped],
            plans=[_plan(p) for p in plans],
        )

    @rpc()
    async def Explain(self, request: pb.ExplainRequest, context: Any) -> pb.ExplainResponse:
        if not request.name:
            raise InvalidArgument("explain: no name given: name a procedure or an EE trigger")
        return pb.ExplainResponse(statements=[_plan(p) for p in await self.front.explain(request.name)])

    @rpc()
    async def Push(self, request: pb.PushRequest, context: Any) -> pb.PushAck:
        if request.batch_rows:
            raise InvalidArgument(
                f"push to {request.stream!r}: batch_rows (several batches in one message) is for PushStream; "
                "a unary Push carries one batch"
            )
        size = request.ByteSize()
        await self._admit_one(request.stream, request.producer_id, request.batch_id, size, self.front.config.push_wait)
        if self.replica is not None:
            return await self._logged_one(request, size)
        ack = pb.PushAck(stream=request.stream, producer_id=request.producer_id, batch_id=request.batch_id)
        try:
            outcome = await asyncio.shield(self._started(lambda: self._start_push(request, ack), size))
        except FAULTS:
            raise  # the server's failure, not the batch's: the call's status
        except StreamTxError as e:
            return self._rejected(ack, e)
        return fill_ack(ack, outcome)

    async def _logged_one(self, request: pb.PushRequest, size: int) -> pb.PushAck:
        """One admitted batch through the cluster's log: its ack once this host has run it."""
        assert self.replica is not None
        try:
            answer = await self.replica.submit("push", request)
        except BaseException:
            self.front.admission.release(1, size)
            raise
        release_at_outcome(answer, self.front.admission, size)
        return (await asyncio.shield(answer))[0]

    def _started(self, start: Callable[[], asyncio.Future], size: int) -> asyncio.Future:
        """Starts an admitted batch: its room goes back at its outcome, or now if it does not start."""
        admission = self.front.admission
        try:
            fut = start()
        except BaseException:
            admission.release(1, size)
            raise
        release_at_outcome(fut, admission, size)
        return fut

    async def _admit_one(self, stream: str, producer: str, batch_id: int, size: int, wait: float | None) -> None:
        """Waits up to `wait` seconds (None: as long as it takes) for room; else Overloaded.

        A batch that later batches of its producer, admitted first, wait for
        in the sequencer goes in whatever the limit: they hold room until it comes.
        """
        front, admission = self.front, self.front.admission
        if front.sequencer.awaited(producer, stream, batch_id):
            admission.admit_now(1, size)
            return
        if await admission.acquire(1, size, wait):
            return
        front.counters["push_refused"] += 1
        retry_after = admission.retry_after()
        raise Overloaded(
            f"push to {stream!r} (producer {producer!r}, batch {batch_id}): the server "
            f"is at its admission limit ({admission.batches} batches, {admission.bytes} bytes in flight; "
            f"--max-in-flight {admission.max_batches}, --max-in-flight-bytes {admission.max_bytes}); nothing was "
            f"taken, retry in {retry_after * 1000:.0f} ms",
            retry_after,
        )

    async def PushStream(
        self, request_iterator: AsyncIterator[pb.PushRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PushAck]:
        """Reads messages as fast as admission allows; acks go back in send order, as batches finish.

        Admission counts messages: a message of several batches is bounded by
        gRPC's message size, and its batches are sequenced together. A
        message's acks leave a run at a time as its batches finish, not when
        all of them have: a producer that packed its whole window into one
        message gets its slots back interval by interval, so its next batches
        overlap the partitions' work instead of alternating with it.
        """
        messages: asyncio.Queue[_Message | None] = asyncio.Queue()
        front = self.front

        async def read() -> None:
            try:
                async for request in request_iterator:
                    batches, size = max(len(request.batch_rows), 1), request.ByteSize()
                    await front.admission.acquire(batches, size)
                    front.counters["push_messages"] += 1
                    try:
                        if self.replica is None:
                            message: _Message | _Logged = self.start_message(request)
                        else:
                            message = _Logged(await self.replica.submit_push(request), batches)
                    except BaseException:
                        front.admission.release(batches, size)
                        raise
                    message.release_each(front.admission, size)
                    await messages.put(message)
            finally:
                await messages.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                message = await messages.get()
                if message is None:
                    break
                async for run in message.runs():
                    for ack in run:
                        yield ack
            await reader
        except StreamTxError as e:  # a message that cannot be understood, or the server's own failure
            await context.abort(e.code, e.message)
        finally:
            reader.cancel()

    def start_message(self, request: pb.PushRequest) -> _Message:
        """Sequences every batch of one PushStream message now; `_Message.runs` yields their acks."""
        if request.batch_rows:
            return self._start_many(request)
        ack = pb.PushAck(stream=request.stream, producer_id=request.producer_id, batch_id=request.batch_id)
        try:
            fut = self._start_push(request, ack)
        except StreamTxError as e:
            return _Message(self, [self._rejected(ack, e)], [None])
        return _Message(self, [ack], [fut])

    def _start_push(self, request: pb.PushRequest, ack: pb.PushAck) -> asyncio.Future:
        front = self.front
        what = f"push to {request.stream!r} (producer {request.producer_id!r}, batch {request.batch_id})"
        schema = front.check_push(request.stream, request.producer_id, request.batch_id)
        try:
            table = decode_rowdata(request.data, schema, what)
            ack.rows = table.num_rows
            front.check_rows(request.stream, table.num_rows)
        except StreamTxError as e:  # a well-addressed batch with bad rows: its id is used up, rejected
            return front.reject(request.stream, request.producer_id, request.batch_id, e)
        return front.push(request.stream, request.producer_id, request.batch_id, table)

    def _rejected(self, ack: pb.PushAck, e: StreamTxError) -> pb.PushAck:
        self.front.counters["rejected"] += 1
        ack.outcome = pb.REJECTED
        ack.code = e.code.value[0]
        ack.reason = e.message
        return ack

    def _start_many(self, request: pb.PushRequest) -> _Message:
        """Several batches of one message: each sequenced, executed and answered as if sent alone."""
        front = self.front
        stream, producer, first = request.stream, request.producer_id, request.batch_id
        sizes = list(request.batch_rows)
        if first > INT64_MAX - len(sizes) + 1:
            raise InvalidArgument(
                f"push to {stream!r}: batch ids {first}..{first + len(sizes) - 1} do not fit in 64 bits (batch_rows "
                f"holds {len(sizes)} batches)"
            )
        acks = [pb.PushAck(stream=stream, producer_id=producer, batch_id=first + i) for i in range(len(sizes))]
        try:
            schema = front.check_push(stream, producer, first)
        except StreamTxError as e:
            return _Message(self, [self._rejected(ack, e) for ack in acks], [None] * len(acks))
        what = f"push to {stream!r} (producer {producer!r}, batches {first}..{first + len(sizes) - 1})"

        def name(i: int) -> str:
            return f"push to {stream!r} (producer {producer!r}, batch {first + i})"

        try:
            decoded = decode_batches(request.data, schema, sizes, what, name)
        except StreamTxError as e:  # every batch of the message is well addressed: ids used up, rejected
            parts: list[pa.Table | StreamTxError] = [e] * len(acks)
        else:
            run = self._start_run(stream, producer, first, decoded)
            if run is not None:
                for ack, n in zip(acks, sizes, strict=True):
                    ack.rows = n
                return _Message(self, acks, run)
            parts = list(decoded.batches())
        for i, (ack, part) in enumerate(zip(acks, parts, strict=True)):
            if isinstance(part, pa.Table):
                ack.rows = part.num_rows
                try:
                    front.check_rows(stream, part.num_rows)
                except StreamTxError as e:
                    parts[i] = e
        futures: list[asyncio.Future | None] = []
        for ack, part in zip(acks, parts, strict=True):
            if isinstance(part, StreamTxError):
                futures.append(front.reject(stream, producer, ack.batch_id, part))
            else:
                futures.append(front.push(stream, producer, ack.batch_id, part))
        return _Message(self, acks, futures)

    def _start_run(self, stream: str, producer: str, first: int, decoded: Decoded) -> list[asyncio.Future] | None:
        """The batches as one run (`Front.push_run`) when every one is good and they can go so; else None."""
        if decoded.whole is None:
            return None
        try:
            self.front.check_rows(stream, max(decoded.sizes))
        except StreamTxError:
            return None  # batch by batch: each too large one is refused alone
        return self.front.push_run(stream, producer, first, decoded.whole, decoded.sizes)

    @rpc()
    async def Call(self, request: pb.CallRequest, context: Any) -> pb.CallResponse:
        if self.replica is not None:
            return await (await self.replica.submit("call", request))
        return await self._call(request)

    async def _call(self, request: pb.CallRequest) -> pb.CallResponse:
        ts, results = await self.front.call(request.procedure, params_from_proto(request.params))
        arrow = request.format != pb.ROWS
        return pb.CallResponse(timestamp=ts, results=[encode_rowdata(t, arrow) for t in results])

    @rpc()
    async def Query(self, request: pb.QueryRequest, context: Any) -> pb.QueryResponse:
        table = await self.front.query(request.sql, params_from_proto(request.params))
        result = encode_rowdata(table, request.format != pb.ROWS)
        limit = self.front.config.max_message_bytes
        if result.ByteSize() > limit:
            raise ResourceExhausted(
                f"query: its result of {table.num_rows} rows takes {result.ByteSize()} bytes, more than "
                f"--max-message-bytes ({limit}); narrow it (WHERE, LIMIT/OFFSET pages, fewer columns)"
            )
        return pb.QueryResponse(result=result)

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamBatch]:
        front = self.front
        try:
            front.check_subscribe(request.stream)
            next_ts = max(request.from_ts, 0)
            while True:
                event = front.stream_event(request.stream)
                batches = await front.read_stream(request.stream, next_ts)
                for ts, table in batches:
                    data = encode_rowdata(table, request.format != pb.ROWS)
                    yield pb.StreamBatch(stream=request.stream, ts=ts, data=data)
                    next_ts = ts + 1
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
            version=streamtx.__version__,
            executor=front.config.executor,
            partitions=[pb.PartitionStatus(**p) for p in st["partitions"]],
            tables=cat.names("table"),
            streams=cat.names("stream"),
            windows=cat.names("window"),
            procedures=cat.names("procedure"),
            triggers=cat.names("trigger"),
            views=cat.names("view"),
            groups=cat.names("group"),
            indexes=cat.names("index"),
            counters=st["counters"],
            last_timestamp=st["last_timestamp"],
            stream_metrics=st["stream_metrics"],
            recovery_seconds=st["recovery_seconds"],
            bins=front.map.bins,
            bins_per_partition=bins_per_partition(front.map),
            bin_owner=front.map.owner,
            rebalancing=_progress(front.rebalancer.running, front.map),
            rebalance_interrupted=_interrupted(front.rebalancer.interrupted, front.map),
            keys_per_partition=front.keys_per_partition,
        )

    async def Rebalance(
        self, request: pb.RebalanceRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.RebalanceProgress]:
        """A migration's progress as it runs; the request's mistakes are INVALID_ARGUMENT before any step."""
        front = self.front
        moves = [BinMove(m.first_bin, m.last_bin, m.partition) for m in request.moves]
        steps = front.rebalancer.run(
            moves,
            request.even,
            request.strategy or None,
            request.bins_per_step or None,
            request.resume,
            request.partitions or None,
        )
        try:
            async for progress in steps:
                yield _progress(progress, front.map)
        except StreamTxError as e:
            await context.abort(e.code, e.message, e.trailers())

    # ------------------------------------------------- streams for connectors
    @rpc()
    async def DescribeStream(self, request: pb.DescribeStreamRequest, context: Any) -> pb.DescribeStreamResponse:
        """Lets a producer or reader check a stream before it moves any data."""
        front = self.front
        cat = front.catalog
        schema = cat.stream_schemas.get(request.stream)
        if schema is None:
            known = ", ".join(cat.names("stream")) or "none"
            raise NotFound(f"describe: unknown stream {request.stream!r} (streams: {known})")
        readable = not cat.consumers.get(request.stream)
        complete = 0
        if readable and request.with_complete_through:
            # Partition queues run in timestamp order: once this (empty) read has been
            # answered, every command stamped up to `last` has finished on the stream.
            last = front.sequencer.last_ts
            await front.read_stream(request.stream, last + 1, 1)
            complete = last
        return pb.DescribeStreamResponse(
            stream=request.stream,
            arrow_schema=schema.serialize().to_pybytes(),
            border=cat.is_border(request.stream),
            readable=readable,
            complete_through=complete,
        )

    @rpc()
    async def ReadStream(self, request: pb.ReadStreamRequest, context: Any) -> pb.ReadStreamResponse:
        """A bounded range of a stream's batches, for readers that keep their own offsets (Spark)."""
        front = self.front
        front.check_subscribe(request.stream)
        limit = min(request.max_batches or 64, READ_MAX_BATCHES)
        batches = await front.read_stream(request.stream, max(request.from_ts, 0), limit)
        kept = [(ts, t) for ts, t in batches if request.to_ts <= 0 or ts < request.to_ts]
        return pb.ReadStreamResponse(
            batches=[
                pb.StreamBatch(stream=request.stream, ts=ts, data=encode_rowdata(t, request.format != pb.ROWS))
                for ts, t in kept
            ],
            more=len(batches) == limit and len(kept) == len(batches),
        )

    # ---------------------------------------------------- two-phase pushes
    def _staging_schema(self, stream: str, verb: str) -> Any:
        cat = self.front.catalog
        schema = cat.stream_schemas.get(stream)
        if schema is None:
            known = ", ".join(cat.names("stream")) or "none"
            raise NotFound(f"{verb}: unknown stream {stream!r} (streams: {known})")
        if not cat.is_border(stream):
            raise FailedPrecondition(
                f"{verb}: stream {stream!r} is the output of a procedure; producers push to border streams only"
            )
        return schema

    @rpc()
    async def Stage(self, request: pb.StageRequest, context: Any) -> pb.StageResponse:
        schema = self._staging_schema(request.stream, "stage")
        what = f"stage to {request.stream!r} ({request.staging_id}, part {request.part}, chunk {request.chunk})"
        table = decode_rowdata(request.data, schema, what)
        limit = self.front.config.max_batch_rows
        if table.num_rows > limit:
            raise ResourceExhausted(f"{what}: {table.num_rows} rows exceed --max-batch-rows ({limit})")
        staged = self.staging.put(request.stream, request.staging_id, request.part, request.chunk, table)
        self.front.counters["staged_chunks"] += 1
        self._schedule_sweep()
        return pb.StageResponse(rows=table.num_rows, staged_bytes=staged)

    @rpc()
    async def CommitStaged(self, request: pb.CommitStagedRequest, context: Any) -> pb.PushAck:
        """Exactly the named parts become batch (producer, batch_id); a re-sent commit is DUPLICATE."""
        front = self.front
        stream, producer, batch_id = request.stream, request.producer_id, request.batch_id
        schema = front.check_push(stream, producer, batch_id)
        specs = [PartSpec(p.part, p.chunks, p.rows) for p in request.parts]
        rows = sum(s.rows for s in specs)
        if rows > front.config.max_batch_rows:
            raise ResourceExhausted(
                f"commit of {stream!r} ({request.staging_id}): {rows} rows exceed --max-batch-rows "
                f"({front.config.max_batch_rows}); make the batches smaller"
            )
        key = (producer, stream, batch_id)
        table = self.staging.take(stream, request.staging_id, specs, schema)
        if table is None:
            staged = sum(s.chunks for s in specs)
            if staged and key not in self._taken and front.sequencer.dispatched.get((producer, stream), 0) < batch_id:
                raise FailedPrecondition(
                    f"commit of {stream!r} ({request.staging_id}) as batch {batch_id} of {producer!r}: nothing is "
                    f"staged under this id (expired after {front.config.staging_ttl:g} s, aborted, or never "
                    "staged); stage the rows again"
                )
            # a re-sent commit (the rows went into the batch already), or an empty batch:
            # the push path answers DUPLICATE with the original outcome, or takes the empty batch
            table = schema.empty_table()
        else:
            self._taken[key] = None
            while len(self._taken) > TAKEN_REMEMBERED:
                self._taken.popitem(last=False)
        ack = pb.PushAck(stream=stream, producer_id=producer, batch_id=batch_id, rows=table.num_rows)
        await self._admit_one(stream, producer, batch_id, 0, None)  # its rows count in --staging-max-bytes
        if self.replica is not None:  # the staged rows go into the log as one batch
            data = encode_rowdata(table, True)
            pushed = pb.PushRequest(stream=stream, producer_id=producer, batch_id=batch_id, data=data)
            logged = await self._logged_one(pushed, 0)
            if logged.outcome == pb.REJECTED and front.sequencer.dispatched.get((producer, stream), 0) < batch_id:
                self._taken.pop(key, None)  # not taken, as below
                raise FailedPrecondition(logged.reason)
            front.counters["staged_commits"] += 1
            return logged
        fut = self._started(lambda: front.push(stream, producer, batch_id, table), 0)
        try:
            outcome = await asyncio.shield(fut)
        except StreamTxError:
            # not taken (e.g. an earlier batch id never came): a re-sent commit must not pass
            # for a duplicate; the writer stages the rows again
            self._taken.pop(key, None)
            raise
        front.counters["staged_commits"] += 1
        front.counters["staged_parts_discarded"] = self.staging.discarded
        front.counters["staging_expired"] = self.staging.expired
        return fill_ack(ack, outcome)

    def _schedule_sweep(self) -> None:
        """Expires abandoned staging ids even when no further staging call comes."""
        if self._sweep is None and len(self.staging):
            self._sweep = asyncio.get_running_loop().call_later(self.staging.ttl_s / 2, self._run_sweep)

    def _run_sweep(self) -> None:
        self._sweep = None
        self.staging.expire()
        self.front.counters["staging_expired"] = self.staging.expired
        self._schedule_sweep()

    @rpc()
    async def AbortStaged(self, request: pb.AbortStagedRequest, context: Any) -> pb.AbortStagedResponse:
        parts = self.staging.drop(request.stream, request.staging_id)
        self.front.counters["staged_aborts"] += 1
        return pb.AbortStagedResponse(parts=parts)


class _Message:
    """The acks of one PushStream message, each filled in once its batch's outcome is known."""

    def __init__(self, service: StreamTxService, acks: list[pb.PushAck], futures: list[asyncio.Future | None]) -> None:
        self.service = service
        self.acks = acks
        self.futures = futures  # None: answered already (refused before it was sequenced)

    def release_each(self, admission: Admission, size: int) -> None:
        """Gives each batch's share of the message's admission back once its outcome is known (read or not).

        Batch by batch, not with the last one: a message that packs a
        producer's whole window lets the next one in as its intervals commit.
        """
        n = max(len(self.futures), 1)
        shares = [size // n + (1 if i < size % n else 0) for i in range(n)]
        for fut, share in zip(self.futures or [None], shares, strict=True):
            if fut is None:
                admission.release(1, share)
            else:
                release_at_outcome(fut, admission, share)

    async def runs(self) -> AsyncIterator[list[pb.PushAck]]:
        """The acks in send order: whenever the next batch finishes, it and every finished batch after it."""
        acks, futures = self.acks, self.futures
        at = 0
        while at < len(acks):
            first = futures[at]
            if first is not None and not first.done():
                await asyncio.wait([first])
            end = at
            while end < len(acks) and (futures[end] is None or futures[end].done()):
                fut = futures[end]
                if fut is not None:
                    error = fut.exception()
                    if isinstance(error, FAULTS):
                        raise error
                    if isinstance(error, StreamTxError):
                        self.service._rejected(acks[end], error)
                    elif error is not None:
                        raise error
                    else:
                        fill_ack(acks[end], fut.result())
                end += 1
            yield _runs(acks[at:end])
            at = end


class _Logged:
    """The acks of one PushStream message sent through the cluster's log: all at once, when this host ran it."""

    def __init__(self, answer: asyncio.Future, batches: int) -> None:
        self.answer = answer
        self.batches = batches

    def release_each(self, admission: Admission, size: int) -> None:
        release_at_outcome(self.answer, admission, size, self.batches)

    async def runs(self) -> AsyncIterator[list[pb.PushAck]]:
        yield await self.answer


def release_at_outcome(fut: asyncio.Future, admission: Admission, size: int, batches: int = 1) -> None:
    """Gives a batch's room back when it has its outcome, not when its call ends.

    A caller that gives up (deadline, disconnect) leaves the batch running:
    it holds its room until it is done, and its outcome is retrieved here so
    that nobody is told it was never read.
    """

    def done(f: asyncio.Future) -> None:
        admission.release(batches, size)
        if not f.cancelled():
            f.exception()

    fut.add_done_callback(done)


def _runs(acks: list[pb.PushAck]) -> list[pb.PushAck]:
    """Consecutive acks that differ only in batch id, timestamp and rows become one ack with a count."""
    out: list[pb.PushAck] = []
    for ack in acks:
        last = out[-1] if out else None
        if (
            last is not None
            and ack.timestamp > 0
            and ack.timestamp == last.timestamp + max(last.count, 1)
            and (ack.outcome, ack.code, ack.reason, ack.original)
            == (last.outcome, last.code, last.reason, last.original)
        ):
            last.count = max(last.count, 1) + 1
            last.rows += ack.rows
        else:
            out.append(ack)
    return out


def _plan(p: StatementPlan) -> pb.StatementPlan:
    return pb.StatementPlan(unit=p.unit, index=p.index, sql=p.sql, compiled=p.compiled, plan=p.plan, reason=p.reason)


def fill_ack(ack: pb.PushAck, outcome: Outcome) -> pb.PushAck:
    """`ack` filled from a partition's outcome; streamtx.testing builds its outcomes with it too."""
    ack.outcome = OUTCOMES[outcome.outcome]
    ack.timestamp = outcome.ts
    ack.code = outcome.code
    ack.reason = outcome.reason
    ack.original = OUTCOMES[outcome.original]
    if outcome.aborted_tes and not ack.reason:
        ack.reason = "downstream TE aborted: " + "; ".join(outcome.aborted_tes)
    return ack


__all__ = ["StreamTxService"]


def _interrupted(intent: Intent | None, current: PartitionMap) -> pb.InterruptedRebalance | None:
    if intent is None:
        return None
    return pb.InterruptedRebalance(
        strategy=intent.strategy,
        bins_per_step=intent.bins_per_step,
        bins_left=intent.bins_left(current),
        target_owner=intent.target,
    )


def _progress(progress: Progress | None, current: PartitionMap) -> pb.RebalanceProgress | None:
    if progress is None:
        return None
    return pb.RebalanceProgress(
        step=progress.step,
        steps=progress.steps,
        bins_moved=progress.bins_moved,
        bins_total=progress.bins_total,
        rows_moved=progress.rows_moved,
        elapsed_seconds=progress.elapsed,
        timestamp=progress.ts,
        step_seconds=progress.step_seconds,
        bins_per_partition=bins_per_partition(current),
    )
