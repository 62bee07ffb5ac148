"""State procedures (TStream's three steps) under both executors, against a plain model."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtx.client import Client
from streamtx.procedure import Event
from streamtx.procedures.examples.counters import reference_add
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.partition.opchain import WorkingSet, apply_event

pytestmark = pytest.mark.timeout(300)

DDL = """
CREATE TABLE counters (key BIGINT PRIMARY KEY, n BIGINT NOT NULL);
CREATE TABLE seen (batch BIGINT, total BIGINT);
CREATE STREAM counter_events (event_id BIGINT, key BIGINT, delta BIGINT, "limit" BIGINT, mirror BIGINT);
CREATE STREAM counter_results (event_id BIGINT, ok BOOLEAN);
CREATE STREAM audit (event_id BIGINT, ok BOOLEAN);
CREATE PROCEDURE bounded_add ON STREAM counter_events AS PYTHON 'examples.counters:bounded_add';
"""

# a SQL procedure downstream of the state procedure: a barrier that must see the state written back
BARRIER = """
CREATE TABLE counters (key BIGINT PRIMARY KEY, n BIGINT NOT NULL);
CREATE TABLE seen (batch BIGINT, total BIGINT);
CREATE STREAM counter_events (event_id BIGINT, key BIGINT, delta BIGINT, "limit" BIGINT, mirror BIGINT);
CREATE STREAM counter_results (event_id BIGINT, ok BOOLEAN);
CREATE PROCEDURE bounded_add ON STREAM counter_events AS PYTHON 'examples.counters:bounded_add';
CREATE PROCEDURE audit ON STREAM counter_results AS BEGIN
    INSERT INTO seen SELECT $ts, coalesce(sum(n), 0) FROM counters;
END;
"""


def model(events: list[dict]) -> tuple[dict[int, int], list[tuple[int, bool]], list[int]]:
    counters: dict[int, int] = {}
    results, totals = [], []
    for e in events:
        ok = reference_add(counters, e["key"], e["delta"], e["limit"], e["mirror"])
        results.append((e["event_id"], ok))
        totals.append(sum(counters.values()))
    return counters, results, totals


def make_events(seed: int, count: int, keys: int) -> list[dict]:
    rnd = random.Random(seed)
    return [
        {
            "event_id": i,
            "key": rnd.randrange(keys),
            "delta": rnd.randrange(1, 5),
            "limit": rnd.randrange(5, 40),
            "mirror": rnd.choice([None, rnd.randrange(keys)]),
        }
        for i in range(count)
    ]


def test_apply_event_is_all_or_nothing():
    ws = WorkingSet()
    ws.load("t", {1: {"key": 1, "n": 5}, 2: {"key": 2, "n": 0}})
    ev = Event({"x": 1}, 7)
    ev.read_modify("t", 2, lambda r: {**r, "n": r["n"] + 1})
    ev.read_modify("t", 1, lambda r: {**r, "n": r["n"] + 1}, cond=lambda r: r["n"] < 5)
    apply_event(ev, ws)
    assert ev.rejected and "condition failed on t[1]" in ev.reason
    assert ws.get("t", 2) == {"key": 2, "n": 0} and not ws.dirty.get("t")
    ok = Event({"x": 2}, 8)
    ref = ok.read("t", 1)
    dep = ok.write("t", 2, {"key": 2, "n": 9}, reads=[("t", 1)], cond=lambda cur, other: other["n"] == 5)
    apply_event(ok, ws)
    assert not ok.rejected and ok.value(ref) == {"key": 1, "n": 5} and ok.value(dep)["n"] == 9
    assert ws.dirty["t"] == {2}


@pytest.fixture(scope="module", params=[("serial", None), ("opchain", 1), ("opchain", 7), ("opchain", 500)])
def server(request, tmp_path_factory):
    executor, interval = request.param
    with EmbeddedServer(tmp_path_factory.mktemp("st"), executor=executor, interval_size=interval) as srv:
        yield srv


def reset(c: Client, script: str) -> None:
    status = c.status()
    drops = [f"DROP {k.upper()} {n};" for k in ("procedure", "stream", "table") for n in status.get(k + "s", [])]
    if drops:
        c.deploy("\n".join(drops))
    c.deploy(script)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), count=st.integers(1, 120), keys=st.integers(1, 8), batch=st.integers(1, 9))
def test_state_procedure_matches_model(server, seed, count, keys, batch):
    events = make_events(seed, count, keys)
    counters, results, _ = model(events)
    table = pa.Table.from_pylist(events, schema=pa.schema([(n, pa.int64()) for n in events[0]]))
    with Client(server.target, max_in_flight=256) as c:
        reset(c, DDL)
        acks = [f.result() for f in [c.push("counter_events", table.slice(i, batch)) for i in range(0, count, batch)]]
        assert all(a.outcome == "committed" and not a.reason for a in acks)
        assert dict(c.query("SELECT key, n FROM counters").fetchall()) == counters
        got = c.query("SELECT event_id, ok FROM counter_results ORDER BY event_id").fetchall()
        assert got == results


def test_sql_procedure_downstream_sees_the_state(server):
    """A SQL TE after a state TE is a barrier: it reads exactly the state after that batch."""
    events = make_events(3, 60, 4)
    _, _, totals = model(events)
    table = pa.Table.from_pylist(events, schema=pa.schema([(n, pa.int64()) for n in events[0]]))
    with Client(server.target, max_in_flight=256) as c:
        reset(c, BARRIER)
        acks = [f.result() for f in [c.push("counter_events", table.slice(i, 1)) for i in range(60)]]
        assert all(a.outcome == "committed" and not a.reason for a in acks)
        seen = c.query("SELECT total FROM seen ORDER BY batch").fetchall()
    assert [t for (t,) in seen] == totals


def test_write_back_takes_every_way_to_the_same_table():
    """Few or many rows, new or held, plain or not, keyed by another key: the table ends as the rows say."""
    from streamtx.server.catalog.catalog import Catalog
    from streamtx.server.config import default_procedures_path
    from streamtx.server.loader import ProcedureLoader
    from streamtx.server.partition.engine import Engine
    from streamtx.server.partition.state import SMALL

    loader = ProcedureLoader(default_procedures_path())
    eng = Engine(0, loader)
    script = "CREATE TABLE t (k BIGINT PRIMARY KEY, v VARCHAR, l INTEGER[]);"
    new, _, _, ddl = Catalog().deploy(script, loader.resolve)
    eng.install(new, ddl)
    eng.con.execute("INSERT INTO t VALUES (1, 'one', [1]), (2, 'two', [])")
    state, ws = eng.state, eng.state.ws
    expected = {1: ("one", [1]), 2: ("two", [])}

    def write(rows: dict[int, dict], stored: dict[int, tuple] | None = None) -> None:
        state.load_for([_reads("t", list(rows))])
        for key, row in rows.items():
            ws.rows["t"][key] = row
            ws.dirty.setdefault("t", set()).add(key)
            expected[row["k"]] = (row.get("v"), row.get("l"))
        expected.update(stored or {})
        state.write_back()
        assert {k: (v, items) for k, v, items in eng.con.execute("SELECT * FROM t").fetchall()} == expected

    write({1: {"k": 1, "v": "uno", "l": [1, 2]}, 3: {"k": 3, "v": "three", "l": None}})  # one statement per row
    write({k: {"k": k, "v": str(k), "l": [k]} for k in range(4, 5 + SMALL)})  # new rows, through a relation
    write({2: {"k": 2, "v": None, "l": [None]}, 9: {"k": 9, "v": 9.5, "l": []}}, {9: ("9.5", [])})  # cast
    ws.load("t", {20: {"k": 20, "v": "x", "l": []}})  # held but not in the table: the UPDATE finds nothing
    write({20: {"k": 20, "v": "twenty", "l": [20]}})
    write({21: {"k": 22, "v": "moved", "l": []}})  # a row under another key: the general upsert
    write({22: {"k": 22, "v": "back", "l": [2]}})
    eng.con.close()


def _reads(table: str, keys: list[int]) -> Event:
    ev = Event({}, 0)
    for key in keys:
        ev.read(table, key)
    return ev
