"""Errors of the durability layer.

Every message names the file, the byte offset and, where one applies, the LSN,
so that an operator can look at the exact bytes. A corrupt log or checkpoint is
never repaired silently: only a torn final record (the one expected result of a
crash during an append) is dropped, see `streamtx.recovery.log`.
"""

from __future__ import annotations


class CorruptLog(ValueError):
    """The command log is damaged somewhere other than its torn final record.

    Recovery must stop: replaying past the damage would skip acknowledged
    transactions. `path`, `offset` and `lsn` locate the damage (`offset` and
    `lsn` are None when the damage is not at one record, e.g. a missing segment).
    """

    def __init__(self, message: str, path: str | None = None, offset: int | None = None, lsn: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.lsn = lsn


class UnreadableFormat(CorruptLog):
    """A segment holds payloads in a format this reader was not given (a log of another release).

    Nothing is damaged: the records are intact, but replaying them as another
    format would misread them, so recovery refuses to start, naming the file.
    """


class LogFailed(RuntimeError):
    """A write or fsync of the command log failed; the log refuses all further use.

    After a failed fsync the kernel may have dropped the dirty pages, so
    retrying could report durable what is not: the only safe reaction is to
    stop, restart and recover from what is on disk.
    """


class CorruptCheckpoint(ValueError):
    """A complete checkpoint (one with a manifest) does not match its manifest."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path
