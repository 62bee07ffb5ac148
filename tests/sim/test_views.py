"""Views kept by the server (CREATE VIEW ... GROUP BY): always equal to their query, whatever writes their table.

The oracle is the view's own query over its table, run by DuckDB at the end:
writes by compiled SQL, by SQL run in DuckDB, by state procedures and by
aborted TEs, under every executor, with the compiler on and off, one or two
partitions, and across a restart from the command log.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamtx.client import Client
from streamtx.errors import InvalidArgument
from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params
from streamtx.server.embedded import EmbeddedServer
from streamtx.testing import Harness, run

pytestmark = pytest.mark.timeout(300)

VIEW = "SELECT g, count(*) AS n, sum(v) AS total, count(s) AS named FROM kv GROUP BY g"
PAIR_VIEW = "SELECT a, b, count(*) AS n, sum(w) AS w FROM pair GROUP BY a, b"

SCHEMA = f"""
CREATE TABLE kv (k INTEGER PRIMARY KEY, g INTEGER NOT NULL, v BIGINT NOT NULL, s VARCHAR);
CREATE TABLE pair (id INTEGER PRIMARY KEY, a VARCHAR NOT NULL, b SMALLINT NOT NULL, w INTEGER NOT NULL);
CREATE VIEW byg AS {VIEW};
CREATE VIEW byab AS {PAIR_VIEW};
CREATE STREAM ins (k INTEGER, g INTEGER, v BIGINT, s VARCHAR);
CREATE STREAM seen (g INTEGER, n BIGINT, total HUGEINT);
"""

STATEMENTS = {
    # compiled: upserts that move rows between groups, deletes, updates
    "upsert": "INSERT INTO kv SELECT k, g, v, s FROM ins "
    "ON CONFLICT DO UPDATE SET g = excluded.g, v = kv.v + excluded.v, s = excluded.s",
    "insert_ignore": "INSERT OR IGNORE INTO kv SELECT k, g, v, s FROM ins",
    "delete_negative": "DELETE FROM kv WHERE v < 0",
    "update_by_key": "UPDATE kv SET v = v - 3, s = NULL WHERE k IN (SELECT k FROM ins WHERE v % 2 = 0)",
    "pair": "INSERT INTO pair SELECT k, CASE WHEN g % 2 = 0 THEN 'x' ELSE 'y' END, g, v FROM ins "
    "ON CONFLICT DO UPDATE SET w = pair.w + excluded.w, b = excluded.b",
    # read-your-writes: the view as this TE left it
    "read": "INSERT INTO seen SELECT b.g, b.n, b.total FROM byg b WHERE b.g IN (SELECT g FROM ins)",
    # run in DuckDB (outside the compiled subset): the view is recomputed
    "update_from": "UPDATE kv SET g = i.g FROM ins i WHERE kv.k = i.k + 1",
    "delete_using": "DELETE FROM pair USING ins WHERE pair.id = ins.k AND ins.v > 6",
    # an abort after writes: none of them, in the view either
    "abort": "SELECT error('too big') FROM ins WHERE v > 8",
}


def deploy(names: list[str]) -> str:
    body = "; ".join(STATEMENTS[n] for n in names)
    return SCHEMA + f"CREATE PROCEDURE p ON STREAM ins AS BEGIN {body}; END;"


def assert_views_equal_their_query(tables: dict[str, pa.Table], h: Harness) -> None:
    for name, sql in (("byg", VIEW), ("byab", PAIR_VIEW)):
        expected = h.query(f"SELECT * FROM ({sql}) ORDER BY ALL").arrow()
        assert tables[name].equals(expected), f"view {name}:\n{tables[name]}\n!=\n{expected}"


rows = st.fixed_dictionaries(
    {
        "k": st.integers(0, 12),
        "g": st.integers(0, 3),
        "v": st.integers(-4, 10),
        "s": st.sampled_from([None, "a", "b"]),
    }
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(st.sampled_from(sorted(STATEMENTS)), min_size=1, max_size=5),
    batches=st.lists(st.lists(rows, min_size=1, max_size=4), min_size=1, max_size=15),
)
@example(  # rows DuckDB inserted in a TE that then aborted were kept as loaded rows: k 11 "existed" afterwards
    names=["insert_ignore", "delete_negative", "abort"],
    batches=[
        [{"k": 11, "g": 0, "v": 10, "s": None}, {"k": 9, "g": 0, "v": 10, "s": None}] * 2,
        [{"k": 0, "g": 0, "v": -4, "s": None}],
        [{"k": 0, "g": 0, "v": 8, "s": None}, {"k": 11, "g": 3, "v": 6, "s": None}],
    ],
)
def test_views_equal_their_query_whatever_writes_the_table(names, batches):
    script = deploy(names)
    pushes = [("ins", b) for b in batches]
    result = run(script, pushes, sql_compiler=("off", "on"))
    with Harness(script) as h:
        h.push_many(pushes)
        assert_views_equal_their_query(result.tables, h)


def test_a_view_holds_one_row_per_group_and_loses_empty_groups():
    with Harness(deploy(["upsert", "delete_negative", "read"])) as h:
        h.push("ins", [{"k": 1, "g": 7, "v": 5, "s": "a"}, {"k": 2, "g": 7, "v": 1, "s": None}])
        assert h.query("SELECT * FROM byg").fetchall() == [(7, 2, 6, 1)]
        h.push("ins", [{"k": 1, "g": 8, "v": 1, "s": None}])  # k 1 moves from group 7 to group 8
        assert h.query("SELECT * FROM byg ORDER BY g").fetchall() == [(7, 1, 1, 0), (8, 1, 6, 0)]
        h.push("ins", [{"k": 2, "g": 7, "v": -9, "s": None}])  # deleted: group 7 is empty, so gone
        assert h.query("SELECT * FROM byg").fetchall() == [(8, 1, 6, 0)]
        seen = [r for _, t in h.read_stream("seen") for r in t.fetchall()]
        assert seen == [(7, 2, 6), (8, 1, 6)]  # what each TE read of its groups: its own writes included


def test_a_view_created_over_a_filled_table_starts_from_its_rows():
    with Harness(SCHEMA.replace(f"CREATE VIEW byg AS {VIEW};", "")) as h:
        h.deploy("CREATE PROCEDURE p ON STREAM ins AS BEGIN " + STATEMENTS["upsert"] + "; END;")
        h.push("ins", [{"k": 1, "g": 1, "v": 2, "s": None}, {"k": 2, "g": 1, "v": 3, "s": "z"}])
        h.deploy(f"CREATE VIEW byg AS {VIEW};")
        assert h.query("SELECT * FROM byg").fetchall() == [(1, 2, 5, 1)]
        h.push("ins", [{"k": 3, "g": 1, "v": 1, "s": None}])
        assert h.query("SELECT * FROM byg").fetchall() == [(1, 3, 6, 1)]
        h.deploy("DROP VIEW byg;")
        with pytest.raises(InvalidArgument, match="unknown table 'byg'"):
            h.deploy("CREATE PROCEDURE q () AS BEGIN SELECT * FROM byg; END;")


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("CREATE VIEW x AS SELECT g, sum(v) FROM kv GROUP BY g", "needs a count\\(\\*\\) column"),
        ("CREATE VIEW x AS SELECT g, count(*) FROM kv WHERE v > 0 GROUP BY g", "WHERE is not kept"),
        ("CREATE VIEW x AS SELECT count(*) FROM kv", "needs GROUP BY columns"),
        ("CREATE VIEW x AS SELECT k % 2, count(*) FROM kv GROUP BY k % 2", "groups by columns of 'kv'"),
        ("CREATE VIEW x AS SELECT g, count(*), avg(v) FROM kv GROUP BY g", "a view keeps count"),
        ("CREATE VIEW x AS SELECT s, count(*) FROM kv GROUP BY s", "'s' may be NULL"),
        (
            "CREATE TABLE f (k INTEGER PRIMARY KEY, d DOUBLE NOT NULL); "
            "CREATE VIEW x AS SELECT k, count(*), sum(d) FROM f GROUP BY k",
            "sum\\(d\\) of a DOUBLE column: a view keeps sums of integer columns only",
        ),
        ("CREATE VIEW x AS SELECT g, count(*), sum(s) FROM kv GROUP BY g", "sum\\(VARCHAR\\)"),
        ("CREATE VIEW x AS SELECT g, count(*) FROM ins GROUP BY g", "'ins' is not a table"),
        ("CREATE VIEW x AS SELECT g, count(*) FROM kv JOIN pair ON kv.k = pair.id GROUP BY g", "a join"),
        ("CREATE VIEW x AS SELECT count(*) AS n FROM kv GROUP BY g", "must be a column of the view"),
        (
            "CREATE PROCEDURE q ON STREAM ins AS BEGIN DELETE FROM byg; END",
            "writes view 'byg'; a view follows its table",
        ),
        ("DROP TABLE kv", "cannot drop table 'kv': used by view byg"),
        ("CREATE VIEW byg AS SELECT g, count(*) FROM kv GROUP BY g", "a view named 'byg' already exists"),
    ],
)
def test_what_a_view_cannot_keep_is_refused_at_deploy(script, message):
    with Harness(SCHEMA) as h:
        with pytest.raises(InvalidArgument, match=message):
            h.deploy(script)
        assert h.engine.catalog.view_plans.keys() == {"byg", "byab"}  # the deploy changed nothing


def test_a_partitioned_table_needs_its_partition_column_in_the_view():
    with Harness("CREATE TABLE t (k BIGINT PRIMARY KEY, g INTEGER NOT NULL) PARTITION BY (k);") as h:
        with pytest.raises(InvalidArgument, match="must group by 'k' too"):
            h.deploy("CREATE VIEW x AS SELECT g, count(*) FROM t GROUP BY g;")


VOTES_VIEW = (
    "CREATE VIEW phone_tally AS SELECT phone_number, contestant_number, count(*) AS n, sum(created) AS created_sum "
    "FROM votes GROUP BY phone_number, contestant_number;"
)
VOTES_QUERY = (
    "SELECT phone_number, contestant_number, count(*), sum(created) FROM votes "
    "GROUP BY phone_number, contestant_number ORDER BY ALL"
)


@pytest.mark.parametrize("partitions", [1, 2])
def test_state_procedures_and_a_restart_keep_the_view(tmp_path, partitions):
    """The voter's state procedures write `votes` (opchain events); `delete_contestant` deletes in DuckDB."""
    config = VoterConfig(contestants=4, max_votes=2, delete_every=9, window=5, slide=2)
    table = generate_votes(120, seed=3, contestants=4, phones=25, invalid_share=0.1)
    batches = [table.slice(i, random.Random(i).choice([1, 1, 3])) for i in range(0, 120, 3)]
    srv = EmbeddedServer(tmp_path / "data", partitions=partitions).start()
    try:
        with Client(srv.target, max_in_flight=64) as c:
            c.deploy(deploy_script(config, "state") + "\n" + VOTES_VIEW)
            c.call("setup", **setup_params(config))
            acks = [f.result() for f in [c.push("votes_in", b) for b in batches]]
            assert all(a.outcome == "committed" for a in acks)
            expected = c.query(VOTES_QUERY).fetchall()
            assert expected and c.query("SELECT * FROM phone_tally ORDER BY ALL").fetchall() == expected
            assert "phone_tally" in c.status()["views"]
        srv.kill()
        srv.start()
        with Client(srv.target) as c:
            assert c.query("SELECT * FROM phone_tally ORDER BY ALL").fetchall() == expected
    finally:
        srv.stop()


def test_explain_names_the_views_a_statement_keeps():
    with Harness(deploy(["upsert", "update_from", "read"])) as h:
        plans = h.engine.sql_plans.explain("p", h.engine.catalog.plans["p"].statements)
    upsert, update_from, read = plans
    assert upsert.compiled and upsert.plan.endswith("keeps view byg")
    assert not update_from.compiled and update_from.reason.endswith("then recomputes view byg from its table")
    assert read.compiled and "byg by keys in a set" in read.plan and "keeps view" not in read.plan


def test_views_follow_state_transactions_spanning_partitions(tmp_path):
    """SL transfers whose accounts live on both partitions run by replicated execution (partition/exchange.py)."""
    from streamtx.procedures.tstream import sl

    script = sl.deploy_script().replace("balance BIGINT)", "balance BIGINT NOT NULL)") + (
        "CREATE VIEW account_totals AS SELECT id, count(*) AS n, sum(balance) AS total FROM accounts GROUP BY id;"
    )
    events = sl.generate(300, seed=4, records=40, transfer_max=1_500, partitions=2, mp_ratio=0.5)
    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target, max_in_flight=64) as c:
        c.deploy(script)
        c.call("setup_sl", **sl.setup_params(40))
        acks = [f.result() for f in [c.push("sl_events", events.slice(i, 5)) for i in range(0, 300, 5)]]
        assert all(a.outcome == "committed" for a in acks)
        expected = c.query("SELECT id, 1, balance FROM accounts ORDER BY id").fetchall()
        assert c.query("SELECT * FROM account_totals ORDER BY id").fetchall() == expected
