"""Frames between the front process and partition workers (a Unix socket pair).

A frame is a small header (a dict of plain values, pickled: both ends are
processes this server spawned) followed by zero or more relations as Arrow IPC
streams. Relations never go through pickle, so a batch crosses the process
boundary as Arrow buffers, and the cost is per message, not per tuple.

Layout: `<u32 header length><u32 relation count><u64 length>*count`, the
header, then each relation's bytes.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from typing import Any

import pyarrow as pa

from streamtx.wire import ipc_to_table, table_to_ipc

_PREFIX = struct.Struct("<II")
_LEN = struct.Struct("<Q")

Frame = tuple[dict[str, Any], list[pa.Table]]


def encode(header: dict[str, Any], tables: list[pa.Table] | None = None) -> bytes:
    """One frame as bytes."""
    head = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
    bodies = [table_to_ipc(t) for t in tables or ()]
    parts = [_PREFIX.pack(len(head), len(bodies))]
    parts += [_LEN.pack(len(b)) for b in bodies]
    parts.append(head)
    parts += bodies
    return b"".join(parts)


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

    def write(self, header: dict[str, Any], tables: list[pa.Table] | None = None) -> None:
        self.sock.sendall(encode(header, tables))


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
