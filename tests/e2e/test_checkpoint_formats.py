"""A server restores checkpoints written before the stored timestamp column was named `__ts`.

Until then stored stream and window tuples kept their timestamp in a column
`batch_id`. The test writes such a checkpoint from a real one (same tables,
meta, timestamp and log position; the column renamed back) and restarts a
server on it.
"""

from __future__ import annotations

import shutil

import duckdb

from streamtx.client import Client
from streamtx.recovery import load_checkpoint
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
