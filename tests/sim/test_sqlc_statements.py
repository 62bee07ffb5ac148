"""Compiled SQL statements (server/sqlc) against DuckDB: the same procedures, the same batches, the same results.

Each example deploys a procedure of random statements from the compiled
subset (inserts from the batch with lookup joins, upserts, updates and
deletes by key or by a scan of a small table, emits, grouping, window
functions, aborts), pushes random batches, and runs them four ways: serial
and opchain, each with statements run in DuckDB (the reference) and
compiled. Every batch's outcome (reason included), every table and every
stored output must be identical (`streamtx.testing.run`).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamtx.server.partition import state
from streamtx.server.sqlc.errors import Unsupported
from streamtx.server.sqlc.statement import compile_statement
from streamtx.testing import Harness, run

EXAMPLES = int(os.environ.get("SQLC_EXAMPLES", "40"))  # more: a longer hunt

SCHEMA = """
CREATE TABLE kv (k INTEGER PRIMARY KEY, v BIGINT NOT NULL, s VARCHAR);
CREATE TABLE pair (a VARCHAR, b INTEGER, n BIGINT NOT NULL, PRIMARY KEY (a, b));
CREATE TABLE lookup (id INTEGER PRIMARY KEY, label VARCHAR NOT NULL, w INTEGER);
CREATE STREAM ins (k INTEGER, v BIGINT, s VARCHAR, flag BOOLEAN);
CREATE STREAM outs (k INTEGER, x BIGINT, label VARCHAR);
CREATE PROCEDURE fill () AS BEGIN
    INSERT INTO lookup SELECT i, 'L' || i, i * 10 FROM range(0, 5) t(i);
    INSERT INTO kv VALUES (1, 100, 'one'), (2, 200, NULL), (9, -5, 'nine');
END;
"""

VALUE = st.sampled_from(
    ["i.v", "i.v + 1", "i.v * 2", "coalesce(l.w, 0) + i.v", "CASE WHEN i.flag THEN i.v ELSE -i.v END", "i.v // 3"]
)
PRED = st.sampled_from(
    ["", "WHERE i.v > 0", "WHERE i.flag", "WHERE i.s IS NOT NULL", "WHERE i.k IN (1, 2, 3)", "WHERE NOT i.flag"]
)
CONFLICT = st.sampled_from(
    [
        "",
        "ON CONFLICT DO NOTHING",
        "ON CONFLICT DO UPDATE SET v = kv.v + excluded.v",
        "ON CONFLICT DO UPDATE SET v = excluded.v, s = coalesce(excluded.s, kv.s)",
        "ON CONFLICT (k) DO UPDATE SET s = excluded.s WHERE excluded.v > kv.v",
    ]
)


@st.composite
def statements(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 11))
    if kind == 0:
        value, pred, conflict = draw(VALUE), draw(PRED), draw(CONFLICT)
        return f"INSERT INTO kv SELECT i.k, {value}, i.s FROM ins i LEFT JOIN lookup l ON l.id = i.k {pred} {conflict}"
    if kind == 1:
        return f"INSERT OR REPLACE INTO kv SELECT k, v, s FROM ins {draw(PRED).replace('i.', '')}"
    if kind == 2:
        order = draw(st.sampled_from(["", "ORDER BY i.k, i.v"]))
        value = draw(VALUE)
        return f"INSERT INTO outs SELECT i.k, {value}, l.label FROM ins i LEFT JOIN lookup l ON l.id = i.k {order}"
    if kind == 3:
        return f"UPDATE kv SET v = v + {draw(st.integers(-3, 3))} WHERE k = {draw(st.integers(0, 9))}"
    if kind == 4:
        return "UPDATE kv SET s = upper(coalesce(s, 'x')) || '!' WHERE k IN (SELECT k FROM ins)"
    if kind == 5:
        return f"DELETE FROM kv WHERE k IN (SELECT k FROM ins i {draw(PRED)})"
    if kind == 6:
        return f"SELECT error('too low: ' || min(v)) FROM ins HAVING min(v) < {draw(st.integers(-50, 5))}"
    if kind == 7:
        return (
            "INSERT INTO pair SELECT s, k, count(*) FROM ins WHERE s IS NOT NULL GROUP BY s, k "
            "ON CONFLICT DO UPDATE SET n = pair.n + excluded.n"
        )
    if kind == 8:
        return "INSERT INTO outs SELECT k, count(*), max(s) FROM ins GROUP BY k"
    if kind == 9:
        return f"UPDATE lookup SET w = (SELECT count(*) FROM ins) WHERE id = {draw(st.integers(0, 5))}"
    if kind == 10:
        return draw(GUARDED).format(n=draw(st.integers(-2, 4)))
    return draw(RANKED)


RANKED = st.sampled_from(  # a filter over a subquery's columns (moved into it when compiled), sort keys of each kind
    [
        "INSERT INTO outs SELECT k, r, 'top' FROM "
        "(SELECT k, row_number() OVER (ORDER BY v DESC, k) AS r FROM kv) WHERE r <= 3",
        "INSERT INTO outs SELECT id, r, label FROM (SELECT id, label, "
        "rank() OVER (ORDER BY coalesce(w, 0) DESC, id) AS r FROM lookup) t WHERE t.r < 3 AND id > 0",
        "INSERT INTO outs SELECT id, r, 'w' FROM "
        "(SELECT id, w, dense_rank() OVER (ORDER BY w NULLS FIRST) AS r FROM lookup) WHERE w IS NULL OR r <= 2",
        "INSERT INTO outs SELECT k, n, s FROM "
        "(SELECT k, s, count(*) AS n FROM ins GROUP BY k, s) WHERE n >= 2 OR k IS NULL",
        "INSERT INTO outs SELECT k, m, 'max' FROM (SELECT k, max(v) AS m FROM ins GROUP BY k) WHERE m > 0",
        "INSERT INTO outs SELECT k, v, s FROM (SELECT k, v, s FROM kv ORDER BY s DESC, k) WHERE v >= 100 ORDER BY k",
        # a top K: row_number numbers only the first K rows
        "INSERT INTO outs SELECT k, r * 10, 'lt' FROM "
        "(SELECT k, row_number() OVER (ORDER BY v NULLS FIRST, k DESC) AS r FROM kv) WHERE 2 > r",
        "INSERT INTO outs SELECT k, r + q, 'two' FROM (SELECT k, row_number() OVER (ORDER BY v, k) AS r, "
        "rank() OVER (ORDER BY s) AS q FROM kv) WHERE r <= 2 AND q < 5",
        # top Ks kept up to date between runs, through lookups of rows other statements write
        "INSERT INTO outs SELECT id, r, label FROM (SELECT l.id, l.label, row_number() OVER "
        "(ORDER BY coalesce(k.v, 0) DESC, l.id) AS r FROM lookup l LEFT JOIN kv k ON k.k = l.id) WHERE r <= 2",
        "INSERT INTO outs SELECT k, r, s FROM (SELECT k.k, k.s, row_number() OVER (ORDER BY l.w DESC NULLS LAST, "
        "k.v) AS r FROM kv k JOIN lookup l ON l.id = k.k WHERE k.v > -10) WHERE r <= 3",
    ]
)


GUARDED = st.sampled_from(  # conditions that read no row of the FROM: tested once, before any row (or not)
    [
        "INSERT INTO outs SELECT k, v, s FROM kv WHERE (SELECT count(*) FROM ins) > {n}",
        "INSERT INTO outs SELECT 0, count(*), 'n' FROM kv WHERE (SELECT max(v) FROM ins) > {n}",
        "INSERT INTO outs SELECT i.k, i.v, i.s FROM ins i WHERE (SELECT sum(v) FROM kv) // {n} > 20 AND i.v > 0",
        "INSERT INTO outs SELECT i.k, i.v, i.s FROM ins i WHERE (SELECT count(*) FROM ins) > {n} AND i.v * 4 > 0",
        "INSERT INTO outs SELECT i.k, i.v, i.s FROM ins i WHERE (SELECT max(w) FROM lookup) + i.v > {n}",
        "UPDATE kv SET v = v + 1 WHERE (SELECT count(*) FROM ins) >= {n}",
        "INSERT INTO outs SELECT i.k, (SELECT count(*) FROM kv), i.s FROM ins i WHERE (SELECT count(*) FROM kv) > {n}",
    ]
)


ROW = st.fixed_dictionaries(
    {
        "k": st.one_of(st.none(), st.integers(0, 6)),
        "v": st.one_of(st.none(), st.integers(-20, 20), st.sampled_from([2**62, -(2**63)])),
        "s": st.one_of(st.none(), st.sampled_from(["", "a", "b", "ä"])),
        "flag": st.one_of(st.none(), st.booleans()),
    }
)


def deploy(body: list[str]) -> str:
    return SCHEMA + "CREATE PROCEDURE p ON STREAM ins AS BEGIN\n" + "".join(f"    {s};\n" for s in body) + "END;\n"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.lists(statements(), min_size=1, max_size=3),
    batches=st.lists(st.lists(ROW, min_size=1, max_size=4), min_size=1, max_size=6),
)
def test_compiled_statements_do_what_duckdb_does(body: list[str], batches: list[list[dict]]) -> None:
    run(
        deploy(body),
        [("ins", rows) for rows in batches],
        setup=lambda h: h.call("fill"),
        sql_compiler=("off", "on"),
        interval_size=3,
    )


IN_DUCKDB = st.sampled_from(  # SQL the compiler leaves to DuckDB: it writes the tables behind the working set's back
    [
        "INSERT INTO kv SELECT k + 3, v, md5(coalesce(s, '')) FROM ins WHERE k IS NOT NULL ON CONFLICT DO NOTHING",
        "DELETE FROM kv WHERE hash(k) % 2 = 0 AND k IN (SELECT k FROM ins)",
    ]
)


@settings(max_examples=max(EXAMPLES // 2, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.lists(st.one_of(statements(), IN_DUCKDB), min_size=1, max_size=4),
    batches=st.lists(st.lists(ROW, min_size=1, max_size=4), min_size=1, max_size=6),
)
@example(  # DuckDB inserts key 5 behind the index's back; the compiled UPDATE must find it
    body=[
        "INSERT INTO kv SELECT k + 3, v, md5(coalesce(s, '')) FROM ins WHERE k IS NOT NULL ON CONFLICT DO NOTHING",
        "UPDATE kv SET v = v + 1 WHERE k = 5",
    ],
    batches=[[{"k": 2, "v": 1, "s": "a", "flag": True}]],
)
@example(  # a stored key (2) clashes before one this TE inserted (3), though 3 comes first: DuckDB names 2
    body=[
        "INSERT INTO kv SELECT k + 3, v, md5(coalesce(s, '')) FROM ins WHERE k IS NOT NULL ON CONFLICT DO NOTHING",
        "INSERT INTO kv SELECT i.k, i.v, i.s FROM ins i LEFT JOIN lookup l ON l.id = i.k",
    ],
    batches=[
        [
            {"k": None, "v": None, "s": None, "flag": None},
            {"k": 3, "v": 6, "s": None, "flag": None},
            {"k": 0, "v": -1, "s": "a", "flag": True},
            {"k": 2, "v": -14, "s": None, "flag": True},
        ]
    ],
)
def test_keys_known_absent_without_duckdb_change_nothing(body: list[str], batches: list[list[dict]]) -> None:
    """The key index (partition/state.py `KeyIndex`) read at the first lookup: the same outcomes as DuckDB's.

    Its set must stay a superset of the keys in DuckDB through compiled deletes, SQL
    that inserts and deletes behind it, aborted TEs and rolled-back intervals.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(state, "INDEX_AFTER", 0)
        run(
            deploy(body),
            [("ins", rows) for rows in batches],
            setup=lambda h: h.call("fill"),
            sql_compiler=("off", "on"),
            interval_size=3,
        )


COMPILED = [
    "INSERT INTO kv SELECT i.k, coalesce(l.w, 0) + i.v, i.s FROM ins i LEFT JOIN lookup l ON l.id = i.k "
    "WHERE i.v > 0 ON CONFLICT DO UPDATE SET v = kv.v + excluded.v",
    "INSERT OR REPLACE INTO kv SELECT k, v, s FROM ins",
    "INSERT INTO outs SELECT i.k, i.v * 2, l.label FROM ins i LEFT JOIN lookup l ON l.id = i.k ORDER BY i.k, i.v",
    "UPDATE kv SET v = v + 1 WHERE k = 3",
    "UPDATE kv SET s = upper(coalesce(s, 'x')) || '!' WHERE k IN (SELECT k FROM ins)",
    "DELETE FROM kv WHERE k IN (SELECT k FROM ins i WHERE i.flag)",
    "SELECT error('too low: ' || min(v)) FROM ins HAVING min(v) < 0",
    "INSERT INTO pair SELECT s, k, count(*) FROM ins WHERE s IS NOT NULL GROUP BY s, k "
    "ON CONFLICT DO UPDATE SET n = pair.n + excluded.n",
    "INSERT INTO outs SELECT k, count(*), max(s) FROM ins GROUP BY k",
    "UPDATE lookup SET w = (SELECT count(*) FROM ins) WHERE id = 2",
    *RANKED.elements,
    *(sql.format(n=2) for sql in GUARDED.elements),
]


@pytest.mark.parametrize("sql", COMPILED)
def test_the_statements_of_the_differential_test_compile(sql: str) -> None:
    """The differential test means something only if its statements do compile rather than run in DuckDB."""
    with Harness(deploy(["SELECT 1"])) as h:
        names = h.engine.sql_plans._names("p")
    try:
        compile_statement(sql, names)
    except Unsupported as e:
        pytest.fail(f"{sql}: {e}")


def test_a_top_k_numbers_only_the_rows_the_enclosing_filter_keeps() -> None:
    """`row_number() ... WHERE r <= K` over a scan and lookups is kept up to date between runs; beside another
    window it sorts every row but numbers K (the differential checks the rows)."""
    with Harness(deploy(["SELECT 1"])) as h:
        names = h.engine.sql_plans._names("p")
    for sql in (RANKED.elements[0], *RANKED.elements[-2:]):
        kept = compile_statement(sql, names).describe
        assert any("kept up to date as rows change" in line for line in kept), kept
    two = compile_statement(RANKED.elements[7], names).describe
    assert any("numbers only the first 2 rows" in line for line in two), two
    ranked = compile_statement(RANKED.elements[1], names).describe  # rank(): ties share a number
    assert not any("numbers only" in line or "kept up to date" in line for line in ranked), ranked
    counted = compile_statement(GUARDED.elements[-1].format(n=2), names).describe
    assert any("count(*) of a whole table: its rows are not read" in line for line in counted), counted


def test_a_grouped_upsert_prefetches_the_keys_it_groups_by() -> None:
    """Its keys load with the interval's, in one query per table, not one point query each as rows are
    written (DuckDB scans the whole table for a point query)."""
    with Harness(deploy(["SELECT 1"])) as h:
        names = h.engine.sql_plans._names("p")
    grouped = compile_statement(
        "INSERT INTO kv SELECT k, sum(v), max(s) FROM ins GROUP BY k ON CONFLICT DO UPDATE SET v = excluded.v", names
    )
    assert [(table, key({"k": 7, "v": 1, "s": "x", "flag": True}, {})) for table, key in grouped.prefetch] == [
        ("kv", 7)
    ]
    by_other = compile_statement(
        "INSERT INTO kv SELECT max(k), sum(v), s FROM ins GROUP BY s ON CONFLICT DO UPDATE SET v = excluded.v", names
    )
    assert by_other.prefetch == []  # the key is an aggregate: not one batch row's


def test_a_kept_top_k_is_re_ranked_only_where_rows_changed() -> None:
    """Between runs the ranking follows the writes of other statements, an abort and SQL run in DuckDB."""
    body = [
        "INSERT INTO kv SELECT k, v, s FROM ins WHERE k IS NOT NULL ON CONFLICT DO UPDATE SET v = excluded.v",
        "SELECT error('no') FROM ins HAVING min(v) < -100",
        RANKED.elements[-2],
    ]
    batches = [
        [{"k": 3, "v": 50, "s": "a", "flag": True}],
        [{"k": 1, "v": -300, "s": "b", "flag": True}],  # aborted: the ranking must not keep its write
        [{"k": 2, "v": 500, "s": None, "flag": None}],
        [{"k": 0, "v": 7, "s": None, "flag": False}, {"k": 4, "v": 8, "s": "c", "flag": False}],
        [{"k": 2, "v": 1, "s": None, "flag": None}],
    ]
    run(
        deploy(body + [IN_DUCKDB.elements[1]]),
        [("ins", rows) for rows in batches],
        setup=lambda h: h.call("fill"),
        sql_compiler=("off", "on"),
        interval_size=2,
    )
    with Harness(deploy(body), executor="opchain", interval_size=5) as h:
        h.call("fill")
        h.push_many([("ins", rows) for rows in batches])
        counters = h.engine.counters
        assert counters["ranked_kept"] >= 2 and counters["ranked_built"] >= 1, dict(counters)


def test_a_subquerys_order_by_a_column_it_does_not_output_survives_a_filter_moved_into_it() -> None:
    """The emitted tuples keep the subquery's order (a window or FOR EACH ROW consumer sees it), as in DuckDB.

    Sorting pairs each output row with its source row by position, so a filter moved into the subquery
    (`x < 150`, which drops kv's row 2 from the middle) must not drop output rows alone.
    """
    subquery = "SELECT k, v AS x, s AS label FROM kv ORDER BY -v"
    body = [f"INSERT INTO outs SELECT k, x, label FROM ({subquery}) q WHERE x < 150"]
    emitted = {}
    for compiler in ("off", "on"):
        with Harness(deploy(body), sql_compiler=compiler) as h:
            h.call("fill")
            h.push("ins", [{"k": 5, "v": 1, "s": "a", "flag": True}])
            emitted[compiler] = [t.to_pylist() for _, t in h.outputs()["outs"]]
    assert emitted["on"] == emitted["off"] == [[{"k": 1, "x": 100, "label": "one"}, {"k": 9, "x": -5, "label": "nine"}]]
