"""Round 1 of a state TE whose batch's keys span partitions: every involved partition's rows, merged.

A state procedure declares its accesses in Python, per event, on the
partitions; the front knows only the partitions its PARTITION ON columns
name (plus home, which emits the outputs). So the coordinator asks each of
them for the current rows of the keys the batch's events name that it holds
(`state_read`), merges them, and sends the merged rows with the TE's
fragment to every involved partition, which runs the whole batch over them
(deterministic replicated execution, server/partition/exchange.py). The
rows then travel once per command, not once per dependency, and the usual
two-phase commit follows.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pyarrow as pa

from streamtx.server import protocol as pr
from streamtx.server.front.partitions import Partitions
from streamtx.server.partition.exchange import Exchange
from streamtx.server.partitioning import HOME, PartitionMap

Fragments = dict[int, tuple[pr.Fragment, list[pa.Table]]]


def involved(partition_map: PartitionMap, keys: tuple[str, ...], rows: pa.Table) -> list[int]:
    """The partitions an event-keyed TE over `rows` runs on: those of its `keys` values, and home (it emits)."""
    return sorted({HOME, *partition_map.partitions_of(rows, keys)})


async def read_rows(
    partitions: Partitions,
    parts: list[int],
    items: list[tuple[str, int]],
    runs: list[list[int]],
    joined: list[pa.Table],
) -> dict[str, pa.Table]:
    """Round 1: the current rows of the keys the batches' events name, from every partition in `parts`, merged.

    `items` names each batch's state procedure and timestamp; the batches come joined (`join_runs`).
    """
    command = pr.StateRead(items, runs)
    replies = await asyncio.gather(*(partitions[p].request(command, joined) for p in parts))
    found: dict[str, list[pa.Table]] = {}
    for rows, tables in replies:
        for name, table in zip(rows.tables, tables, strict=True):
            found.setdefault(name, []).append(table)
    return {name: pa.concat_tables(parts_) if len(parts_) > 1 else parts_[0] for name, parts_ in found.items()}


async def attach_rows(partitions: Partitions, procedure: str, rows: pa.Table, ts: int, fragments: Fragments) -> None:
    """Reads the rows from every fragment's partition and adds the merged rows to every fragment."""
    parts = sorted(fragments)
    merged = await read_rows(partitions, parts, [(procedure, ts)], [[rows.num_rows]], [rows])
    for p, (fragment, tables) in fragments.items():
        wire, extra = Exchange(merged, frozenset(parts), p == HOME).wire()
        fragments[p] = (replace(fragment, exchange=wire), tables + extra)
