"""One exception per gRPC status the server returns, shared by server and client.

The server raises these; the front maps them onto a gRPC status with the same
message. The client maps a status back onto the same class, so a caller can
catch `StreamTxError` or the precise kind.
"""

from __future__ import annotations

from typing import Any

import grpc


class StreamTxError(Exception):
    """Base class; `code` is the gRPC status code carried on the wire."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def trailers(self) -> tuple[tuple[str, str], ...]:
        """Trailing metadata the status carries (see `Overloaded`)."""
        return ()


class InvalidArgument(StreamTxError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(StreamTxError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(StreamTxError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(StreamTxError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(StreamTxError):
    """A transaction aborted (by the procedure, or by a constraint); nothing changed."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(StreamTxError):
    code = grpc.StatusCode.OUT_OF_RANGE


class ResourceExhausted(StreamTxError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


RETRY_AFTER_KEY = "retry-after-ms"
"""Trailing metadata of an `Overloaded` refusal: milliseconds after which trying again is likely to succeed."""


class Overloaded(ResourceExhausted):
    """The server is at its admission limit; nothing was taken. Retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def trailers(self) -> tuple[tuple[str, str], ...]:
        return ((RETRY_AFTER_KEY, str(max(1, round(self.retry_after * 1000)))),)


class Unauthenticated(StreamTxError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(StreamTxError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(StreamTxError):
    """The server or one of its partitions is not serving (retryable for pushes)."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(StreamTxError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Internal(StreamTxError):
    code = grpc.StatusCode.INTERNAL


class DataLoss(StreamTxError):
    """What was done is known, but its result is not: a call that committed while its answer was lost."""

    code = grpc.StatusCode.DATA_LOSS


_BY_CODE: dict[grpc.StatusCode, type[StreamTxError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        ResourceExhausted,
        Unauthenticated,
        PermissionDenied,
        Unavailable,
        DeadlineExceeded,
        Internal,
        DataLoss,
    )
}

_BY_VALUE: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def error_for(code: grpc.StatusCode | int, message: str, trailers: Any = ()) -> StreamTxError:
    """The exception for a status code (a grpc.StatusCode or its integer value) and its trailing metadata."""
    if isinstance(code, int):
        code = _BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        hint = dict(trailers or ()).get(RETRY_AFTER_KEY)
        if hint is not None and hint.isdigit():
            return Overloaded(message, int(hint) / 1000)
    cls = _BY_CODE.get(code, StreamTxError)
    err = cls(message)
    if cls is StreamTxError:
        err.code = code
    return err


FAULTS = (Unavailable, Internal, DataLoss)
"""The server's own failures. Never a batch's rejection: a push that meets one is answered
with that status, not a REJECTED ack, and the client sends it again."""
