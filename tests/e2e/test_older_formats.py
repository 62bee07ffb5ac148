"""A server recovers from checkpoints and command logs written before the stored timestamp column was `__ts`.

Until then stored stream and window tuples kept their timestamp in a column
`batch_id`, and command logs (format 1) record deploys with DDL naming it so.
Each test turns what a real server wrote into the older form (the same
records, tables and meta; the column named as before) and restarts a server
on it.
"""

from __future__ import annotations

import shutil

import duckdb

from streamtx.client import Client
from streamtx.recovery import CommandLog, LogReader, RecordKind, decode_command, encode_command, load_checkpoint
from streamtx.recovery.checkpoint import latest_checkpoint, write_checkpoint
from streamtx.server.embedded import EmbeddedServer

SCRIPT = """
CREATE STREAM ins (k BIGINT, v BIGINT);
CREATE STREAM outs (k BIGINT, total BIGINT);
CREATE WINDOW recent ON ins ROWS 4 SLIDE 1;
CREATE PROCEDURE roll ON STREAM ins AS BEGIN
    INSERT INTO outs SELECT max(k), sum(v) FROM recent;
END;
"""


def rewrite_as_before_ts(path) -> None:
    """Replaces the checkpoint at `path` by one whose stream and window tables call `__ts` `batch_id`."""
    old = load_checkpoint(path)
    con = duckdb.connect()
    names = []
    for (schema, table), data in old.tables.items():
        if schema in ("streams", "windows"):
            assert "__ts" in data.column_names
            data = data.rename_columns(["batch_id" if c == "__ts" else c for c in data.column_names])
        con.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        con.register("incoming", data)
        con.execute(f'CREATE TABLE "{schema}"."{table}" AS SELECT * FROM incoming')
        con.unregister("incoming")
        names.append((schema, table))
    shutil.rmtree(path)
    write_checkpoint(con, names, path.parent, old.ts, old.lsn, meta=old.meta, keep=10)


def test_a_checkpoint_from_before_ts_restores_the_streams_and_windows(tmp_path):
    data = tmp_path / "data"
    with EmbeddedServer(data) as srv, Client(srv.target) as c:
        c.deploy(SCRIPT)
        acks = [c.push("ins", {"k": [i], "v": [10 * i]}).result() for i in range(1, 7)]
        c.checkpoint()
        before = c.query("SELECT k, total, __ts FROM outs ORDER BY __ts").fetchall()
    assert [ts for *_, ts in before] == [a.timestamp for a in acks]
    rewrite_as_before_ts(latest_checkpoint(data / "partition-0" / "checkpoints"))

    with EmbeddedServer(data) as srv, Client(srv.target) as c:
        assert c.query("SELECT k, total, __ts FROM outs ORDER BY __ts").fetchall() == before
        assert c.query("SELECT count(*) FROM windows.recent").fetchall() == [(4,)]
        more = c.push("ins", {"k": [7], "v": [70]}).result()
        assert c.query("SELECT k, total, __ts FROM outs ORDER BY __ts").fetchall()[-1] == (7, 220, more.timestamp)
        got = []
        for ts, rows in c.subscribe("outs", from_ts=acks[4].timestamp):
            got.append((ts, rows.fetchall()))
            if ts == more.timestamp:
                break
    assert got == [(acks[4].timestamp, [(5, 140)]), (acks[5].timestamp, [(6, 180)]), (more.timestamp, [(7, 220)])]


def rewrite_log(log_dir, payload_format: int, kind: RecordKind, change) -> int:
    """Writes the log at `log_dir` again in `payload_format`, each `kind` record's (head, tables) through
    `change` (None: left as it was); returns how many it changed."""
    records = list(LogReader(log_dir).records())
    older = log_dir.parent / f"log-format-{payload_format}"
    log = CommandLog(older, payload_format=payload_format)
    changed = 0
    for r in records:
        payload = r.payload
        if r.kind == kind:
            head = change(*decode_command(payload))
            if head is not None:
                payload = encode_command(head, decode_command(payload)[1])
                changed += 1
        log.append(r.kind, payload, r.ts)
    log.close()
    shutil.rmtree(log_dir)
    older.rename(log_dir)
    return changed


def rewrite_as_format_1(log_dir) -> int:
    """The log in payload format 1, its deploys' `__ts` named `batch_id`; returns how many deploys changed."""

    def change(head, _tables):
        ddl = [s.replace(", __ts BIGINT NOT NULL", ", batch_id BIGINT NOT NULL") for s in head["ddl"]]
        ddl = [s.replace(", __ts FROM streams.", ", batch_id FROM streams.") for s in ddl]
        return {**head, "ddl": ddl} if ddl != head["ddl"] else None

    return rewrite_log(log_dir, 1, RecordKind.INSTALL, change)


def test_a_format_1_command_log_replays_its_deploys_with_the_current_column(tmp_path):
    data = tmp_path / "data"
    with EmbeddedServer(data) as srv, Client(srv.target) as c:
        c.deploy(SCRIPT)
        acks = [c.push("ins", {"k": [i], "v": [10 * i]}).result() for i in range(1, 6)]
        before = c.query("SELECT k, total, __ts FROM outs ORDER BY __ts").fetchall()
    assert [ts for *_, ts in before] == [a.timestamp for a in acks]
    assert rewrite_as_format_1(data / "partition-0" / "log") == 1

    with EmbeddedServer(data) as srv, Client(srv.target) as c:
        assert c.query("SELECT k, total, __ts FROM outs ORDER BY __ts").fetchall() == before
        more = c.push("ins", {"k": [6], "v": [60]}).result()
        assert c.query("SELECT k, total, __ts FROM outs ORDER BY __ts").fetchall()[-1] == (6, 180, more.timestamp)


def rewrite_as_format_3(log_dir) -> int:
    """The log in payload format 3: INTERVAL records spell out each TE's spec; returns how many."""

    def change(head, _tables):
        specs = head.pop("specs")
        head["batches"] = [[ts, mark, [specs[i] for i in places], ins] for ts, mark, places, ins in head["batches"]]
        return head

    return rewrite_log(log_dir, 3, RecordKind.INTERVAL, change)


def test_a_format_3_command_log_replays_its_intervals(tmp_path):
    data = tmp_path / "data"
    with EmbeddedServer(data) as srv, Client(srv.target) as c:
        c.deploy(SCRIPT)
        futures = [c.push("ins", {"k": [i], "v": [10 * i]}) for i in range(1, 201)]  # pipelined: intervals
        acks = [f.result() for f in futures]
        before = c.query("SELECT k, total, __ts FROM outs ORDER BY __ts").fetchall()
    assert [ts for *_, ts in before] == [a.timestamp for a in acks]
    assert rewrite_as_format_3(data / "partition-0" / "log") >= 1

    with EmbeddedServer(data) as srv, Client(srv.target) as c:
        assert c.query("SELECT k, total, __ts FROM outs ORDER BY __ts").fetchall() == before
        more = c.push("ins", {"k": [201], "v": [2010]}).result()
        last = c.query("SELECT k, total, __ts FROM outs ORDER BY __ts").fetchall()[-1]
        assert last == (201, 10 * (198 + 199 + 200 + 201), more.timestamp)
