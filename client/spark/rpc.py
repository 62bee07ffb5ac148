"""The few calls the Spark connector makes, over a plain blocking gRPC stub.

Executors and the commit runner are short-lived Python workers: a small
synchronous helper (no event loop, no background threads) is all they need.
Transport failures (UNAVAILABLE, DEADLINE_EXCEEDED) are retried with the same
request: every call here is idempotent — a staged chunk replaces its earlier
copy, and a re-sent commit is answered DUPLICATE with the original outcome.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pyarrow as pa

from streamtx.client.async_client import channel_credentials, next_target, targets_of
from streamtx.errors import Unavailable, error_for
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import encode_rowdata, ipc_to_table

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class Conn:
    """One channel to the server, with retries on transport errors."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 60.0,
        retry_for_s: float = 30.0,
        token: str | None = None,
        tls_ca: bytes | None = None,
        tls_cert: bytes | None = None,
        tls_key: bytes | None = None,
    ) -> None:
        """`target`: HOST:PORT, or several comma-separated (a cluster's hosts): a call that fails on the
        transport moves to the next. `token` goes as `authorization: Bearer`; `tls_ca` (PEM) makes it TLS,
        `tls_cert`/`tls_key` mutual TLS."""
        self.targets = targets_of(target)
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._credentials = channel_credentials(tls_ca, tls_cert, tls_key)
        self._open(self.targets[0])
        self.retries = 0

    def _open(self, target: str) -> None:
        self.target = target
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ]
        if self._credentials is None:
            self.channel = grpc.insecure_channel(target, options=options)
        else:
            self.channel = grpc.secure_channel(target, self._credentials, options=options)
        self.stub = pb_grpc.StreamTxStub(self.channel)

    def _fail_over(self) -> bool:
        """The next target on a new channel; True when every target has had its turn (time to back off)."""
        if len(self.targets) < 2:
            return True
        target, wrapped = next_target(self.targets, self.target)
        self.channel.close()
        self._open(target)
        return wrapped

    def ready(self, timeout_s: float) -> bool:
        """Whether the first target accepts a connection within `timeout_s`."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout_s)
            return True
        except grpc.FutureTimeoutError:
            return False

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, request: Any, what: str) -> Any:
        """The RPC `method` with `request`, re-sent on transport errors (to the next target, if several) until
        `retry_for_s` has passed."""
        deadline = time.monotonic() + self.retry_for_s
        delay = 0.05
        while True:
            try:
                return getattr(self.stub, method)(request, timeout=self.timeout_s, metadata=self.metadata)
            except grpc.RpcError as e:
                code = e.code()
                if code in RETRYABLE and time.monotonic() < deadline:
                    self.retries += 1
                    if self._fail_over():
                        time.sleep(delay)
                        delay = min(delay * 2, 1.0)
                    continue
                if code in RETRYABLE:
                    raise Unavailable(f"{what}: streamtx server at {self.target} unreachable: {e.details()}") from None
                raise error_for(code, f"{what}: {e.details()}") from None

    # ------------------------------------------------------------------ calls
    def describe(self, stream: str, complete_through: bool = False) -> pb.DescribeStreamResponse:
        request = pb.DescribeStreamRequest(stream=stream, with_complete_through=complete_through)
        return self.call("DescribeStream", request, f"stream {stream!r}")

    def stage_future(self, stream: str, staging_id: str, part: str, chunk: int, table: pa.Table) -> Any:
        """Starts a Stage call; `finish_stage` waits for it (so chunks are pipelined)."""
        request = pb.StageRequest(
            stream=stream, staging_id=staging_id, part=part, chunk=chunk, data=encode_rowdata(table)
        )
        return request, self.stub.Stage.future(request, timeout=self.timeout_s, metadata=self.metadata)

    def finish_stage(self, started: Any) -> pb.StageResponse:
        request, fut = started
        try:
            return fut.result()
        except grpc.RpcError as e:
            if e.code() not in RETRYABLE:
                raise error_for(e.code(), f"stage to {request.stream!r}: {e.details()}") from None
        return self.call("Stage", request, f"stage to {request.stream!r}")

    def commit(
        self, stream: str, staging_id: str, producer: str, batch_id: int, parts: list[tuple[str, int, int]]
    ) -> pb.PushAck:
        request = pb.CommitStagedRequest(
            stream=stream,
            staging_id=staging_id,
            producer_id=producer,
            batch_id=batch_id,
            parts=[pb.StagedPart(part=p, chunks=c, rows=r) for p, c, r in parts],
        )
        return self.call("CommitStaged", request, f"commit of {stream!r} batch {batch_id}")

    def abort(self, stream: str, staging_id: str) -> int:
        request = pb.AbortStagedRequest(stream=stream, staging_id=staging_id)
        return self.call("AbortStaged", request, f"abort of {stream!r} ({staging_id})").parts

    def read(self, stream: str, from_ts: int, to_ts: int) -> Iterator[tuple[int, pa.Table]]:
        """Every batch of `stream` with a timestamp in [from_ts, to_ts), in order, as (ts, rows)."""
        nxt = from_ts
        while to_ts <= 0 or nxt < to_ts:
            request = pb.ReadStreamRequest(stream=stream, from_ts=nxt, to_ts=to_ts, max_batches=64)
            reply = self.call("ReadStream", request, f"read of {stream!r}")
            for b in reply.batches:
                yield b.ts, ipc_to_table(b.data.arrow_ipc, f"read of {stream!r}")
                nxt = b.ts + 1
            if not reply.more:
                return


def ack_text(ack: pb.PushAck) -> str:
    name = pb.Outcome.Name(ack.outcome)
    if ack.outcome == pb.DUPLICATE:
        name += f" (originally {pb.Outcome.Name(ack.original)})"
    return f"{name}{': ' + ack.reason if ack.reason else ''}"


__all__ = ["Conn", "ack_text"]
