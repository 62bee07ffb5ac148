"""Checkpoints on real files: consistent under concurrent writes (DuckDB MVCC), all-or-nothing,
verified on load, restored exactly; and recovery = latest checkpoint + replay of the log after it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from streamtx.recovery import checkpoint as ckpt_mod
from streamtx.recovery.checkpoint import (
    MANIFEST,
    begin_snapshot,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    restore_into,
    write_checkpoint,
)
from streamtx.recovery.errors import CorruptCheckpoint
from streamtx.recovery.log import CommandLog
from streamtx.recovery.records import RecordKind, decode_command, encode_command

pytestmark = pytest.mark.timeout(120)

DDL = [
    "CREATE SCHEMA streamtx",
    "CREATE TABLE streamtx.producers (producer_id VARCHAR NOT NULL, stream VARCHAR NOT NULL, "
    "last_batch_id BIGINT NOT NULL, last_ts BIGINT NOT NULL)",
    "CREATE TABLE accounts (id BIGINT PRIMARY KEY, owner VARCHAR, balance DECIMAL(18, 2), opened TIMESTAMP, "
    "tags VARCHAR[], blob BLOB, ok BOOLEAN, score DOUBLE)",
    'CREATE TABLE "odd ""name""" (x INTEGER)',
    "CREATE TABLE empty_one (a INTEGER, b VARCHAR)",
]


def partition_db() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"enable_external_access": False})
    for sql in DDL:
        con.execute(sql)
    return con


def fill(con: duckdb.DuckDBPyConnection, n: int = 1000) -> None:
    con.execute(
        f"""INSERT INTO accounts SELECT i, CASE WHEN i % 5 = 0 THEN NULL ELSE 'owner ' || i END,
        i * 1.25, TIMESTAMP '2026-01-01' + INTERVAL (i) SECOND, ['t' || i, NULL], ('\\x00\\x01'::BLOB),
        i % 2 = 0, i / 3.0 FROM range({n}) r(i)"""
    )
    con.execute("INSERT INTO streamtx.producers VALUES ('p1', 'votes', 41, 900), ('p2', 'votes', 7, 901)")
    con.execute('INSERT INTO "odd ""name""" VALUES (1), (NULL)')


def dump(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple]]:
    out = {}
    for schema, table in con.execute("SELECT schema_name, table_name FROM duckdb_tables() ORDER BY ALL").fetchall():
        q = f'"{schema}"."{table.replace(chr(34), chr(34) * 2)}"'
        out[f"{schema}.{table}"] = con.execute(f"SELECT * FROM {q} ORDER BY ALL").fetchall()
    return out


# ----------------------------------------------------------------------------- round trip


def test_write_load_restore_is_exact(tmp_path: Path) -> None:
    con = partition_db()
    fill(con)
    path = write_checkpoint(con, None, tmp_path, ts=900, lsn=17, meta={"catalog": {"v": 3}, "marks": [["p1", 41]]})
    assert path.name == checkpoint_name(900) == "ckpt-00000000000000000900"
    assert sorted(p.name for p in path.iterdir()) == ["0000.arrow", "0001.arrow", "0002.arrow", "0003.arrow", MANIFEST]
    manifest = json.loads((path / MANIFEST).read_text())
    assert (manifest["ts"], manifest["lsn"], manifest["version"]) == (900, 17, 1)
    assert {(t["schema"], t["table"]): t["rows"] for t in manifest["tables"]} == {
        ("main", "accounts"): 1000,
        ("main", "empty_one"): 0,
        ("main", 'odd "name"'): 2,
        ("streamtx", "producers"): 2,
    }

    loaded = load_checkpoint(path)
    assert (loaded.ts, loaded.lsn, loaded.meta) == (900, 17, {"catalog": {"v": 3}, "marks": [["p1", 41]]})
    fresh = partition_db()
    counts = restore_into(fresh, loaded)
    assert counts["main.accounts"] == 1000
    assert dump(fresh) == dump(con)
    assert loaded.tables[("main", "accounts")].schema.field("balance").type == pa.decimal128(18, 2)


def test_chosen_tables_only_and_unknown_table(tmp_path: Path) -> None:
    con = partition_db()
    fill(con, 10)
    path = write_checkpoint(con, ["accounts", ("streamtx", "producers")], tmp_path, ts=1, lsn=0)
    assert list(load_checkpoint(path).tables) == [("main", "accounts"), ("streamtx", "producers")]
    with pytest.raises(ValueError, match="no such table.*main.nope"):
        write_checkpoint(con, ["nope"], tmp_path, ts=2, lsn=0)


def test_compressed_checkpoint_round_trips(tmp_path: Path) -> None:
    con = partition_db()
    fill(con, 5000)
    path = write_checkpoint(con, None, tmp_path, ts=3, lsn=3, compression="zstd")
    fresh = partition_db()
    restore_into(fresh, load_checkpoint(path))
    assert dump(fresh) == dump(con)


def test_restore_replace_and_atomicity(tmp_path: Path) -> None:
    con = partition_db()
    fill(con, 50)
    loaded = load_checkpoint(write_checkpoint(con, None, tmp_path, ts=1, lsn=1))
    target = partition_db()
    target.execute("INSERT INTO accounts (id) VALUES (99999)")
    restore_into(target, loaded, replace=True)
    assert dump(target) == dump(con)

    broken = partition_db()
    broken.execute("DROP TABLE empty_one")  # restoring that table fails: nothing at all is restored
    with pytest.raises(Exception, match="empty_one"):
        restore_into(broken, loaded)
    assert broken.execute("SELECT count(*) FROM accounts").fetchone() == (0,)


# ----------------------------------------------------------------------------- consistency


def test_snapshot_is_consistent_while_the_executor_keeps_writing(tmp_path: Path) -> None:
    """Every TE moves money between two tables and bumps a counter in a third; the snapshot,
    written on a helper thread while TEs keep committing, holds exactly the TEs before the pin."""
    con = duckdb.connect(config={"enable_external_access": False})
    con.execute("CREATE TABLE a (k BIGINT, v BIGINT)")
    con.execute("CREATE TABLE b (k BIGINT, v BIGINT)")
    con.execute("CREATE TABLE te (n BIGINT)")
    con.execute("INSERT INTO a SELECT i, 100 FROM range(300000) r(i)")
    con.execute("INSERT INTO b SELECT i, 0 FROM range(300000) r(i)")
    con.execute("INSERT INTO te VALUES (0)")

    def te(n: int) -> None:
        con.execute("BEGIN")
        con.execute("UPDATE a SET v = v - 1 WHERE k % 1000 = ?", [n % 1000])
        con.execute("UPDATE b SET v = v + 1 WHERE k % 1000 = ?", [n % 1000])
        con.execute("INSERT INTO a VALUES (?, 0)", [1_000_000 + n])
        con.execute("UPDATE te SET n = ?", [n])
        con.execute("COMMIT")

    for n in range(1, 21):
        te(n)
    snap = begin_snapshot(con, ts=20, lsn=20)  # pinned on the executing thread, between two TEs
    for n in range(21, 26):  # the helper thread starts later: the pin, not the start, decides
        te(n)

    first_table_written, resume = threading.Event(), threading.Event()
    write_table = snap._write_table

    def paused_write_table(*args: object) -> dict:
        entry = write_table(*args)
        if not first_table_written.is_set():  # certain overlap: TEs commit between two tables' reads
            first_table_written.set()
            assert resume.wait(30)
        return entry

    snap._write_table = paused_write_table  # type: ignore[method-assign]
    result: list[Path] = []
    writer = threading.Thread(target=lambda: result.append(snap.write(tmp_path)))
    writer.start()
    assert first_table_written.wait(30)
    n = 25
    for _ in range(20):
        n += 1
        te(n)
    resume.set()
    while writer.is_alive():  # and keep committing while it writes the rest
        n += 1
        te(n)
    writer.join()

    loaded = load_checkpoint(result[0])
    a = loaded.tables[("main", "a")]
    b = loaded.tables[("main", "b")]
    assert loaded.tables[("main", "te")].column("n").to_pylist() == [20]
    assert a.num_rows == 300000 + 20
    assert pc.sum(a.column("v")).as_py() + pc.sum(b.column("v")).as_py() == 300000 * 100
    assert pc.sum(b.column("v")).as_py() == 20 * 300
    assert con.execute("SELECT n FROM te").fetchone() == (n,)  # the executor's own view moved on


def test_pin_happens_at_begin_snapshot_not_at_write(tmp_path: Path) -> None:
    con = partition_db()
    fill(con, 10)
    snap = begin_snapshot(con, ts=5, lsn=5)
    con.execute("INSERT INTO empty_one VALUES (1, 'after the pin')")
    con.execute("DELETE FROM accounts")
    loaded = load_checkpoint(snap.write(tmp_path))
    assert loaded.tables[("main", "empty_one")].num_rows == 0
    assert loaded.tables[("main", "accounts")].num_rows == 10


# ----------------------------------------------------------------------------- all or nothing


def test_interrupted_checkpoint_is_never_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    con = partition_db()
    fill(con, 10)
    good = write_checkpoint(con, None, tmp_path, ts=10, lsn=10)

    con.execute("DELETE FROM accounts")

    def crash(*_args: object) -> None:
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(ckpt_mod.os, "rename", crash)
    with pytest.raises(OSError, match="simulated crash"):
        write_checkpoint(con, None, tmp_path, ts=20, lsn=20)
    monkeypatch.undo()
    assert (tmp_path / ".ckpt-20.tmp" / MANIFEST).exists()  # complete files, but under the temp name
    (tmp_path / checkpoint_name(30)).mkdir()  # a final name without a manifest is not a checkpoint either
    assert latest_checkpoint(tmp_path) == good
    assert load_checkpoint(good).tables[("main", "accounts")].num_rows == 10
    with pytest.raises(CorruptCheckpoint, match="manifest.json: missing"):
        load_checkpoint(tmp_path / checkpoint_name(30))

    newer = write_checkpoint(con, None, tmp_path, ts=21, lsn=21)
    assert not (tmp_path / ".ckpt-20.tmp").exists()  # the next checkpoint clears the debris
    assert latest_checkpoint(tmp_path) == newer


def test_same_ts_twice_keeps_the_first(tmp_path: Path) -> None:
    con = partition_db()
    first = write_checkpoint(con, None, tmp_path, ts=7, lsn=7)
    mtime = (first / MANIFEST).stat().st_mtime_ns
    assert write_checkpoint(con, None, tmp_path, ts=7, lsn=7) == first
    assert (first / MANIFEST).stat().st_mtime_ns == mtime


def test_only_the_newest_n_are_kept(tmp_path: Path) -> None:
    con = partition_db()
    for ts in (5, 1, 9, 3):
        write_checkpoint(con, None, tmp_path, ts=ts, lsn=ts, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == [checkpoint_name(5), checkpoint_name(9)]
    assert prune_checkpoints(tmp_path, keep=1) == [tmp_path / checkpoint_name(5)]
    with pytest.raises(ValueError):
        prune_checkpoints(tmp_path, keep=0)
    assert latest_checkpoint(tmp_path / "none") is None


def test_checkpoint_is_published_only_once_its_lsn_is_durable(tmp_path: Path) -> None:
    con = partition_db()
    with CommandLog(tmp_path / "log", group_bytes=1 << 30, group_ms=600_000) as log:
        con.execute("INSERT INTO empty_one VALUES (1, 'x')")
        lsn = log.append(RecordKind.TE, b"insert 1")
        snap = begin_snapshot(con, ts=1, lsn=lsn)
        writer = threading.Thread(target=snap.write, args=(tmp_path / "ckpt",), kwargs={"log": log})
        writer.start()
        writer.join(0.3)
        assert writer.is_alive() and latest_checkpoint(tmp_path / "ckpt") is None  # its record is not durable
        log.flush()
        writer.join(30)
        assert not writer.is_alive()
    assert load_checkpoint(latest_checkpoint(tmp_path / "ckpt")).lsn == lsn


# ----------------------------------------------------------------------------- corruption


def corrupt_setup(tmp_path: Path) -> Path:
    con = partition_db()
    fill(con, 200)
    return write_checkpoint(con, None, tmp_path, ts=1, lsn=1)


def test_flipped_byte_in_a_table_file_is_refused(tmp_path: Path) -> None:
    path = corrupt_setup(tmp_path)
    f = path / "0000.arrow"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match=r"ckpt-0+1: 0000\.arrow: table main\.accounts: checksum mismatch"):
        load_checkpoint(path)


def test_truncated_or_missing_table_file_is_refused(tmp_path: Path) -> None:
    path = corrupt_setup(tmp_path)
    f = path / "0000.arrow"
    size = f.stat().st_size
    os.truncate(f, size - 10)
    with pytest.raises(CorruptCheckpoint, match=rf"0000\.arrow: table main\.accounts: size {size - 10} bytes"):
        load_checkpoint(path)
    f.unlink()
    with pytest.raises(CorruptCheckpoint, match=r"0000\.arrow: missing \(table main\.accounts\)") as err:
        load_checkpoint(path)
    assert err.value.path == str(f)


def test_tampered_manifest_is_refused(tmp_path: Path) -> None:
    path = corrupt_setup(tmp_path)
    m = path / MANIFEST
    manifest = json.loads(m.read_text())
    manifest["tables"][0]["rows"] = 199
    m.write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpoint, match="manifest.json: manifest checksum mismatch"):
        load_checkpoint(path)
    m.write_text(m.read_text()[:-20])
    with pytest.raises(CorruptCheckpoint, match="manifest.json: not valid JSON"):
        load_checkpoint(path)


# ----------------------------------------------------------------------------- recovery end to end


def test_recovery_is_latest_checkpoint_plus_log_replay(tmp_path: Path) -> None:
    """The worker's recipe in miniature: log every TE (strong), checkpoint mid-way on a helper
    thread, crash; restore the checkpoint and replay the log after its lsn: same state."""
    schema = ["CREATE TABLE kv (k VARCHAR PRIMARY KEY, v BIGINT)"]

    def new_db() -> duckdb.DuckDBPyConnection:
        con = duckdb.connect(config={"enable_external_access": False})
        for sql in schema:
            con.execute(sql)
        return con

    def apply(con: duckdb.DuckDBPyConnection, payload: bytes) -> None:
        header, (batch,) = decode_command(payload)
        con.register("batch", batch)
        con.execute(
            "INSERT INTO kv SELECT k, sum(v) FROM batch GROUP BY k ON CONFLICT (k) DO UPDATE SET v = kv.v + excluded.v"
        )
        con.unregister("batch")
        assert header["procedure"] == "add"

    live = new_db()
    log = CommandLog(tmp_path / "log", group_ms=1.0)
    threads = []
    for ts in range(1, 121):
        batch = pa.table({"k": [f"key{(ts * i) % 17}" for i in range(5)], "v": [ts + i for i in range(5)]})
        payload = encode_command({"procedure": "add", "ts": ts}, [batch])
        apply(live, payload)  # execute, then log; ack only once durable
        lsn = log.append(RecordKind.TE, payload, ts=ts)
        if ts in (40, 90):
            snap = begin_snapshot(live, ts=ts, lsn=lsn)
            threads.append(threading.Thread(target=snap.write, args=(tmp_path / "ckpt",), kwargs={"log": log}))
            threads[-1].start()
    log.flush()
    for t in threads:
        t.join()
    log.close()

    latest = latest_checkpoint(tmp_path / "ckpt")
    assert latest is not None and latest.name == checkpoint_name(90)
    loaded = load_checkpoint(latest)
    recovered = new_db()
    restore_into(recovered, loaded)
    replayed = 0
    with CommandLog(tmp_path / "log") as reopened:
        for rec in reopened.records(loaded.lsn + 1):
            apply(recovered, rec.payload)
            replayed += 1
        assert reopened.truncate_before(loaded.lsn + 1) == 0  # one segment: nothing wholly older
    assert replayed == 30
    assert dump(recovered) == dump(live)
