"""The per-partition command log: append-only segments, group commit, replay.

Guarantees (precise, and the only ones):

- `append` returns an LSN; LSNs are 1, 2, 3, ... with no gap, in append order.
- A record is *durable* once `durable_lsn >= lsn`: its bytes, and every record
  before it, were written and `fdatasync`-ed (and the directory `fsync`-ed
  after the segment holding it was created). A durable record is returned by
  every later replay, byte for byte, unless the storage itself corrupts
  fsynced data (then replay raises `CorruptLog`, except in the one case below).
- Records are made durable by *group commit*: a background flusher thread
  writes and syncs everything buffered once `group_bytes` are buffered or the
  oldest buffered record is `group_ms` old, whichever comes first, or at once
  on `flush()` (which waits) or `flush_soon()` (which does not: the appender
  calls it when it has nothing more to add, so an idle partition does not
  hold its last records for `group_ms`). One fsync covers the whole group.
- A crash can leave the last segment ending in a torn record (a short header,
  a short payload, a checksum mismatch in a record that reaches the end of the
  data, or a zero-filled tail). Such a record was never reported durable; it is
  ignored by readers and cut off (`ftruncate` + fsync) when the log is opened
  for appending. The price: a corruption of the very last durable record is
  indistinguishable from a tear and drops that record too.
- Any other damage (a checksum mismatch with valid data after it, an LSN gap
  or repeat, a missing segment, a bad segment header) raises `CorruptLog`
  naming the file, the byte offset and the LSN.
- After a failed write or fsync the log raises `LogFailed` forever: a failed
  fsync cannot be retried safely.

The log is meant for one executing thread (the partition's) appending, plus its
own flusher thread. It is not safe for two processes to append to one directory.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from streamtx.recovery.errors import CorruptLog, LogFailed, UnreadableFormat
from streamtx.recovery.records import (
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    Record,
    checksum,
    decode_record_header,
    decode_segment_header,
    encode_record,
    encode_segment_header,
)

SEGMENT_RE = re.compile(r"^log-(\d{20})\.seg$")


def segment_name(first_lsn: int) -> str:
    """The file name of the segment whose first record has LSN `first_lsn`."""
    return f"log-{first_lsn:020d}.seg"


def fsync_dir(directory: Path) -> None:
    """Makes the creation, rename or removal of entries in `directory` survive a power loss."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir(path: Path) -> None:
    """Creates `path` (and parents) durably: each new entry is fsynced into its parent, so
    fsynced files inside cannot vanish with a directory that never reached the disk."""
    if path.is_dir():
        return
    make_dir(path.parent)
    path.mkdir(exist_ok=True)
    fsync_dir(path.parent)


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(first_lsn, path) of every segment in `directory`, in LSN order; other files are ignored."""
    if not directory.is_dir():
        return []
    found = []
    for entry in os.scandir(directory):
        m = SEGMENT_RE.match(entry.name)
        if m and entry.is_file():
            found.append((int(m.group(1)), Path(entry.path)))
    found.sort()
    return found


@dataclass(frozen=True, slots=True)
class TornTail:
    """What a reader dropped at the end of the last segment: it starts at `offset`, `size` bytes."""

    path: Path
    offset: int
    size: int
    lsn: int
    reason: str


@dataclass(slots=True)
class _Scan:
    """Result of validating one segment: where its valid records end."""

    first_lsn: int
    next_lsn: int
    valid_end: int
    torn: TornTail | None
    header_torn: bool = False
    payload_format: int = 0


def _nonzero_end(data: memoryview) -> int:
    """Offset just past the last non-zero byte (a crash may leave a zero-filled tail)."""
    return len(bytes(data).rstrip(b"\0"))


def _scan(
    path: Path, data: memoryview, expect_first: int, is_last: bool, emit: Callable[[Record], None] | None = None
) -> _Scan:
    """Validates a segment's bytes and passes each record to `emit`. Raises CorruptLog on damage,
    except a torn final record (or torn segment header) when `is_last`."""
    name = path.name
    if len(data) < SEGMENT_HEADER_SIZE or isinstance(decode_segment_header(data), str):
        problem = decode_segment_header(data)
        assert isinstance(problem, str)
        if is_last and _nonzero_end(data) <= SEGMENT_HEADER_SIZE:
            reason = f"torn segment header ({problem})"
            return _Scan(expect_first, expect_first, 0, TornTail(path, 0, len(data), expect_first, reason), True)
        raise CorruptLog(f"{name}: offset 0: {problem}", str(path), 0, None)
    first_lsn, _created, payload_format = decode_segment_header(data)  # type: ignore[misc]
    if first_lsn != expect_first:
        raise CorruptLog(
            f"{name}: offset 0: segment header says first lsn {first_lsn}, the file name says {expect_first}",
            str(path),
            0,
            first_lsn,
        )
    pos = SEGMENT_HEADER_SIZE
    lsn = first_lsn
    size = len(data)
    while pos < size:
        torn = None
        if size - pos < RECORD_HEADER_SIZE:
            torn = f"short record header ({size - pos} of {RECORD_HEADER_SIZE} bytes)"
            end = size
        else:
            h = decode_record_header(data, pos)
            end = pos + RECORD_HEADER_SIZE + h.payload_len
            if not h.header_ok:
                torn = "record header checksum mismatch"
                end = pos + RECORD_HEADER_SIZE
            elif h.lsn != lsn:
                raise CorruptLog(
                    f"{name}: offset {pos}: record has lsn {h.lsn}, expected {lsn} (LSNs must be consecutive)",
                    str(path),
                    pos,
                    h.lsn,
                )
            elif end > size:
                torn = f"short payload ({size - pos - RECORD_HEADER_SIZE} of {h.payload_len} bytes)"
            elif checksum(data[pos + RECORD_HEADER_SIZE : end]) != h.payload_crc:
                torn = "payload checksum mismatch"
        if torn is not None:
            if is_last and _nonzero_end(data[pos:]) <= end - pos:
                return _Scan(first_lsn, lsn, pos, TornTail(path, pos, size - pos, lsn, torn), False, payload_format)
            why = (
                "and data follows it: corrupt, not torn"
                if is_last
                else "in a sealed segment (only the last segment may end in a torn record)"
            )
            raise CorruptLog(
                f"{name}: offset {pos}: record lsn {lsn}: {torn}, {why}",
                str(path),
                pos,
                lsn,
            )
        if emit is not None:
            emit(Record(lsn, h.kind, h.ts, bytes(data[pos + RECORD_HEADER_SIZE : end])))
        pos = end
        lsn += 1
    return _Scan(first_lsn, lsn, pos, None, payload_format=payload_format)


def _read(path: Path) -> memoryview:
    with open(path, "rb") as f:
        return memoryview(f.read())


class LogReader:
    """A validated view of a log directory for replay.

    Opening scans only the last segment (to find where the log ends and whether
    its tail is torn); `records()` validates every segment it reads. Counting is
    free: LSNs are consecutive, so `total(from_lsn)` is a subtraction.
    """

    def __init__(self, directory: str | os.PathLike[str], payload_formats: Collection[int] | None = None) -> None:
        """`payload_formats`: the segment formats to read (None: any); another is `UnreadableFormat`, raised
        here for any segment whose header says so (the header alone is read), so before anything is replayed."""
        self.directory = Path(directory)
        self.payload_formats = payload_formats
        self.segments = list_segments(self.directory)
        if payload_formats is not None:
            for first, path in self.segments[:-1]:
                with open(path, "rb") as f:
                    header = decode_segment_header(f.read(SEGMENT_HEADER_SIZE))
                if not isinstance(header, str):
                    self._check_format(path, _Scan(first, first, 0, None, payload_format=header[2]))
        self.torn: TornTail | None = None
        if not self.segments:
            self.first_lsn = self.next_lsn = 1
            return
        self.first_lsn = self.segments[0][0]
        first, path = self.segments[-1]
        scan = _scan(path, _read(path), first, is_last=True)
        self._check_format(path, scan)
        self.torn = scan.torn
        self.next_lsn = scan.next_lsn
        self._last_scan = scan

    def _check_format(self, path: Path, scan: _Scan) -> None:
        formats = self.payload_formats
        if formats is None or scan.header_torn or scan.payload_format in formats:
            return
        raise UnreadableFormat(
            f"{path.name}: its records are in payload format {scan.payload_format}, and this reader takes "
            f"format {', '.join(map(str, sorted(formats)))}: the log was written by another release",
            str(path),
            0,
            scan.first_lsn,
        )

    @property
    def last_lsn(self) -> int:
        """LSN of the last valid record (first_lsn - 1 when there is none)."""
        return self.next_lsn - 1

    def total(self, from_lsn: int | None = None) -> int:
        """How many records `records(from_lsn)` will yield."""
        start = self.first_lsn if from_lsn is None else from_lsn
        return max(0, self.next_lsn - start)

    def replay(self, from_lsn: int | None = None) -> Iterator[tuple[int, int, Record]]:
        """`records(from_lsn)` as (done, total, record): progress for free, done counts from 1."""
        total = self.total(from_lsn)
        for done, record in enumerate(self.records(from_lsn), 1):
            yield done, total, record

    def records(self, from_lsn: int | None = None) -> Iterator[Record]:
        """Every valid record with LSN >= `from_lsn` (default: the first kept), in LSN order.

        Raises CorruptLog if a record from `from_lsn` on cannot be returned: the
        log was truncated past it, a segment is missing, or any damage other
        than a torn tail. A checkpoint at LSN L replays `records(L + 1)`.
        """
        start = self.first_lsn if from_lsn is None else from_lsn
        directory = str(self.directory)
        if start < 1:
            raise ValueError(f"from_lsn must be >= 1, got {start}")
        if start > self.next_lsn:
            raise CorruptLog(
                f"{directory}: replay asked from lsn {start} but the log ends at lsn {self.next_lsn - 1} "
                "(segments missing at the end, or the wrong log directory)",
                directory,
                None,
                start,
            )
        if start < self.first_lsn:
            raise CorruptLog(
                f"{directory}: replay asked from lsn {start} but the oldest segment "
                f"{self.segments[0][1].name} starts at lsn {self.first_lsn} (truncated past a needed record)",
                directory,
                None,
                start,
            )
        if not self.segments:
            return
        idx = max(i for i, (first, _) in enumerate(self.segments) if first <= start)
        for i in range(idx, len(self.segments)):
            first, path = self.segments[i]
            is_last = i == len(self.segments) - 1
            batch: list[Record] = []
            scan = _scan(path, _read(path), first, is_last, batch.append)
            self._check_format(path, scan)
            if not is_last:
                nxt_first, nxt_path = self.segments[i + 1]
                if scan.next_lsn != nxt_first:
                    raise CorruptLog(
                        f"{path.name}: offset {scan.valid_end}: segment ends at lsn {scan.next_lsn - 1} but the next "
                        f"segment {nxt_path.name} starts at lsn {nxt_first}: "
                        + (
                            f"lsns {scan.next_lsn}..{nxt_first - 1} are missing (a segment was lost)"
                            if scan.next_lsn < nxt_first
                            else "the segments overlap"
                        ),
                        str(path),
                        scan.valid_end,
                        scan.next_lsn,
                    )
            for rec in batch:
                if rec.lsn >= start:
                    yield rec


class Log(Protocol):
    """What the partition worker relies on; `CommandLog` and `NullLog` both provide it."""

    @property
    def durable_lsn(self) -> int: ...
    @property
    def last_lsn(self) -> int: ...
    @property
    def failed(self) -> LogFailed | None: ...
    def append(self, kind: int, payload: bytes, ts: int = 0) -> int: ...
    def flush(self) -> int: ...
    def flush_soon(self) -> None: ...
    def wait_durable(self, lsn: int, timeout: float | None = None) -> bool: ...
    def truncate_before(self, lsn: int) -> int: ...
    def size_bytes(self) -> int: ...
    def records(self, from_lsn: int | None = None) -> Iterator[Record]: ...
    def close(self) -> None: ...


class CommandLog:
    """An open command log: append on one thread, group commit on a flusher thread.

    Opening syncs the last segment and the directory, so everything it finds
    is durable before `durable_lsn` says so (a killed process may have left
    records in the page cache only): open the log before replaying it.
    `first_lsn` is used only for an empty directory (a log started after a
    checkpoint whose log was lost); otherwise LSNs continue after the last
    valid record. Opening repairs a torn tail (truncates the last segment to its last valid
    record, fsync) so new records follow valid ones; it validates only the last
    segment. `on_durable(lsn)` is called from the flusher thread after each
    group becomes durable: treat it as a wake-up only (e.g. put a marker in the
    executor's inbox), and let the executor compare its pending acks with
    `durable_lsn`: a callback may run before `append` has returned.

    `fsync=False` keeps everything else but skips the syncs: records then
    survive a crash of the process (they are in the page cache) but not of the
    machine. Tests and benchmarks only, or an explicit weaker mode.

    `payload_format` is written in each segment's header: the owner's format
    of its payloads, so a reader can refuse a log of another release
    (`LogReader(payload_formats=...)`). A tail segment of another format is
    left as it is and new records go to a new segment.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        payload_format: int = 0,
        group_bytes: int = 1 << 20,
        group_ms: float = 2.0,
        segment_bytes: int = 64 << 20,
        max_pending_bytes: int = 64 << 20,
        fsync: bool = True,
        first_lsn: int = 1,
        on_durable: Callable[[int], None] | None = None,
        on_failure: Callable[[LogFailed], None] | None = None,
        on_synced: Callable[[float], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.group_bytes = group_bytes
        self.group_s = group_ms / 1000
        self.segment_bytes = segment_bytes
        self.max_pending_bytes = max(max_pending_bytes, group_bytes)
        self.fsync = fsync
        self.on_durable = on_durable
        self.on_failure = on_failure
        self.on_synced = on_synced  # called on the flusher thread with each group's write + sync seconds
        self.payload_format = payload_format
        make_dir(self.directory)
        self.torn: TornTail | None = None
        self._fd = -1
        self._seg_path: Path | None = None
        self._seg_size = 0
        self._seg_records = 0
        self._open_tail(first_lsn)

        self._cv = threading.Condition()
        self._pending: list[tuple[int, int, int, bytes]] = []
        self._pending_bytes = 0
        self._pending_since = 0.0
        self._flush_wanted = False
        self._closed = False
        self._error: LogFailed | None = None
        self._durable = self._next_lsn - 1
        self._appended = self._next_lsn - 1
        self.groups = 0
        self._thread = threading.Thread(target=self._flusher, name=f"log-flusher:{self.directory.name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ opening
    def _open_tail(self, first_lsn: int) -> None:
        segments = list_segments(self.directory)
        if not segments:
            self._create_segment(first_lsn)
            self._next_lsn = first_lsn
            return
        first, path = segments[-1]
        data = _read(path)
        scan = _scan(path, data, first, is_last=True)
        self._next_lsn = scan.next_lsn
        if scan.torn is not None:
            self.torn = scan.torn
        if not scan.header_torn and scan.payload_format != self.payload_format and scan.next_lsn > first:
            if scan.valid_end < len(data):  # its torn tail goes: the records after it start the new segment
                with open(path, "r+b") as f:
                    f.truncate(scan.valid_end)
                    os.fsync(f.fileno())
            self._create_segment(scan.next_lsn)
            return
        if scan.header_torn or scan.payload_format != self.payload_format:  # no record in it: a new header
            self._fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.write(self._fd, encode_segment_header(first, payload_format=self.payload_format))
            self._seg_size = SEGMENT_HEADER_SIZE
        else:
            self._fd = os.open(path, os.O_WRONLY)
            if scan.valid_end < len(data):
                os.ftruncate(self._fd, scan.valid_end)
            self._seg_size = scan.valid_end
        # What a killed process left may still be only in the page cache (the machine did not
        # crash): sync it, and the segment's directory entry, before calling it durable.
        os.fsync(self._fd)
        fsync_dir(self.directory)
        os.lseek(self._fd, self._seg_size, os.SEEK_SET)
        self._seg_path = path
        self._seg_records = scan.next_lsn - first

    def _create_segment(self, first_lsn: int) -> None:
        path = self.directory / segment_name(first_lsn)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, encode_segment_header(first_lsn, payload_format=self.payload_format))
            if self.fsync:
                os.fsync(fd)
                fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._seg_path = path
        self._seg_size = SEGMENT_HEADER_SIZE
        self._seg_records = 0

    # ------------------------------------------------------------------ appending
    @property
    def durable_lsn(self) -> int:
        """Every record with LSN <= this is durable (0 before the first)."""
        return self._durable

    @property
    def last_lsn(self) -> int:
        """LSN of the last appended record (durable or not)."""
        return self._appended

    @property
    def failed(self) -> LogFailed | None:
        """The write/fsync failure that stopped the log, if any."""
        return self._error

    def append(self, kind: int, payload: bytes, ts: int = 0) -> int:
        """Buffers a record and returns its LSN; it is durable once `durable_lsn >= lsn`.

        Blocks only when more than `max_pending_bytes` await the disk (backpressure).
        """
        if not 0 <= kind <= 0xFFFF:
            raise ValueError(f"record kind must fit in u16, got {kind}")
        with self._cv:
            self._check()
            while self._pending_bytes >= self.max_pending_bytes:
                self._cv.wait()
                self._check()
            lsn = self._appended + 1
            self._appended = lsn
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append((lsn, kind, ts, payload))
            self._pending_bytes += RECORD_HEADER_SIZE + len(payload)
            if self._pending_bytes >= self.group_bytes or len(self._pending) == 1:
                self._cv.notify_all()
            return lsn

    def flush(self) -> int:
        """Makes every record appended so far durable now; returns `durable_lsn`."""
        with self._cv:
            self._check()
            target = self._appended
            if self._durable < target:
                self._flush_wanted = True
                self._cv.notify_all()
                while self._durable < target:
                    self._check()
                    self._cv.wait()
            return self._durable

    def flush_soon(self) -> None:
        """Starts writing what is buffered now, without waiting for it; no-op if nothing is."""
        with self._cv:
            if self._pending and not self._flush_wanted:
                self._flush_wanted = True
                self._cv.notify_all()

    def wait_durable(self, lsn: int, timeout: float | None = None) -> bool:
        """Blocks until record `lsn` is durable (True) or `timeout` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._durable < lsn:
                self._check()
                if lsn > self._appended:
                    raise ValueError(f"lsn {lsn} was never appended (last is {self._appended})")
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    return False
                self._cv.wait(wait)
            return True

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise LogFailed(f"{self.directory}: the command log is closed")

    # ------------------------------------------------------------------ flushing
    def _flusher(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._pending:
                        now = time.monotonic()
                        due = self._pending_since + self.group_s
                        if self._flush_wanted or self._closed or self._pending_bytes >= self.group_bytes or now >= due:
                            break
                        self._cv.wait(due - now)
                    elif self._closed:
                        return
                    else:
                        self._cv.wait()
                group = self._pending
                self._pending = []
                self._pending_bytes = 0
                self._flush_wanted = False
            started = time.perf_counter()
            try:
                self._write_group(group)
            except OSError as e:
                err = LogFailed(
                    f"{self._seg_path}: writing lsns {group[0][0]}..{group[-1][0]} failed: {e}; "
                    f"records after lsn {self._durable} may be lost: restart and recover"
                )
                with self._cv:
                    self._error = err
                    self._cv.notify_all()
                if self.on_failure is not None:
                    self.on_failure(err)
                return
            if self.on_synced is not None:
                self.on_synced(time.perf_counter() - started)
            with self._cv:
                self._durable = group[-1][0]
                self.groups += 1
                self._cv.notify_all()
            if self.on_durable is not None:
                try:
                    self.on_durable(group[-1][0])
                except Exception:
                    traceback.print_exc(file=sys.stderr)

    def _write_group(self, group: list[tuple[int, int, int, bytes]]) -> None:
        if self._seg_size >= self.segment_bytes and self._seg_records > 0:
            self._create_segment(group[0][0])  # the current segment is already synced: groups end with a sync
        parts: list[bytes | memoryview] = []
        for lsn, kind, ts, payload in group:
            parts.append(encode_record(lsn, kind, ts, payload))
            parts.append(payload)
        data = memoryview(b"".join(parts))
        written = 0
        while written < len(data):
            written += os.write(self._fd, data[written:])
        if self.fsync:
            os.fdatasync(self._fd)
        self._seg_size += len(data)
        self._seg_records += len(group)

    # ------------------------------------------------------------------ maintenance
    def truncate_before(self, lsn: int) -> int:
        """Deletes every segment all of whose records have LSN < `lsn`; returns how many.

        The segment being appended to is never deleted, so the log always knows
        its next LSN. After a checkpoint at LSN L, `truncate_before(L + 1)`.
        """
        segments = list_segments(self.directory)
        removed = 0
        for (_, path), (next_first, _) in zip(segments, segments[1:], strict=False):
            if next_first <= lsn and path != self._seg_path:
                path.unlink()
                removed += 1
        if removed:
            fsync_dir(self.directory)
        return removed

    def size_bytes(self) -> int:
        """Bytes of the segments on disk (records appended but not yet written excluded)."""
        total = 0
        for _, path in list_segments(self.directory):
            try:
                total += path.stat().st_size
            except FileNotFoundError:  # truncated meanwhile
                pass
        return total

    def records(self, from_lsn: int | None = None) -> Iterator[Record]:
        """Replays the durable records from `from_lsn` (see `LogReader.records`)."""
        if not self._closed:
            self.flush()
        return LogReader(self.directory).records(from_lsn)

    def close(self) -> None:
        """Makes everything appended durable, stops the flusher, closes the segment."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._error is not None:
            raise self._error

    def __enter__(self) -> CommandLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NullLog:
    """`--durability off`: the same interface, nothing written, every record durable at once.

    LSNs still count up, so the worker's ack path is the same in every mode.
    `on_durable` is called synchronously inside `append`.
    """

    def __init__(self, on_durable: Callable[[int], None] | None = None) -> None:
        self.on_durable = on_durable
        self._last = 0

    @property
    def failed(self) -> LogFailed | None:
        return None

    @property
    def durable_lsn(self) -> int:
        return self._last

    @property
    def last_lsn(self) -> int:
        return self._last

    def append(self, kind: int, payload: bytes, ts: int = 0) -> int:
        self._last += 1
        if self.on_durable is not None:
            self.on_durable(self._last)
        return self._last

    def flush(self) -> int:
        return self._last

    def flush_soon(self) -> None:
        pass

    def wait_durable(self, lsn: int, timeout: float | None = None) -> bool:
        return True

    def truncate_before(self, lsn: int) -> int:
        return 0

    def size_bytes(self) -> int:
        return 0

    def records(self, from_lsn: int | None = None) -> Iterator[Record]:
        return iter(())

    def close(self) -> None:
        pass

    def __enter__(self) -> NullLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
