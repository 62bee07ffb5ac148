"""Windows held in memory with the SQL compiler on, against windows kept in DuckDB (`--sql-compiler off`).

Random ROWS windows (sizes, slides) over random batches, random interval
sizes, under both executors: a trigger on the window rebuilds an aggregate
from it (compiled, reading the window from memory) and sometimes aborts;
the owning procedure reads the window in a statement that runs in DuckDB
(so the in-memory window must have reached DuckDB's table first) and
sometimes aborts its batch. Every outcome, every table and the window's
final contents must be the same both ways (`streamtx.testing.run`).

The trigger's grouped aggregates are kept up to date as tuples enter and
leave the window (server/partition/windows.py `Windows.groups`); two of them
join a table the procedure writes after the window moved, so the kept
groups must be rebuilt whenever it did.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtx.testing import Harness, run

SCRIPT = """
CREATE TABLE agg (k INTEGER PRIMARY KEY, n BIGINT NOT NULL, total BIGINT);
CREATE TABLE seen (n BIGINT, lo BIGINT, hi BIGINT, ts BIGINT);
CREATE TABLE lab (k INTEGER PRIMARY KEY, w INTEGER);
CREATE TABLE joined (k INTEGER PRIMARY KEY, n BIGINT NOT NULL, labelled BIGINT NOT NULL, total BIGINT);
CREATE TABLE by_label (w INTEGER PRIMARY KEY, n BIGINT NOT NULL);
CREATE STREAM s (k INTEGER, v BIGINT);
CREATE WINDOW w ON s ROWS {size} SLIDE {slide};
CREATE PROCEDURE p ON STREAM s {each} AS BEGIN
    SELECT error('too low') WHERE EXISTS (SELECT 1 FROM s WHERE v < -15);
    INSERT INTO seen SELECT count(*), min(v), max(v), $ts FROM w;
    INSERT INTO lab SELECT k, max(v) FROM s WHERE k IS NOT NULL AND v > 5 GROUP BY k
        ON CONFLICT DO UPDATE SET w = excluded.w;
    DELETE FROM lab WHERE k IN (SELECT k FROM s WHERE v < -5);
END;
CREATE TRIGGER t ON WINDOW w AS BEGIN
    DELETE FROM agg;
    INSERT INTO agg SELECT k, count(*), sum(v) FROM w WHERE k IS NOT NULL GROUP BY k;
    DELETE FROM joined;
    INSERT INTO joined SELECT x.k, count(*), count(l.w), sum(l.w + x.v)
        FROM w x LEFT JOIN lab l ON l.k = x.k WHERE x.k IS NOT NULL GROUP BY x.k HAVING count(*) > 1;
    DELETE FROM by_label;
    INSERT INTO by_label SELECT l.w, count(*) FROM w x JOIN lab l ON l.k = x.k GROUP BY l.w;
    SELECT error('window sum too high') WHERE (SELECT sum(v) FROM w) > {limit};
END;
"""

ROW = st.fixed_dictionaries(
    {"k": st.one_of(st.none(), st.integers(0, 3)), "v": st.one_of(st.none(), st.integers(-20, 20))}
)


EXAMPLES = int(os.environ.get("SQLC_WINDOW_EXAMPLES", "25"))  # more: a longer hunt


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    size=st.integers(1, 5),
    slide=st.integers(1, 3),
    each=st.sampled_from(["", "FOR EACH ROW"]),
    limit=st.integers(10, 60),
    interval=st.integers(1, 4),
    batches=st.lists(st.lists(ROW, min_size=1, max_size=4), min_size=1, max_size=8),
)
def test_windows_in_memory_do_what_windows_in_duckdb_do(
    size: int, slide: int, each: str, limit: int, interval: int, batches: list[list[dict]]
) -> None:
    script = SCRIPT.format(size=size, slide=min(slide, size), each=each, limit=limit)
    run(script, [("s", rows) for rows in batches], sql_compiler=("off", "on"), interval_size=interval)


def test_the_trigger_on_the_window_is_compiled() -> None:
    """The differential test means something only if the trigger does read the window from memory."""
    with Harness(SCRIPT.format(size=3, slide=1, each="", limit=50)) as h:
        cat = h.engine.catalog
        plans = h.engine.sql_plans.explain("trigger t", cat.trigger_plans["t"].statements)
    assert all(p.compiled for p in plans), [p.reason for p in plans]
    assert "the window w" in plans[1].plan
    kept = [i for i, p in enumerate(plans) if "kept up to date as tuples enter and leave window w" in p.plan]
    assert kept == [1, 3, 5, 6], [p.plan for p in plans]


def test_grouped_aggregates_are_kept_while_the_joined_table_is_unwritten() -> None:
    """Without writes to `lab`, each slide updates the kept groups; a write to `lab` has them rebuilt once."""
    script = SCRIPT.format(size=4, slide=1, each="", limit=1000)
    with Harness(script) as h:
        h.push_many([("s", [{"k": i % 3, "v": 1}]) for i in range(10)])
        counters = h.engine.counters
        built, kept = counters["window_groups_built"], counters["window_groups_kept"]
        assert kept >= 3 * built, (built, kept)
        h.push("s", [{"k": 1, "v": 9}])  # writes lab (after the window moved)
        h.push("s", [{"k": 2, "v": 1}])
        assert counters["window_groups_built"] > built
        # the window: (2, 1), (0, 1), (1, 9), (2, 1); lab: {1: 9}
        assert h.query("SELECT * FROM joined").fetchall() == [(2, 2, 0, None)]
        assert h.query("SELECT * FROM by_label").fetchall() == [(9, 1)]
        assert h.query("SELECT * FROM agg ORDER BY k").fetchall() == [(0, 1, 1), (1, 1, 9), (2, 2, 2)]
