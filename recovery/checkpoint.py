"""Checkpoints of one partition: a consistent snapshot of its tables, written without stopping it.

Layout of a checkpoint directory `ckpt-<ts:020d>` (inside the partition's
checkpoint directory)::

    0000.arrow  0001.arrow ...   one Arrow IPC *file* per table, in manifest order
    manifest.json                written last; its presence makes the checkpoint complete

Guarantees:

- *Consistent*: every table is read inside one DuckDB read transaction on a
  cursor of the partition's database, pinned by `begin_snapshot` on the
  executing thread between two TEs. The snapshot holds exactly the TEs
  committed before that point (DuckDB MVCC), whatever the executing thread
  commits while a helper thread writes it out.
- *All or nothing*: files are written in a temporary directory
  (`.ckpt-<ts>.tmp`), fsynced, then `manifest.json` is written and fsynced, the
  directory is fsynced, renamed to its final name, and the parent fsynced. A
  crash at any point leaves either no checkpoint or a complete one; temporary
  directories are never read and are removed by the next checkpoint.
- *Verified*: `load_checkpoint` checks the manifest's own checksum, each file's
  size, CRC-32 and row count, and raises `CorruptCheckpoint` naming the file and
  the mismatch. A damaged checkpoint is never restored partially.
- `lsn` in the manifest is the LSN of the last command-log record whose effects
  the snapshot holds: recovery replays `records(lsn + 1)`.

The partition databases run with `enable_external_access = false`, so DuckDB
cannot COPY to files: tables leave DuckDB as Arrow and pyarrow writes them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from streamtx.recovery.errors import CorruptCheckpoint
from streamtx.recovery.log import Log, fsync_dir, make_dir
from streamtx.recovery.records import checksum

FORMAT = "streamtx-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
CHECKPOINT_RE = re.compile(r"^ckpt-(\d{20})$")
TEMP_RE = re.compile(r"^\.ckpt-\d+\.tmp$")
BATCH_ROWS = 64 * 1024

TableName = str | tuple[str, str]


def checkpoint_name(ts: int) -> str:
    """Directory name of the checkpoint taken at global timestamp `ts`."""
    return f"ckpt-{ts:020d}"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _qualified(schema: str, table: str) -> str:
    return f"{_quote(schema)}.{_quote(table)}"


def _split(name: TableName) -> tuple[str, str]:
    if isinstance(name, tuple):
        return name
    schema, dot, table = name.partition(".")
    return (schema, table) if dot else ("main", name)


class _CrcWriter:
    """A file object that checksums what passes through it, so a file is read only once."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.crc = 0
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.crc = checksum(view, self.crc)
        self.size += view.nbytes
        self.f.write(view)
        return view.nbytes

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.closed = True


def _arrow_reader(cur: duckdb.DuckDBPyConnection, sql: str) -> pa.RecordBatchReader:
    rel = cur.sql(sql)
    if hasattr(rel, "to_arrow_reader"):
        return rel.to_arrow_reader(BATCH_ROWS)
    return rel.record_batch(BATCH_ROWS)  # duckdb < 1.4


class Snapshot:
    """A pinned read transaction over a partition's tables, not yet written out.

    Create it with `begin_snapshot` on the executing thread (cheap: a cursor, a
    BEGIN and one catalog query), then call `write` on any one thread.
    """

    def __init__(self, cursor: duckdb.DuckDBPyConnection, tables: list[tuple[str, str]], ts: int, lsn: int) -> None:
        self.cursor = cursor
        self.tables = tables
        self.ts = ts
        self.lsn = lsn

    def write(
        self,
        directory: str | os.PathLike[str],
        *,
        meta: dict[str, Any] | None = None,
        keep: int = 2,
        compression: str | None = None,
        log: Log | None = None,
    ) -> Path:
        """Writes the snapshot as checkpoint `ckpt-<ts>` in `directory`; returns its path.

        `meta` (JSON-serialisable: catalog, marks...) is stored in the manifest
        verbatim. Afterwards only the newest `keep` complete checkpoints remain.
        If a complete checkpoint with the same ts exists it is kept as is (same
        ts, same state) and returned. The read transaction ends either way.

        With `log`, the checkpoint is published (renamed to its final name) only
        once `log.durable_lsn >= lsn`: a checkpoint must never be ahead of the
        durable log, or records appended after a crash would reuse LSNs the
        checkpoint already covers, and replay would skip them.
        """
        root = Path(directory)
        try:
            make_dir(root)
            final = root / checkpoint_name(self.ts)
            if (final / MANIFEST).exists():
                return final
            _remove_temps(root)
            tmp = root / f".ckpt-{self.ts}.tmp"
            tmp.mkdir()
            entries = []
            for i, (schema, table) in enumerate(self.tables):
                entries.append(self._write_table(tmp, f"{i:04d}.arrow", schema, table, compression))
            self.close()  # every table is read: let DuckDB drop the versions this snapshot kept alive
            manifest = {
                "format": FORMAT,
                "version": VERSION,
                "ts": self.ts,
                "lsn": self.lsn,
                "created_unix_ns": time.time_ns(),
                "meta": meta or {},
                "tables": entries,
            }
            manifest["manifest_crc32"] = _manifest_crc(manifest)
            _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
            fsync_dir(tmp)
            if log is not None:
                log.wait_durable(self.lsn)
            os.rename(tmp, final)
            fsync_dir(root)
        finally:
            self.close()
        prune_checkpoints(root, keep)
        return final

    def _write_table(self, tmp: Path, file: str, schema: str, table: str, compression: str | None) -> dict[str, Any]:
        reader = _arrow_reader(self.cursor, f"SELECT * FROM {_qualified(schema, table)}")
        rows = 0
        with open(tmp / file, "wb") as f:
            sink = _CrcWriter(f)
            options = pa.ipc.IpcWriteOptions(compression=compression)
            with pa.ipc.new_file(pa.PythonFile(sink, mode="w"), reader.schema, options=options) as writer:
                for batch in reader:
                    writer.write_batch(batch)
                    rows += batch.num_rows
            f.flush()
            os.fsync(f.fileno())
        return {"schema": schema, "table": table, "file": file, "rows": rows, "bytes": sink.size, "crc32": sink.crc}

    def close(self) -> None:
        """Ends the read transaction (idempotent); a snapshot never written must still be closed."""
        if self.cursor is None:
            return
        try:
            self.cursor.execute("ROLLBACK")
        except duckdb.Error:
            pass
        self.cursor.close()
        self.cursor = None  # type: ignore[assignment]


def begin_snapshot(
    con: duckdb.DuckDBPyConnection, ts: int, lsn: int, tables: Sequence[TableName] | None = None
) -> Snapshot:
    """Pins a snapshot of `tables` (default: every table of the database) as of now.

    Call it on the executing thread between two TEs, with `ts` of the last TE
    committed and `lsn` = the log's `last_lsn` (appended, maybe not yet durable:
    pass the log to `write`, which waits for it): the snapshot holds exactly
    those effects. DuckDB binds a
    transaction's snapshot at its first access to the database, not at BEGIN, so
    this runs a catalog query right away.
    """
    cur = con.cursor()
    try:
        cur.execute("BEGIN TRANSACTION")
        found = cur.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() "
            "WHERE NOT temporary AND database_name = current_database() ORDER BY schema_name, table_name"
        ).fetchall()
        if tables is None:
            chosen = [(s, t) for s, t in found]
        else:
            chosen = [_split(n) for n in tables]
            missing = [f"{s}.{t}" for s, t in chosen if (s, t) not in set(found)]
            if missing:
                raise ValueError(f"checkpoint: no such table(s): {', '.join(missing)}")
    except BaseException:
        cur.close()
        raise
    return Snapshot(cur, chosen, ts, lsn)


def write_checkpoint(
    con: duckdb.DuckDBPyConnection,
    tables: Sequence[TableName] | None,
    directory: str | os.PathLike[str],
    ts: int,
    lsn: int,
    *,
    meta: dict[str, Any] | None = None,
    keep: int = 2,
    compression: str | None = None,
    log: Log | None = None,
) -> Path:
    """`begin_snapshot` then `Snapshot.write`, on the calling thread."""
    snap = begin_snapshot(con, ts, lsn, tables)
    return snap.write(directory, meta=meta, keep=keep, compression=compression, log=log)


def _manifest_crc(manifest: dict[str, Any]) -> int:
    body = {k: v for k, v in manifest.items() if k != "manifest_crc32"}
    return checksum(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _remove_temps(root: Path) -> None:
    for entry in root.iterdir():
        if TEMP_RE.match(entry.name) and entry.is_dir():
            shutil.rmtree(entry)


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints (final name and a manifest), oldest first. Not verified."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = CHECKPOINT_RE.match(entry.name)
        if m and (entry / MANIFEST).is_file():
            found.append((int(m.group(1)), entry))
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint, or None. Interrupted ones are never returned."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def prune_checkpoints(directory: str | os.PathLike[str], keep: int) -> list[Path]:
    """Deletes all but the newest `keep` (>= 1) complete checkpoints; returns what was deleted."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    old = list_checkpoints(directory)[:-keep]
    for path in old:
        shutil.rmtree(path)
    if old:
        fsync_dir(Path(directory))
    return old


@dataclass
class Checkpoint:
    """A loaded, verified checkpoint: tables keyed by (schema, table), in manifest order."""

    path: Path
    ts: int
    lsn: int
    meta: dict[str, Any]
    tables: dict[tuple[str, str], pa.Table] = field(default_factory=dict)


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Reads and verifies a complete checkpoint; raises CorruptCheckpoint on any mismatch."""
    path = Path(path)
    mpath = path / MANIFEST

    def bad(what: str, where: Path = mpath) -> CorruptCheckpoint:
        return CorruptCheckpoint(f"checkpoint {path.name}: {where.name}: {what}", str(where))

    try:
        raw = mpath.read_bytes()
    except FileNotFoundError:
        raise bad("missing (an interrupted checkpoint, never to be used)") from None
    try:
        manifest = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad(f"not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise bad(f"not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise bad(f"unsupported version {manifest.get('version')!r} (this reader knows {VERSION})")
    if manifest.get("manifest_crc32") != _manifest_crc(manifest):
        raise bad(f"manifest checksum mismatch (stored {manifest.get('manifest_crc32')!r})")
    ckpt = Checkpoint(path, int(manifest["ts"]), int(manifest["lsn"]), manifest["meta"])
    for entry in manifest["tables"]:
        fpath = path / entry["file"]
        name = f"table {entry['schema']}.{entry['table']}"
        try:
            data = fpath.read_bytes()
        except FileNotFoundError:
            raise bad(f"missing ({name})", fpath) from None
        if len(data) != entry["bytes"]:
            raise bad(f"{name}: size {len(data)} bytes, manifest says {entry['bytes']}", fpath)
        crc = checksum(data)
        if crc != entry["crc32"]:
            raise bad(f"{name}: checksum mismatch (crc32 {crc:#010x}, manifest says {entry['crc32']:#010x})", fpath)
        try:
            table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        except (pa.ArrowInvalid, OSError) as e:
            raise bad(f"{name}: not a readable Arrow IPC file: {e}", fpath) from None
        if table.num_rows != entry["rows"]:
            raise bad(f"{name}: {table.num_rows} rows, manifest says {entry['rows']}", fpath)
        ckpt.tables[(entry["schema"], entry["table"])] = table
    return ckpt


def restore_into(con: duckdb.DuckDBPyConnection, checkpoint: Checkpoint, *, replace: bool = False) -> dict[str, int]:
    """Inserts the checkpoint's tables into `con`'s existing tables, in one transaction.

    Columns are matched by name (`INSERT ... BY NAME`). With `replace`, each
    table is emptied first. Either every table is restored or nothing is.
    Returns the rows inserted per `schema.table`.
    """
    counts: dict[str, int] = {}
    views: list[str] = []
    con.execute("BEGIN TRANSACTION")
    try:
        for i, ((schema, table), data) in enumerate(checkpoint.tables.items()):
            target = _qualified(schema, table)
            view = f"__streamtx_restore_{i}"
            try:
                if replace:
                    con.execute(f"DELETE FROM {target}")
                con.register(view, data)
                views.append(view)
                con.execute(f"INSERT INTO {target} BY NAME SELECT * FROM {_quote(view)}")
            except duckdb.Error as e:
                raise RuntimeError(f"restoring {schema}.{table} from {checkpoint.path.name}: {e}") from e
            counts[f"{schema}.{table}"] = data.num_rows
    except BaseException:
        con.execute("ROLLBACK")
        raise
    else:
        con.execute("COMMIT")
    finally:
        for view in views:
            con.unregister(view)
    return counts
