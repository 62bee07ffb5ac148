"""One exception per gRPC status the server returns, shared by server and client.

The server raises these; the front maps them onto a gRPC status with the same
message. The client maps a status back onto the same class, so a caller can
catch `StreamTxError` or the precise kind.
"""

from __future__ import annotations

import grpc


class StreamTxError(Exception):
    """Base class; `code` is the gRPC status code carried on the wire."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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


def error_for(code: grpc.StatusCode | int, message: str) -> StreamTxError:
    """The exception for a status code (a grpc.StatusCode or its integer value)."""
    if isinstance(code, int):
        code = _BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    cls = _BY_CODE.get(code, StreamTxError)
    err = cls(message)
    if cls is StreamTxError:
        err.code = code
    return err


FAULTS = (Unavailable, Internal, DataLoss)
"""The server's own failures. Never a batch's rejection: a push that meets one is answered
with that status, not a REJECTED ack, and the client sends it again."""
