"""Durability building blocks of a partition: the command log and checkpoints.

- `log.CommandLog` / `log.NullLog`: append-only, checksummed, group-committed
  command log (and its `--durability off` stand-in); `log.LogReader` replays it.
- `records`: the byte layouts, and `encode_command`/`decode_command` for a
  typical payload (JSON header + Arrow relations).
- `checkpoint`: consistent snapshots of a partition's DuckDB tables, written
  by a helper thread while the partition keeps executing.

docs/durability.md gives the formats byte by byte and the recovery recipe.
"""

from streamtx.recovery.checkpoint import (
    Checkpoint,
    Snapshot,
    begin_snapshot,
    latest_checkpoint,
    load_checkpoint,
    restore_into,
    write_checkpoint,
)
from streamtx.recovery.errors import CorruptCheckpoint, CorruptLog, LogFailed, UnreadableFormat
from streamtx.recovery.log import CommandLog, Log, LogReader, NullLog
from streamtx.recovery.records import Record, RecordKind, decode_command, encode_command

__all__ = [
    "Checkpoint",
    "CommandLog",
    "CorruptCheckpoint",
    "CorruptLog",
    "Log",
    "LogFailed",
    "LogReader",
    "NullLog",
    "Record",
    "RecordKind",
    "Snapshot",
    "UnreadableFormat",
    "begin_snapshot",
    "decode_command",
    "encode_command",
    "latest_checkpoint",
    "load_checkpoint",
    "restore_into",
    "write_checkpoint",
]
