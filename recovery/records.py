"""Byte layouts of the command log, and the codec of a typical command payload.

All integers are little-endian. Checksums are CRC-32 (ISO-HDLC, `zlib.crc32`):
in the standard library, so a log can be read anywhere Python runs.

Segment file `log-<first_lsn:020d>.seg` = one 32-byte segment header, then records.

Segment header (32 bytes)::

    0   8  magic        b"STXLOG\\r\\n"
    8   2  version      u16, 1 (this byte layout)
    10  2  format       u16, the owner's payload format (the server's command format; 0: none given)
    12  8  first_lsn    u64, LSN of the first record this segment may hold (= the file name's)
    20  8  created_ns   i64, wall clock at creation (information only)
    28  4  header_crc   u32, crc32 of bytes 0..28

Record (32-byte header + payload)::

    0   4  header_crc   u32, crc32 of bytes 4..32 of this header (so it covers payload_crc too)
    4   4  payload_crc  u32, crc32 of the payload
    8   8  lsn          u64, 1, 2, 3, ... with no gap across segments
    16  8  ts           i64, the caller's timestamp (the TE's global timestamp)
    24  4  payload_len  u32
    28  2  kind         u16, the caller's record kind (see `RecordKind`)
    30  2  reserved     u16, 0
    32  n  payload

The header has its own checksum so that a damaged length field is recognised as
damage before it is used: a reader never mistakes a corrupt record in the
middle of a segment for a torn one at its end.
"""

from __future__ import annotations

import enum
import json
import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

MAGIC = b"STXLOG\r\n"
VERSION = 1
SEGMENT_HEADER = struct.Struct("<8sHHQqI")
RECORD_HEADER = struct.Struct("<IIQqIHH")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size
RECORD_HEADER_SIZE = RECORD_HEADER.size
MAX_PAYLOAD = (1 << 32) - 1

assert SEGMENT_HEADER_SIZE == 32 and RECORD_HEADER_SIZE == 32


def checksum(data: bytes | bytearray | memoryview, start: int = 0) -> int:
    """CRC-32 of `data` (continuing from `start`); releases the GIL on large buffers."""
    return zlib.crc32(data, start) & 0xFFFFFFFF


class RecordKind(enum.IntEnum):
    """What a record holds: the server's command-log records (partition/journal.py writes and replays them).

    The log itself stores any u16 and never interprets it.
    """

    PUSH = 1  # an atomic batch taken (its stream, producer, batch id and tuples)
    CALL = 2  # an OLTP call (procedure and parameters), weak
    TE = 3  # one committed TE, `i of n` of its command (strong)
    REJECT = 4  # a batch rejected for good, so a re-send gets the same answer
    INSTALL = 5  # a deploy: catalog and DDL, so replay runs against the schema of its time
    FRAGMENTS = 6  # the fragments of a coordinated command committed on this partition
    DONE = 7  # (home partition) a coordinated command finished on every partition
    SPAN = 8  # state batches over several partitions, with their merged rows, committed here
    INTERVAL = 9  # the TEs of the batches one interval committed, in order (strong)
    PUSHES = 10  # the batches one interval committed, in order (weak)
    UNDONE = 11  # the coordinated command's earlier records at this timestamp were rolled back
    FLOW = 12  # one stage of a flow's batches committed here (front/flows.py)
    MIGRATE = 13  # a migration step committed here: the new partition map and the rows that arrived


@dataclass(frozen=True, slots=True)
class Record:
    """One command-log record as read back: exactly the bytes that were appended."""

    lsn: int
    kind: int
    ts: int
    payload: bytes


def encode_segment_header(first_lsn: int, created_ns: int | None = None, payload_format: int = 0) -> bytes:
    """The 32 bytes that open a segment whose first record will have LSN `first_lsn`."""
    created = time.time_ns() if created_ns is None else created_ns
    body = SEGMENT_HEADER.pack(MAGIC, VERSION, payload_format, first_lsn, created, 0)[:-4]
    return body + struct.pack("<I", checksum(body))


def decode_segment_header(data: bytes | memoryview) -> tuple[int, int, int] | str:
    """(first_lsn, created_ns, payload_format) of a segment header, or a description of what is wrong with it."""
    if len(data) < SEGMENT_HEADER_SIZE:
        return f"segment header is {len(data)} bytes, expected {SEGMENT_HEADER_SIZE}"
    magic, version, payload_format, first_lsn, created, crc = SEGMENT_HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        return f"bad magic {bytes(magic)!r} (not a streamtx command-log segment)"
    if checksum(data[: SEGMENT_HEADER_SIZE - 4]) != crc:
        return "segment header checksum mismatch"
    if version != VERSION:
        return f"unsupported segment format version {version} (this reader knows {VERSION})"
    return first_lsn, created, payload_format


def encode_record(lsn: int, kind: int, ts: int, payload: bytes | bytearray | memoryview) -> bytes:
    """A record's 32-byte header (the payload follows it unchanged)."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"record payload of {len(payload)} bytes exceeds the limit of {MAX_PAYLOAD}")
    rest = RECORD_HEADER.pack(0, checksum(payload), lsn, ts, len(payload), kind, 0)[4:]
    return struct.pack("<I", checksum(rest)) + rest


@dataclass(frozen=True, slots=True)
class RecordHeader:
    header_ok: bool
    payload_crc: int
    lsn: int
    ts: int
    payload_len: int
    kind: int


def decode_record_header(data: bytes | memoryview, offset: int) -> RecordHeader:
    """The header at `offset` (caller ensures 32 bytes are there); `header_ok` says if its checksum holds."""
    hcrc, pcrc, lsn, ts, plen, kind, _reserved = RECORD_HEADER.unpack_from(data, offset)
    ok = checksum(data[offset + 4 : offset + RECORD_HEADER_SIZE]) == hcrc
    return RecordHeader(ok, pcrc, lsn, ts, plen, kind)


# ----------------------------------------------------------------- command payloads
# A command payload = <u32 header_len><u32 table_count><u64 table_len>*count, the
# header as UTF-8 JSON, then each table as an Arrow IPC stream.

_PREFIX = struct.Struct("<II")
_LEN = struct.Struct("<Q")
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # an Arrow IPC stream's end-of-stream marker
_PLAIN: dict[bytes, bool] = {}  # a serialized schema -> it has no dictionary-encoded column


def _ipc(table: pa.Table | pa.RecordBatch) -> bytes:
    """`table` as an Arrow IPC stream: the schema message, one message per record batch, the end marker.

    Byte for byte what a stream writer (`pa.ipc.new_stream`) writes, for a
    third of its cost on the small relations a TE logs. A dictionary-encoded
    column needs the writer, which also writes the dictionaries.
    """
    schema = table.schema
    head = schema.serialize().to_pybytes()
    plain = _PLAIN.get(head)
    if plain is None:
        if len(_PLAIN) >= 1024:
            _PLAIN.clear()
        plain = _PLAIN[head] = not any(_has_dictionary(f.type) for f in schema)
    if not plain:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            writer.write(table)
        return sink.getvalue().to_pybytes()
    batches = table.to_batches() if isinstance(table, pa.Table) else [table]
    return b"".join([head, *(b.serialize() for b in batches), _EOS])


def _has_dictionary(t: pa.DataType) -> bool:
    return pa.types.is_dictionary(t) or any(_has_dictionary(t.field(i).type) for i in range(t.num_fields))


def encode_command(header: dict[str, Any], tables: Sequence[pa.Table | pa.RecordBatch] = ()) -> bytes:
    """A record payload for a command: a JSON header (procedure, stream, producer, batch id,
    parameters...) and zero or more Arrow relations, which keep their exact schema and types.

    The header must be JSON-serialisable (it is `json.dumps`-ed with `allow_nan=False`, so it
    decodes to an equal dict, not to something merely similar).
    """
    head = _JSON.encode(header).encode()
    bodies = [_ipc(t) for t in tables]
    parts: list[Any] = [_PREFIX.pack(len(head), len(bodies))]
    parts += [_LEN.pack(len(b)) for b in bodies]
    parts.append(head)
    parts += bodies
    return b"".join(parts)


def decode_command(payload: bytes | memoryview) -> tuple[dict[str, Any], list[pa.Table]]:
    """Inverse of `encode_command`. Raises ValueError on a malformed payload (the record's
    checksum held, so this means the writer and reader disagree on the format)."""
    view = memoryview(payload)
    if len(view) < _PREFIX.size:
        raise ValueError(f"command payload of {len(view)} bytes is shorter than its {_PREFIX.size}-byte prefix")
    head_len, count = _PREFIX.unpack_from(view, 0)
    pos = _PREFIX.size
    if pos + count * _LEN.size > len(view):
        raise ValueError(f"command payload declares {count} tables but is only {len(view)} bytes")
    lens = [_LEN.unpack_from(view, pos + i * _LEN.size)[0] for i in range(count)]
    pos += count * _LEN.size
    if pos + head_len + sum(lens) != len(view):
        raise ValueError(f"command payload is {len(view)} bytes but its prefix declares {pos + head_len + sum(lens)}")
    header = json.loads(bytes(view[pos : pos + head_len]))
    pos += head_len
    buf = pa.py_buffer(payload)
    tables = []
    for n in lens:
        with pa.ipc.open_stream(buf.slice(pos, n)) as reader:
            tables.append(reader.read_all())
        pos += n
    return header, tables
