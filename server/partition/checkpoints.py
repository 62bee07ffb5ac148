"""A partition's online checkpoints: what a snapshot holds beyond its tables, and restoring one.

The tables (user tables, stored streams, windows, exactly-once marks and
rejections) are copied by `streamtx.recovery.checkpoint` inside one DuckDB read
transaction, on a helper thread, while the partition keeps executing. The rest
of a partition's state is derived from those tables on restore (window
positions, marks, which stream batches are kept), except the catalog, the
partition map and the last timestamp, which travel in the checkpoint's meta.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from streamtx.recovery import Checkpoint, Snapshot, begin_snapshot
from streamtx.recovery.checkpoint import list_checkpoints
from streamtx.server.catalog.catalog import Catalog
from streamtx.server.catalog.compile import STREAM_SCHEMA, TS_COLUMN, TS_COLUMN_BEFORE, WINDOW_SCHEMA
from streamtx.server.catalog.physical import create_statements

if TYPE_CHECKING:
    from streamtx.server.partition.engine import Engine


def begin(engine: Engine, lsn: int, ts: int) -> tuple[Snapshot, dict[str, Any]]:
    """Pins the partition's state now (between two commands); returns the snapshot and its meta.

    `ts` names the checkpoint: the front's timestamp at the cut, the same on every partition.
    """
    meta = {
        "catalog": engine.catalog.to_json(),
        "map": engine.map.to_json(),
        "last_ts": engine.marks.last_ts,
        "trimmed_through": engine.trimmed_through,
        "partition": engine.partition,
    }
    return begin_snapshot(engine.con, ts=ts, lsn=lsn), meta


def restore(engine: Engine, ckpt: Checkpoint, restore_into: Callable[..., Any]) -> None:
    meta = ckpt.meta
    catalog = Catalog.from_json(meta["catalog"], engine.loader.resolve)
    engine.install(catalog, [s.sql for s in create_statements(catalog.relations())], meta["map"])
    restore_into(engine.con, dataclasses.replace(ckpt, tables=_current_columns(ckpt.tables)), replace=True)
    engine.trimmed_through = {k: int(v) for k, v in meta["trimmed_through"].items()}
    engine.windows.load()
    engine.load_marks()
    engine.marks.restored(int(meta["last_ts"]))
    engine.load_retained()


def _current_columns(tables: dict[tuple[str, str], pa.Table]) -> dict[tuple[str, str], pa.Table]:
    """Stored tuples' timestamps under their current column name.

    Checkpoints written before the column was named `__ts` call it
    `batch_id`, a name no stream could then give a column of its own.
    """
    out = {}
    for (schema, name), table in tables.items():
        names = table.column_names
        if schema in (STREAM_SCHEMA, WINDOW_SCHEMA) and TS_COLUMN_BEFORE in names and TS_COLUMN not in names:
            table = table.rename_columns([TS_COLUMN if n == TS_COLUMN_BEFORE else n for n in names])
        out[schema, name] = table
    return out


def checkpoint_ts(path: Path) -> int:
    """The global timestamp a checkpoint directory (`ckpt-<ts>`) was taken at."""
    return int(path.name.split("-")[1])


def drop_older(directory: Path, ts: int) -> None:
    """Deletes the checkpoints older than `ts`, which every partition has written (recovery never needs them)."""
    for path in list_checkpoints(directory):
        if checkpoint_ts(path) < ts:
            shutil.rmtree(path, ignore_errors=True)
