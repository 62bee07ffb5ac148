"""Acks as a client sees them, one per batch."""

from __future__ import annotations

from streamtx.v1 import streamtx_pb2 as pb


def expand(acks: list[pb.PushAck]) -> list[tuple[int, int, int, int]]:
    """Per batch: (batch id, outcome, original, timestamp)."""
    out = []
    for a in acks:
        for i in range(max(a.count, 1)):
            out.append((a.batch_id + i, a.outcome, a.original, a.timestamp + i if a.timestamp else 0))
    return out
