"""Exactly-once bookkeeping of a partition (server/partition/marks.py), in process.

The laws are asserted where batches are taken, so a path that takes a batch
twice, or runs a command behind the clock, stops at once; a re-sent batch's
DUPLICATE carries its original timestamp for the latest TAKEN_HISTORY ids of
its producer's stream, held back or written, and 0 beyond them.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from streamtx.server.catalog.catalog import Catalog
from streamtx.server.loader import ProcedureLoader
from streamtx.server.partition import state
from streamtx.server.partition.dataflow import Dataflow, Push
from streamtx.server.partition.engine import Engine
from streamtx.server.partition.marks import Marks

SCRIPT = """
CREATE TABLE totals (k BIGINT PRIMARY KEY, n BIGINT);
CREATE STREAM adds (k BIGINT);
CREATE PROCEDURE add ON STREAM adds AS BEGIN
    INSERT INTO totals SELECT k, count(*) FROM adds GROUP BY k ON CONFLICT DO UPDATE SET n = totals.n + excluded.n;
END;
"""


def test_a_mark_only_increases_and_the_clock_never_goes_back() -> None:
    marks = Marks()
    marks.took([("p", "s", 1, 5), ("p", "s", 2, 7), ("q", "s", 1, 8)])
    assert (marks.last("p", "s"), marks.last("q", "s"), marks.last_ts) == (2, 1, 8)
    assert marks.taken("p", "s", 2) and not marks.taken("p", "s", 3)
    with pytest.raises(AssertionError, match="taken twice"):
        marks.took([("p", "s", 2, 9)])
    with pytest.raises(AssertionError, match="timestamp order"):
        marks.ran(7)


@pytest.mark.parametrize("executor", ["serial", "opchain"])
def test_a_resent_batch_gets_its_original_timestamp_within_the_history(
    executor: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(state, "TAKEN_HISTORY", 10)
    eng = Engine(0, ProcedureLoader(tmp_path), executor=executor)
    new, _, _, ddl = Catalog().deploy(SCRIPT, eng.loader.resolve)
    eng.install(new, ddl)
    flow = Dataflow(eng)
    ts = 100
    for batch_id in range(1, 31):  # another producer between each, so no two timestamps are consecutive
        ts += 2
        flow.run_pushes([Push("adds", "p", batch_id, ts, pa.table({"k": [batch_id % 3]}))])
    stamps = {b: 100 + 2 * b for b in range(1, 31)}
    held = [flow.run_pushes([Push("adds", "p", b, 999, pa.table({"k": [7]}))])[0] for b in (30, 25)]
    assert [(o.outcome, o.original, o.ts) for o in held] == [("duplicate", "committed", stamps[b]) for b in (30, 25)]
    eng.state.sync()  # written to DuckDB, the history cut to about TAKEN_HISTORY ids
    kept = eng.con.execute("SELECT min(batch_id), count(*) FROM streamtx.taken").fetchone()
    assert kept[0] >= 30 - 2 * 10 and kept[1] <= 2 * 10
    for b in (30, 21):
        assert eng.original_outcome("p", "adds", b).ts == stamps[b]
    assert eng.original_outcome("p", "adds", 1).ts == 0  # beyond the history: still a duplicate, time unknown
    assert eng.con.execute("SELECT sum(n) FROM totals").fetchone() == (30,)
    assert eng.marks.last_ts == stamps[30]
