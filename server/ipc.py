"""Frames between the front process and partition workers (a Unix socket pair).

A frame is a small header (a `Request` or `Response` of server/protocol.py,
pickled: both ends are processes this server spawned) followed by zero or more
relations as Arrow IPC streams. Relations never go through pickle, so a batch crosses the process
boundary as Arrow buffers, and the cost is per message, not per tuple.

Layout: `<u32 header length><u32 relation count><u64 length>*count`, the
header, then each relation's bytes.

Frames written together travel packed (`pack`/`unpack`): a run of header-only
frames, or of one-relation frames with one schema (e.g. queued 1-row
batches of a stream), becomes one frame holding their headers and one
relation with all their rows. The cost of a message then is paid per run,
not per frame; the reader gets the original frames back, in order.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from streamtx.server.tuples import Batch, Tuples, arrow, concat
from streamtx.wire import ipc_to_table, table_to_ipc

_PREFIX = struct.Struct("<II")
_LEN = struct.Struct("<Q")

Frame = tuple[Any, list[pa.Table]]
"""A header and its relations."""


@dataclass(frozen=True)
class Packed:
    """Frames written together: their headers, and (if each had one relation of one schema) `rows` per frame."""

    headers: list[Any]
    rows: list[int] | None = None


def encode(header: Any, tables: list[pa.Table] | None = None) -> bytes:
    """One frame as bytes."""
    head = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
    bodies = [table_to_ipc(t) for t in tables or ()]
    parts = [_PREFIX.pack(len(head), len(bodies))]
    parts += [_LEN.pack(len(b)) for b in bodies]
    parts.append(head)
    parts += bodies
    return b"".join(parts)


def pack(frames: list[Frame]) -> bytes:
    """Frames as bytes, runs of alike frames packed into one (see the module docstring)."""
    out: list[bytes] = []
    run: list[Frame] = []
    for frame in frames:
        if run and not _alike(run[-1], frame):
            out.append(_pack_run(run))
            run = []
        run.append(frame)
    if run:
        out.append(_pack_run(run))
    return b"".join(out)


def _alike(a: Frame, b: Frame) -> bool:
    ta, tb = a[1], b[1]
    if not ta and not tb:
        return True
    return len(ta) == 1 and len(tb) == 1 and ta[0].schema.equals(tb[0].schema)


def _pack_run(run: list[Frame]) -> bytes:
    if len(run) == 1:
        return encode(*run[0])
    headers = [h for h, _ in run]
    if not run[0][1]:
        return encode(Packed(headers))
    runs, joined = join_runs([t[0] for _, t in run])  # one run: its frames share a schema (`_alike`)
    return encode(Packed(headers, runs[0]), joined)


def unpack(frame: Frame) -> list[Frame]:
    """The frames a packed frame holds (a frame that is not packed: itself)."""
    header, tables = frame
    if not isinstance(header, Packed):
        return [frame]
    if header.rows is None:
        return [(h, []) for h in header.headers]
    batches, _ = split_runs([header.rows], tables)
    return [(h, [b]) for h, b in zip(header.headers, batches, strict=True)]


def join_runs(tables: Sequence[Batch]) -> tuple[list[list[int]], list[pa.Table]]:
    """Consecutive tables of one schema as one table each, with their row counts (`split_runs` undoes it).

    Many small batches in one message then cost one Arrow stream per run, not one each; a run of
    `Tuples` of one shape becomes its table in one conversion.
    """
    runs: list[list[int]] = []
    joined: list[pa.Table] = []
    group: list[Batch] = []
    for t in tables:
        if group and not group[0].schema.equals(t.schema):
            runs.append([g.num_rows for g in group])
            joined.append(_joined(group))
            group = []
        group.append(t)
    if group:
        runs.append([g.num_rows for g in group])
        joined.append(_joined(group))
    return runs, joined


def _joined(group: list[Batch]) -> pa.Table:
    one = concat(group)
    return arrow(one) if len(group) == 1 or isinstance(one, Tuples) else one.combine_chunks()


def join_grouped(tables: Sequence[Batch], keys: list[str]) -> tuple[list[int], list[list[int]], list[pa.Table]]:
    """`join_runs` after putting tables of equal `keys` (e.g. their stream) together: relations of
    interleaved streams still travel as one Arrow stream per stream. `split_grouped` undoes it."""
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    order = [i for group in groups.values() for i in group]
    runs, joined = join_runs([tables[i] for i in order])
    return order, runs, joined


def split_grouped(order: list[int], runs: list[list[int]], tables: list[pa.Table]) -> list[pa.Table]:
    """The tables `join_grouped` joined, in their first order."""
    ordered, _ = split_runs(runs, tables)
    out: list[pa.Table] = [pa.table({})] * len(ordered)
    for i, t in zip(order, ordered, strict=True):
        out[i] = t
    return out


def split_runs(runs: list[list[int]], tables: list[pa.Table]) -> tuple[list[pa.Table], list[pa.Table]]:
    """The tables `join_runs` joined (from the first `len(runs)` tables), and the tables after them."""
    out: list[pa.Table] = []
    for counts, table in zip(runs, tables, strict=False):
        offset = 0
        for n in counts:
            out.append(table.slice(offset, n))
            offset += n
    return out, tables[len(runs) :]


def _decode(head: bytes, bodies: list[bytes]) -> Frame:
    return pickle.loads(head), [ipc_to_table(b, "ipc") for b in bodies]


class SocketFrames:
    """Blocking frame I/O on a socket (the partition side)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._file = sock.makefile("rb", buffering=1 << 16)

    def read(self) -> Frame | None:
        """The next frame, or None at end of stream (the front went away)."""
        try:
            return self._read()
        except (ConnectionError, OSError, ValueError):
            return None

    def _read(self) -> Frame | None:
        prefix = self._file.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size:
            return None
        head_len, count = _PREFIX.unpack(prefix)
        lens = [_LEN.unpack(self._file.read(_LEN.size))[0] for _ in range(count)]
        head = self._file.read(head_len)
        bodies = [self._file.read(n) for n in lens]
        if len(head) < head_len or any(len(b) < n for b, n in zip(bodies, lens, strict=True)):
            return None
        return _decode(head, bodies)

    def write(self, header: Any, tables: list[pa.Table] | None = None) -> None:
        self.sock.sendall(encode(header, tables))

    def write_many(self, frames: list[Frame]) -> None:
        """One send for several frames, packed."""
        self.sock.sendall(pack(frames))


async def read_frame(reader: asyncio.StreamReader) -> Frame | None:
    """The next frame from an asyncio stream, or None at end of stream."""
    try:
        prefix = await reader.readexactly(_PREFIX.size)
        head_len, count = _PREFIX.unpack(prefix)
        lens = [_LEN.unpack(await reader.readexactly(_LEN.size))[0] for _ in range(count)]
        head = await reader.readexactly(head_len)
        bodies = [await reader.readexactly(n) for n in lens]
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return _decode(head, bodies)
