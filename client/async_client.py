"""The asyncio client: the one implementation of the streamtx wire protocol in Python.

Pushes are pipelined over ONE long-lived bidirectional `PushStream` call, because a
round trip per batch caps ingest at a few thousand batches per second
(docs/benchmarks.md, `bench push`: unary calls 241 batches/s). Each batch is
acknowledged by an ack naming it; a future per batch resolves when its ack arrives.
A window of `max_in_flight` admitted but unacknowledged batches bounds memory on
both ends. Batches queued while a write is under way leave together, in one message
of several batches (their ids consecutive, each still its own atomic batch with its
own ack), so a producer of many small batches pays gRPC's and Arrow's per-message
cost once per message, not once per batch. When the stream breaks, unacknowledged
batches are re-sent with the same batch ids: the server's exactly-once dedup turns
any that were already applied into DUPLICATE acks."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import random
import sys
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pyarrow as pa
from google.protobuf.message import Message

from streamtx import errors, wire
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc

from .results import DeployResult, PushResult, Result, StatementPlan

DEFAULT_TARGET = "127.0.0.1:7411"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
PACK_MAX_BATCHES = 1024
"""Batches packed into one PushStream message at most."""
PACK_MAX_BYTES = 1 << 20
"""Arrow bytes packed into one message at most (a larger batch travels alone)."""
PACK_YIELD = 64
"""Queued batches after which `push` lets the writer run, even when the window has room."""

_BACKOFF_BASE_S = 0.1
_BACKOFF_MAX_S = 5.0
# What grpc.aio reports when a client write fails because the call already ended.
_CORE_INTERNAL = "Internal error from Core"

#: (stream, producer_id, batch_id): how an ack names its batch.
BatchKey = tuple[str, str, int]


def to_table(rows: Any) -> pa.Table:
    """Normalises the row shapes `push` accepts into one pyarrow Table.

    Accepted: a pyarrow Table or RecordBatch, a pandas DataFrame (its index is
    dropped), a list of dicts (one per row) or a dict of column lists. Types
    are inferred here and cast to the stream's declared types by the server.
    """
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    pd = sys.modules.get("pandas")  # only a DataFrame if pandas is already loaded
    if pd is not None and isinstance(rows, pd.DataFrame):
        return pa.Table.from_pandas(rows, preserve_index=False)
    if isinstance(rows, Mapping):
        try:
            return pa.table({str(k): v for k, v in rows.items()})
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
            raise errors.InvalidArgument(f"cannot convert column dict to a table: {e}") from None
    if isinstance(rows, list | tuple):
        if not all(isinstance(r, Mapping) for r in rows):
            raise TypeError("a list of rows must contain dicts (column name -> value)")
        try:
            return pa.Table.from_pylist(list(rows))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
            raise errors.InvalidArgument(f"cannot convert row dicts to a table: {e}") from None
    raise TypeError(
        "rows must be a pyarrow Table/RecordBatch, a pandas DataFrame, a list of dicts "
        f"or a dict of column lists, not {type(rows).__name__}"
    )


def rowdata_to_result(data: pb.RowData, what: str = "result") -> Result:
    """A Result from a RowData; servers send Arrow IPC, protobuf rows are tolerated."""
    fmt = data.WhichOneof("format")
    if fmt == "arrow_ipc":
        return Result(wire.ipc_to_table(data.arrow_ipc, what))
    if fmt == "rows":
        names = list(data.rows.columns)
        columns: list[list[Any]] = [[] for _ in names]
        for row in data.rows.rows:
            for c, value in enumerate(row.values):
                columns[c].append(wire.value_to_py(value))
        return Result(pa.table(dict(zip(names, columns, strict=True))))
    return Result(pa.table({}))


def message_to_dict(msg: Message) -> dict[str, Any]:
    """A plain dict of a protobuf message, keeping int64 as int (MessageToDict makes strings)."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            nested = f.message_type.fields_by_name["value"].message_type is not None
            out[f.name] = {k: message_to_dict(v) if nested else v for k, v in value.items()}
        elif f.is_repeated:
            out[f.name] = [message_to_dict(v) if f.message_type else v for v in value]
        elif f.message_type is not None:
            out[f.name] = message_to_dict(value)
        else:
            out[f.name] = value
    return out


def _pem(value: str | bytes | Path | None, what: str) -> bytes | None:
    """PEM bytes given as themselves or as the path of a file holding them."""
    if value is None or isinstance(value, bytes):
        return value
    try:
        return Path(value).read_bytes()
    except OSError as e:
        raise ValueError(f"{what} {value}: {e.strerror or e}") from None


def channel_credentials(
    tls_ca: str | bytes | Path | None = None,
    tls_cert: str | bytes | Path | None = None,
    tls_key: str | bytes | Path | None = None,
) -> grpc.ChannelCredentials | None:
    """TLS credentials for a channel (PEM bytes or file paths); None: plaintext (none of them given).

    `tls_ca` is the CA that signed the server's certificate (none: the
    system's roots); `tls_cert`/`tls_key` are the client's certificate for a
    server that asks for one (mutual TLS), both or neither.
    """
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together: give both (mutual TLS) or neither")
    if tls_ca is None and tls_cert is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_pem(tls_ca, "tls_ca"),
        private_key=_pem(tls_key, "tls_key"),
        certificate_chain=_pem(tls_cert, "tls_cert"),
    )


def targets_of(target: str) -> list[str]:
    """The HOST:PORT addresses of a comma-separated target (a cluster's hosts), in order."""
    targets = [t.strip() for t in target.split(",") if t.strip()]
    if not targets:
        raise ValueError(f"target {target!r}: no HOST:PORT given")
    return targets


def next_target(targets: list[str], current: str) -> tuple[str, bool]:
    """The target after `current`, and whether the turn came back to the first (time to back off)."""
    at = (targets.index(current) + 1) % len(targets)
    return targets[at], at == 0


def _backoff(attempt: int) -> float:
    return min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * (2**attempt))


def _mapped(e: grpc.aio.AioRpcError) -> errors.StreamTxError:
    return errors.error_for(e.code(), _explained(e.details() or e.code().name), e.trailing_metadata())


def _explained(details: str) -> str:
    """A failure to connect, with the TLS settings to look at when TLS is the likely cause."""
    if "failed to connect" not in details:
        return details
    if "handshake" in details.lower():
        return (
            f"{details} (the TLS handshake failed: tls_ca / --tls-ca must be the CA that signed the server's "
            "certificate, and a server that asks for a client certificate needs tls_cert/tls_key signed by its CA)"
        )
    if details.endswith("Socket closed"):
        return (
            f"{details} (the server closed the connection at once: if it serves TLS, connect with tls_ca / "
            "--tls-ca; if it asks for a client certificate, give tls_cert/tls_key signed by its CA)"
        )
    return details


@functools.lru_cache(maxsize=64)
def _row_bytes(schema: pa.Schema) -> int | None:
    """Bytes a row takes at most if every column has a fixed width (values and validity bit), else None."""
    try:
        return sum((f.type.bit_width + 8) // 8 for f in schema)
    except ValueError:  # a variable-width column
        return None


def _nbytes(table: pa.Table) -> int:
    """A table's Arrow bytes (at most); pyarrow's exact `nbytes` costs 5-16 µs even for a 1-row slice."""
    width = _row_bytes(table.schema)
    return table.nbytes if width is None else table.num_rows * width


@dataclass
class _InFlight:
    """One admitted, unacknowledged batch: what to (re-)send and whom to tell."""

    stream: str
    batch_id: int
    table: pa.Table
    future: asyncio.Future[PushResult]
    rows: pb.RowData | None = None  # the batch as protobuf Rows (a client without Arrow), encoded at admission

    @property
    def num_rows(self) -> int:
        return self.table.num_rows


class AsyncClient:
    """asyncio client for a streamtx server.

    Use as `async with AsyncClient(...) as c:`; all methods must be awaited on
    the loop the client is first used on. Every gRPC failure surfaces as a
    `streamtx.errors.StreamTxError` subclass, never as a raw grpc.RpcError.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        token: str | None = None,
        producer_id: str | None = None,
        max_in_flight: int = 256,
        arrow: bool = True,
        retries: int = 5,
        timeout: float | None = None,
        tls_ca: str | bytes | Path | None = None,
        tls_cert: str | bytes | Path | None = None,
        tls_key: str | bytes | Path | None = None,
    ) -> None:
        """`target`: HOST:PORT, or several comma-separated (the hosts of a cluster, docs/cluster.md): the
        client uses the first and, when a connection fails (UNAVAILABLE), moves to the next and re-sends
        every unacknowledged batch there with its batch id, so each is taken once (committed, or DUPLICATE
        with the original outcome). `token`: sent as `authorization: Bearer <token>`. `tls_ca` (PEM bytes or
        a path): connect over TLS, trusting the server certificate it signed; `tls_cert`/`tls_key`: the
        client's certificate for a server that asks for one (mutual TLS). Neither: plaintext."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.targets = targets_of(target)
        self.target = self.targets[0]
        self.producer_id = producer_id or str(uuid.uuid4())
        self.max_in_flight = max_in_flight
        self.arrow = arrow
        self.retries = retries
        self.timeout = timeout
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._credentials = channel_credentials(tls_ca, tls_cert, tls_key)
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.StreamTxStub | None = None
        self._closed = False
        self._next_batch: dict[str, int] = {}
        # Pipelining state (created on the loop, on first push).
        self._window: asyncio.Semaphore | None = None
        self._seq = itertools.count()
        self._inflight: dict[int, _InFlight] = {}  # send order = insertion order
        self._by_key: dict[BatchKey, collections.deque[int]] = {}
        self._sendq: asyncio.Queue[int | None] | None = None  # seqs of _inflight to send
        self._pipe_task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> AsyncClient:
        self._ensure_stub()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.close(flush=exc_type is None)

    async def close(self, flush: bool = True) -> None:
        """Closes the connection; by default first waits for every in-flight batch's ack."""
        if self._closed:
            return
        if flush and self._inflight:
            with contextlib.suppress(Exception):
                await self.flush()
        self._closed = True
        task = self._pipe_task
        if task is not None and not task.done():
            if self._sendq is not None:
                self._sendq.put_nowait(None)  # half-close: the server ends the stream
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=1.0)
        self._fail_all(errors.Unavailable("client closed before the batch was acknowledged"))
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None

    def _ensure_stub(self) -> pb_grpc.StreamTxStub:
        if self._closed:
            raise errors.FailedPrecondition("client is closed")
        if self._stub is None:
            options = [
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                # Reconnect quickly after a server restart so push retries can succeed. (Not
                # min_reconnect_backoff_ms: gRPC core also takes it as the minimum connect timeout.)
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 2000),
            ]
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self.target, options=options)
            else:
                self._channel = grpc.aio.secure_channel(self.target, self._credentials, options=options)
            self._stub = pb_grpc.StreamTxStub(self._channel)
        return self._stub

    def _fail_over(self) -> bool:
        """After a broken connection: the next of several targets, on a new channel (one target: kept).

        True when every target has had its turn since the first (so a retry counts, and waits its
        backoff): a dead host among live ones costs a switch, not the retries.
        """
        if len(self.targets) < 2 or self._closed:
            return True
        self.target, wrapped = next_target(self.targets, self.target)
        old, self._channel, self._stub = self._channel, None, None
        if old is not None:
            asyncio.get_running_loop().create_task(old.close())
        return wrapped

    # -- unary calls -----------------------------------------------------------

    async def _unary(self, name: str, request: Message, *, retry: bool) -> Any:
        """Calls one unary RPC, mapping errors; retries UNAVAILABLE only when `retry`.

        An `Overloaded` refusal (nothing was taken) is tried again after the
        server's hint for as long as `timeout` allows, without counting as a retry.
        """
        attempt = 0
        loop = asyncio.get_running_loop()
        give_up = None if self.timeout is None else loop.time() + self.timeout
        while True:
            fn = getattr(self._ensure_stub(), name)
            try:
                return await fn(request, metadata=self._metadata, timeout=self.timeout)
            except grpc.aio.AioRpcError as e:
                if retry and e.code() == grpc.StatusCode.UNAVAILABLE and attempt < self.retries:
                    if not self._fail_over():
                        continue
                    await asyncio.sleep(_backoff(attempt))
                    attempt += 1
                    continue
                error = _mapped(e)
                if isinstance(error, errors.Overloaded):
                    pause = error.retry_after * random.uniform(1.0, 1.5)
                    if give_up is None or loop.time() + pause < give_up:
                        await asyncio.sleep(pause)
                        continue
                raise error from None

    async def deploy(self, sql: str) -> DeployResult:
        """Deploys a script (DDL, streams, windows, procedures, triggers) atomically."""
        resp = await self._unary("Deploy", pb.DeployRequest(sql=sql), retry=False)
        return DeployResult.from_proto(resp)

    async def explain(self, name: str) -> list[StatementPlan]:
        """How each SQL statement of a procedure or EE trigger runs: compiled, or in DuckDB and why."""
        resp = await self._unary("Explain", pb.ExplainRequest(name=name), retry=True)
        return [StatementPlan.from_proto(p) for p in resp.statements]

    async def call(self, procedure: str, **params: Any) -> list[Result]:
        """Runs an OLTP procedure; one Result per result-producing statement.

        Not retried: a call may have committed before the connection broke.
        """
        req = pb.CallRequest(procedure=procedure, params=wire.params_to_proto(params))
        resp = await self._unary("Call", req, retry=False)
        return [rowdata_to_result(r, f"{procedure} result {i}") for i, r in enumerate(resp.results)]

    async def query(self, sql: str, params: Mapping[str, Any] | None = None) -> Result:
        """Read-only SQL over the committed state; `params` are bound as `$name`."""
        req = pb.QueryRequest(sql=sql, params=wire.params_to_proto(params))
        resp = await self._unary("Query", req, retry=True)
        return rowdata_to_result(resp.result, "query result")

    async def checkpoint(self) -> dict[str, Any]:
        """Admin: takes an online checkpoint of every partition now; returns where each was written."""
        resp = await self._unary("Checkpoint", pb.CheckpointRequest(), retry=False)
        return message_to_dict(resp)

    async def rebalance(
        self,
        moves: Sequence[tuple[int, int, int]] = (),
        *,
        even: bool = False,
        strategy: str | None = None,
        bins_per_step: int | None = None,
        resume: bool = False,
        partitions: int | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Admin: moves bins (first, last, partition) between partitions, or spreads them `even`ly,
        or grows or shrinks the server to `partitions` partitions (bins spread evenly), while the
        server runs; yields the progress before the first step and after each.

        `strategy`: "all-at-once" (one step, the default), "fluid" (a bin per
        step) or "batched" (`bins_per_step` per step, 16 by default). Each step
        is atomic and durable; leaving the iteration early stops after the step
        under way, and the migration is then interrupted (Status
        `rebalance_interrupted`, kept across restarts): `resume=True` finishes
        it, with its strategy unless one is given.
        """
        request = pb.RebalanceRequest(
            moves=[pb.BinMove(first_bin=f, last_bin=la, partition=p) for f, la, p in moves],
            even=even,
            strategy=strategy or "",
            bins_per_step=bins_per_step or 0,
            resume=resume,
            partitions=partitions or 0,
        )
        call = self._ensure_stub().Rebalance(request, metadata=self._metadata)
        try:
            async for progress in call:
                yield message_to_dict(progress)
        except grpc.aio.AioRpcError as e:
            raise _mapped(e) from None
        finally:
            call.cancel()

    async def status(self) -> dict[str, Any]:
        """Server version, partitions, catalog and counters as a plain dict."""
        resp = await self._unary("Status", pb.StatusRequest(), retry=True)
        return message_to_dict(resp)

    async def subscribe(self, stream: str, from_ts: int = 0) -> AsyncIterator[tuple[int, Result]]:
        """Yields (ts, Result) for the committed batches of `stream`, in timestamp order.

        `ts` is the timestamp of the command whose TEs emitted the rows (a
        push's ack `timestamp`); 0 starts at the oldest retained. The
        iteration follows the stream live and does not end by itself; wrap it
        in `contextlib.aclosing` to cancel the call when breaking out early. A
        broken connection (UNAVAILABLE) is resumed after the last delivered
        ts, up to `retries` times in a row.
        """
        next_ts = from_ts
        attempt = 0
        while True:
            call = self._ensure_stub().Subscribe(
                pb.SubscribeRequest(stream=stream, from_ts=next_ts),
                metadata=self._metadata,
            )
            try:
                async for batch in call:
                    attempt = 0
                    next_ts = batch.ts + 1
                    yield batch.ts, rowdata_to_result(batch.data, f"{stream} batch")
                return
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE and attempt < self.retries:
                    if not self._fail_over():
                        continue
                    await asyncio.sleep(_backoff(attempt))
                    attempt += 1
                    continue
                raise _mapped(e) from None
            finally:
                call.cancel()

    # -- pushes ----------------------------------------------------------------

    def _batch_id(self, stream: str, batch_id: int | None) -> int:
        """The next per-stream batch id; explicit ids move the counter past them."""
        nxt = self._next_batch.get(stream, 1)
        if batch_id is None:
            batch_id = nxt
        self._next_batch[stream] = max(nxt, batch_id + 1)
        return batch_id

    def _encode(self, rows: Any) -> tuple[pb.RowData, int]:
        table = to_table(rows)
        return wire.encode_rowdata(table, arrow=self.arrow), table.num_rows

    async def push_one(self, stream: str, rows: Any, *, batch_id: int | None = None) -> PushResult:
        """Pushes one batch with a unary call and waits for its outcome.

        Simple but one round trip per batch; use `push` for throughput. Retried
        on UNAVAILABLE with the same batch id (dedup makes that safe).
        """
        data, nrows = self._encode(rows)
        req = pb.PushRequest(
            stream=stream,
            producer_id=self.producer_id,
            batch_id=self._batch_id(stream, batch_id),
            data=data,
        )
        ack = await self._unary("Push", req, retry=True)
        return PushResult.from_ack(ack, rows=nrows)

    async def push(self, stream: str, rows: Any, *, batch_id: int | None = None) -> asyncio.Future[PushResult]:
        """Sends one atomic batch on the shared PushStream; returns a future of its ack.

        Awaiting `push` waits only for admission (fewer than `max_in_flight`
        batches unacknowledged); await the returned future for the outcome.
        Batch ids are assigned at admission, so they follow the send order; the
        server takes a producer's batches in batch-id order starting at 1.

        If the stream breaks, unacknowledged batches are re-sent with the same
        ids; one that had been applied before the break then resolves as
        "duplicate" with `original == "committed"`. If the stream cannot be
        re-established within `retries` attempts, the futures fail with the
        mapped StreamTxError (Unavailable for transport failures).
        """
        self._ensure_stub()
        table = to_table(rows)
        # encoded before it takes a batch id: a value Rows cannot carry raises here, not in the writer
        data = None if self.arrow else wire.encode_rowdata(table, arrow=False)
        if self._window is None:
            self._window = asyncio.Semaphore(self.max_in_flight)
        await self._window.acquire()
        if self._closed:
            self._window.release()
            raise errors.FailedPrecondition("client is closed")
        future = asyncio.get_running_loop().create_future()
        entry = _InFlight(stream, self._batch_id(stream, batch_id), table, future, data)
        seq = next(self._seq)
        self._inflight[seq] = entry
        key: BatchKey = (stream, self.producer_id, entry.batch_id)
        self._by_key.setdefault(key, collections.deque()).append(seq)
        entry.future.add_done_callback(lambda _f, seq=seq, key=key: self._forget(seq, key))
        if self._pipe_task is None or self._pipe_task.done():
            self._sendq = asyncio.Queue()
            self._pipe_task = asyncio.get_running_loop().create_task(self._run_pipe(), name="streamtx-push-stream")
            # _run_pipe (re-)sends everything in self._inflight, including this batch.
        else:
            assert self._sendq is not None
            self._sendq.put_nowait(seq)
            if self._sendq.qsize() >= PACK_YIELD:
                # a producer whose window has room never yields: without this, its whole window
                # would leave as one message, after the last batch, and the server would get
                # nothing while it is being filled
                await asyncio.sleep(0)
        return entry.future

    @property
    def in_flight(self) -> int:
        """Batches admitted and not yet acknowledged."""
        return len(self._inflight)

    async def flush(self) -> list[PushResult]:
        """Waits for every batch in flight now; returns their results in send order.

        Raises the first failure (e.g. the stream could not be re-established)
        after all of them have settled.
        """
        futures = [e.future for e in self._inflight.values()]
        if not futures:
            return []
        settled = await asyncio.gather(*futures, return_exceptions=True)
        for r in settled:
            if isinstance(r, BaseException):
                raise r
        return list(settled)

    def _forget(self, seq: int, key: BatchKey) -> _InFlight | None:
        """Drops a batch from the books and frees its window slot (idempotent).

        Runs synchronously when an ack or failure settles the batch (so the
        pipe never re-sends a settled batch), and again as the future's done
        callback, which covers a caller cancelling the future.
        """
        entry = self._inflight.pop(seq, None)
        if entry is not None:
            seqs = self._by_key.get(key)
            if seqs is not None:
                with contextlib.suppress(ValueError):
                    seqs.remove(seq)
                if not seqs:
                    del self._by_key[key]
            if self._window is not None:
                self._window.release()
        return entry

    def _on_ack(self, ack: pb.PushAck) -> None:
        for i in range(max(ack.count, 1)):
            key: BatchKey = (ack.stream, ack.producer_id, ack.batch_id + i)
            seqs = self._by_key.get(key)
            if not seqs:
                continue  # not ours (or already settled): nothing waits for it
            entry = self._forget(seqs[0], key)
            if entry is not None and not entry.future.done():
                entry.future.set_result(PushResult.from_ack(ack, rows=entry.num_rows, index=i))

    def _fail_all(self, exc: BaseException) -> None:
        for seq, entry in list(self._inflight.items()):
            self._forget(seq, (entry.stream, self.producer_id, entry.batch_id))
            if not entry.future.done():
                entry.future.set_exception(exc)
                # Mark retrieved: a caller may drop futures it does not care about.
                entry.future.exception()

    async def _run_pipe(self) -> None:
        """Owns the PushStream call: (re)opens it, re-sends unacked batches, reads acks."""
        failures = 0
        while not self._closed:
            stub = self._ensure_stub()
            queue: asyncio.Queue[int | None] = asyncio.Queue()
            for seq in self._inflight:
                queue.put_nowait(seq)
            self._sendq = queue  # from here on, push() enqueues for this call
            call = stub.PushStream(metadata=self._metadata)
            writer = asyncio.get_running_loop().create_task(self._write(call, queue))
            acked = 0
            exc: errors.StreamTxError | None = None
            transport = True
            try:
                while True:
                    ack = await call.read()
                    if ack is grpc.aio.EOF:
                        break
                    acked += 1
                    self._on_ack(ack)
            except grpc.aio.AioRpcError as e:
                exc = _mapped(e)
                transport = e.code() == grpc.StatusCode.UNAVAILABLE
                if e.code() == grpc.StatusCode.INTERNAL and e.details() == _CORE_INTERNAL:
                    cause = await self._probe_cause()
                    transport = cause is None
                    exc = cause or errors.Unavailable("push stream broke while sending (the server ended the call)")
            finally:
                writer.cancel()
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await writer
            if not self._inflight:
                return  # nothing owed: the next push opens a new call
            if exc is None:
                exc = errors.Unavailable(f"push stream ended with {len(self._inflight)} unacknowledged batch(es)")
            if acked:
                failures = 0
            if self._closed or not transport or failures >= self.retries:
                self._fail_all(exc)
                return
            if not self._fail_over():
                continue
            await asyncio.sleep(_backoff(failures))
            failures += 1

    async def _probe_cause(self) -> errors.StreamTxError | None:
        """Asks a unary call why the server may have refused the stream.

        When a write races the end of a call, grpc.aio replaces the server's
        status with INTERNAL "Internal error from Core", losing e.g. an
        UNAUTHENTICATED. A Stage call naming no stream, with the same
        credentials, needs the same role as a push and changes nothing: it
        recovers refusals that will not go away by retrying; anything else is
        treated as a broken connection.
        """
        if self._stub is None:
            return None
        try:
            await self._stub.Stage(pb.StageRequest(), metadata=self._metadata, timeout=5)
        except grpc.aio.AioRpcError as e:
            if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                return errors.error_for(e.code(), (e.details() or "").replace("Stage is", "PushStream is", 1))
        return None

    async def _write(self, call: Any, queue: asyncio.Queue[int | None]) -> None:
        """The single writer of one call (gRPC allows one outstanding write).

        Takes everything queued while the previous write was under way, so
        a busy producer's batches leave packed, several to a message.
        """
        with contextlib.suppress(Exception):
            while True:
                seqs = [await queue.get()]
                while seqs[-1] is not None and not queue.empty() and len(seqs) < PACK_MAX_BATCHES:
                    seqs.append(queue.get_nowait())
                closing = seqs[-1] is None
                entries = [e for seq in seqs if seq is not None and (e := self._inflight.get(seq)) is not None]
                for request in self._messages(entries):
                    await call.write(request)
                if closing:
                    await call.done_writing()
                    return

    def _messages(self, entries: list[_InFlight]) -> list[pb.PushRequest]:
        """Requests for batches in send order; runs of one stream with consecutive ids share a message."""
        runs: list[list[_InFlight]] = []
        size = 0
        for e in entries:
            last = runs[-1][-1] if runs else None
            nbytes = _nbytes(e.table)
            if (
                last is not None
                and self.arrow
                and e.stream == last.stream
                and e.batch_id == last.batch_id + 1
                and size + nbytes <= PACK_MAX_BYTES
                and e.table.schema.equals(last.table.schema)
            ):
                runs[-1].append(e)
                size += nbytes
            else:
                runs.append([e])
                size = nbytes
        return [self._message(run) for run in runs]

    def _message(self, run: list[_InFlight]) -> pb.PushRequest:
        first = run[0]
        req = pb.PushRequest(stream=first.stream, producer_id=self.producer_id, batch_id=first.batch_id)
        if len(run) == 1:
            req.data.CopyFrom(wire.encode_rowdata(first.table) if first.rows is None else first.rows)
            return req
        table = pa.concat_tables([e.table for e in run]).combine_chunks()
        req.data.CopyFrom(wire.encode_rowdata(table))
        req.batch_rows.extend(e.num_rows for e in run)
        return req
