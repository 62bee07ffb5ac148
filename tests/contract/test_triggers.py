"""PE triggers (a committed TE's output schedules the procedures ON its stream) and EE triggers.

Procedures record each TE into a log table `(proc, b, ord, n)`, where `b` is the
running batch id and `ord` the number of log rows before it: the order in which
TEs ran, across batches. The tests of a partition count share a real server
(conftest `shared_client`), each deploying its app afresh on the emptied server.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
from conftest import PARTITION_COUNTS

from streamtx.errors import InvalidArgument

PARTITIONS = PARTITION_COUNTS

pytestmark = pytest.mark.timeout(180)


def log_stmt(proc: str, stream: str) -> str:
    return f"INSERT INTO log SELECT '{proc}', $ts, (SELECT count(*) FROM log), count(*) FROM {stream};"


LOG_TABLE = "CREATE TABLE log (proc VARCHAR, b BIGINT, ord BIGINT, n BIGINT);\n"

CHAIN = (
    LOG_TABLE
    + """
CREATE STREAM s1 (x BIGINT);
CREATE STREAM s2 (x BIGINT);
CREATE STREAM s3 (x BIGINT);
CREATE STREAM s4 (x BIGINT);
CREATE PROCEDURE p1 ON STREAM s1 AS BEGIN
    """
    + log_stmt("p1", "s1")
    + """
    INSERT INTO s2 SELECT x + 1 FROM s1;
END;
CREATE PROCEDURE p2 ON STREAM s2 AS BEGIN
    """
    + log_stmt("p2", "s2")
    + """
    SELECT error('p2 refuses ' || min(x)) FROM s2 HAVING min(x) < 0;
    INSERT INTO s3 SELECT x * 2 FROM s2;
END;
CREATE PROCEDURE p3 ON STREAM s3 AS BEGIN
    """
    + log_stmt("p3", "s3")
    + """
    INSERT INTO s4 SELECT x - 3 FROM s3;
END;
"""
)


def log(client) -> list[tuple]:
    return client.query("SELECT proc, b, ord, n FROM log ORDER BY ord").fetchall()


def test_chain_every_batch_flows_through_in_order(shared_client):
    shared_client.deploy(CHAIN)
    batches = [[i, i + 100] if i % 3 == 0 else [i] for i in range(1, 41)]
    futures = [shared_client.push("s1", {"x": xs}) for xs in batches]
    acks = [f.result() for f in futures]
    assert all(a.outcome == "committed" and a.reason == "" for a in acks), acks
    stamps = [a.timestamp for a in acks]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    expected = []
    for b, xs in zip(stamps, batches, strict=True):
        for proc in ("p1", "p2", "p3"):
            expected.append((proc, b, len(expected), len(xs)))
    assert log(shared_client) == expected  # batch order, and p1 < p2 < p3 within each batch
    # output tuples keep the batch id of the input batch
    got = shared_client.query("SELECT __ts, x FROM s4 ORDER BY __ts, x").fetchall()
    assert got == sorted((b, 2 * (x + 1) - 3) for b, xs in zip(stamps, batches, strict=True) for x in xs)
    subscribed = []
    for ts, rows in shared_client.subscribe("s4", from_ts=0):
        subscribed.append((ts, sorted(x for (x,) in rows.fetchall())))
        if ts == stamps[-1]:
            break
    assert subscribed == [(b, sorted(2 * (x + 1) - 3 for x in xs)) for b, xs in zip(stamps, batches, strict=True)]
    # interior streams hold nothing once consumed; the border batch was never stored
    for s in ("s1", "s2", "s3"):
        assert shared_client.query(f"SELECT count(*) FROM streams.{s}").fetchall() == [(0,)], s


DIAMOND = (
    LOG_TABLE
    + """
CREATE STREAM s1 (x BIGINT);
CREATE STREAM s2 (x BIGINT);
CREATE STREAM s4 (x BIGINT, via VARCHAR);
CREATE STREAM s5 (n BIGINT, vias BIGINT);
CREATE PROCEDURE p1 ON STREAM s1 AS BEGIN
    """
    + log_stmt("p1", "s1")
    + """
    INSERT INTO s2 SELECT x FROM s1;
END;
CREATE PROCEDURE p2 ON STREAM s2 AS BEGIN
    """
    + log_stmt("p2", "s2")
    + """
    INSERT INTO s4 SELECT x * 10, 'p2' FROM s2;
END;
CREATE PROCEDURE p3 ON STREAM s2 AS BEGIN
    """
    + log_stmt("p3", "s2")
    + """
    INSERT INTO s4 SELECT x * 100, 'p3' FROM s2;
END;
CREATE PROCEDURE p4 ON STREAM s4 AS BEGIN
    """
    + log_stmt("p4", "s4")
    + """
    INSERT INTO s5 SELECT count(*), count(DISTINCT via) FROM s4;
END;
"""
)


def test_diamond_runs_each_te_once_per_batch_in_topological_order(shared_client):
    shared_client.deploy(DIAMOND)
    batches = [[i] * (1 + i % 3) for i in range(1, 31)]
    futures = [shared_client.push("s1", {"x": xs}) for xs in batches]
    acks = [f.result() for f in futures]
    assert all(a.outcome == "committed" for a in acks), acks
    rows = log(shared_client)
    assert [r[2] for r in rows] == list(range(len(rows)))
    for ack, xs in zip(acks, batches, strict=True):
        mine = [(proc, n) for proc, b, _, n in rows if b == ack.timestamp]
        procs = [p for p, _ in mine]
        assert sorted(procs) == ["p1", "p2", "p3", "p4"], (ack.timestamp, mine)  # each exactly once
        assert procs[0] == "p1" and procs[-1] == "p4"  # topological: p1 < {p2, p3} < p4
        assert dict(mine)["p4"] == 2 * len(xs)  # p4 ran once, over the tuples of both p2 and p3
    # the TEs of one batch all ran before any TE of the next
    batch_of_row = [b for _, b, _, _ in rows]
    assert batch_of_row == sorted(batch_of_row)
    assert shared_client.query("SELECT __ts, n, vias FROM s5 ORDER BY __ts").fetchall() == [
        (a.timestamp, 2 * len(xs), 2) for a, xs in zip(acks, batches, strict=True)
    ]
    for s in ("s1", "s2", "s4"):
        assert shared_client.query(f"SELECT count(*) FROM streams.{s}").fetchall() == [(0,)], s


def test_border_stream_with_two_consumers_runs_both(shared_client):
    shared_client.deploy(
        LOG_TABLE
        + f"""
CREATE STREAM s (x BIGINT);
CREATE PROCEDURE pa ON STREAM s AS BEGIN {log_stmt("pa", "s")} END;
CREATE PROCEDURE pb ON STREAM s AS BEGIN {log_stmt("pb", "s")} END;
"""
    )
    acks = [shared_client.push("s", {"x": xs}).result() for xs in ([1], [2, 3])]
    assert all(a.outcome == "committed" for a in acks)
    got = sorted((proc, b, n) for proc, b, _, n in log(shared_client))
    b1, b2 = acks[0].timestamp, acks[1].timestamp
    assert got == [("pa", b1, 1), ("pa", b2, 2), ("pb", b1, 1), ("pb", b2, 2)]
    assert shared_client.query("SELECT count(*) FROM streams.s").fetchall() == [(0,)]


def test_outcome_of_a_batch_does_not_depend_on_which_border_consumer_aborts(shared_client):
    shared_client.deploy(
        LOG_TABLE
        + f"""
CREATE STREAM s (x BIGINT);
CREATE PROCEDURE pa ON STREAM s AS BEGIN
    SELECT error('pa refuses') FROM s HAVING min(x) = 1;
    {log_stmt("pa", "s")}
END;
CREATE PROCEDURE pb ON STREAM s AS BEGIN
    SELECT error('pb refuses') FROM s HAVING min(x) = 2;
    {log_stmt("pb", "s")}
END;
"""
    )
    by_pa = shared_client.push("s", {"x": [1]}).result()
    by_pb = shared_client.push("s", {"x": [2]}).result()
    assert "pa refuses" in by_pa.reason and "pb refuses" in by_pb.reason
    assert by_pa.outcome == by_pb.outcome, (by_pa, by_pb)
    ran = sorted((proc, b) for proc, b, _, _ in log(shared_client))
    # symmetric effects: either each batch was refused as a whole, or the other consumer ran for both
    assert ran in ([], [("pa", by_pb.timestamp), ("pb", by_pa.timestamp)])


# ------------------------------------------------------------------------------ EE triggers

EE_APP = """
CREATE TABLE ee (src VARCHAR, b BIGINT, n BIGINT, total BIGINT);
CREATE TABLE done (b BIGINT, n BIGINT);
CREATE STREAM s1 (x BIGINT);
CREATE STREAM s2 (x BIGINT);
CREATE STREAM s3 (y BIGINT);
CREATE PROCEDURE p1 ON STREAM s1 AS BEGIN
    INSERT INTO s2 SELECT x FROM s1;
    SELECT error('p1 refuses ' || min(x)) FROM s1 HAVING min(x) < 0;
END;
CREATE TRIGGER on_s1 ON STREAM s1 AS BEGIN
    INSERT INTO ee SELECT 's1', $ts, count(*), sum(x) FROM s1;
END;
CREATE TRIGGER on_s2 ON STREAM s2 AS BEGIN
    INSERT INTO ee SELECT 's2', $ts, count(*), sum(x) FROM s2;
    INSERT INTO s3 SELECT x * 7 FROM s2;
END;
CREATE TRIGGER on_s3 ON STREAM s3 AS BEGIN
    INSERT INTO ee SELECT 's3', $ts, count(*), sum(y) FROM s3;
END;
CREATE PROCEDURE p3 ON STREAM s3 AS BEGIN
    INSERT INTO done SELECT $ts, sum(y) FROM s3;
END;
"""


def ee(client) -> list[tuple]:
    return client.query("SELECT src, b, n, total FROM ee ORDER BY b, src").fetchall()


def test_ee_trigger_chain_and_ee_emission_activates_pe_trigger(shared_client):
    shared_client.deploy(EE_APP)
    a = shared_client.push("s1", {"x": [1, 2, 3]}).result()
    b = shared_client.push("s1", {"x": [10]}).result()
    assert a.outcome == b.outcome == "committed"
    ta, tb = a.timestamp, b.timestamp
    assert ee(shared_client) == [
        ("s1", ta, 3, 6),
        ("s2", ta, 3, 6),
        ("s3", ta, 3, 42),
        ("s1", tb, 1, 10),
        ("s2", tb, 1, 10),
        ("s3", tb, 1, 70),
    ]
    # the tuples an EE trigger emitted on s3 scheduled p3 (PE trigger), with the same batch id
    assert shared_client.query("SELECT b, n FROM done ORDER BY b").fetchall() == [(ta, 42), (tb, 70)]
    for s in ("s1", "s3"):  # consumed by procedures: garbage collected
        assert shared_client.query(f"SELECT count(*) FROM streams.{s}").fetchall() == [(0,)], s


def test_ee_triggers_run_inside_the_te_and_are_undone_with_it(shared_client):
    shared_client.deploy(EE_APP)
    ok = shared_client.push("s1", {"x": [1]}).result()
    # p1 emits on s2 (firing on_s2, then on_s3) and then aborts: every trigger effect is undone
    bad = shared_client.push("s1", {"x": [5, -1]}).result()
    assert bad.outcome == "rejected" and "p1 refuses -1" in bad.reason
    after = shared_client.push("s1", {"x": [2]}).result()
    assert [b for _, b, _, _ in ee(shared_client)] == [ok.timestamp] * 3 + [after.timestamp] * 3
    assert shared_client.query("SELECT b FROM done ORDER BY b").fetchall() == [(ok.timestamp,), (after.timestamp,)]
    for s in ("s2", "s3"):
        assert shared_client.query(
            f"SELECT count(*) FROM streams.{s} WHERE __ts = $b", {"b": bad.timestamp}
        ).fetchall() == [(0,)]


def test_ee_trigger_on_a_stream_nobody_consumes(shared_client):
    shared_client.deploy(
        """
CREATE TABLE t (b BIGINT, n BIGINT);
CREATE STREAM raw (x BIGINT);
CREATE TRIGGER on_raw ON STREAM raw AS BEGIN INSERT INTO t SELECT $ts, sum(x) FROM raw; END;
"""
    )
    acks = [shared_client.push("raw", {"x": [i, i]}).result() for i in range(1, 4)]
    assert shared_client.query("SELECT b, n FROM t ORDER BY b").fetchall() == [
        (a.timestamp, 2 * i) for i, a in enumerate(acks, 1)
    ]


# --------------------------------------------------------------------- interior aborts


def test_interior_te_abort_is_undone_and_the_dataflow_goes_on(shared_client):
    shared_client.deploy(
        CHAIN
        + """
CREATE TABLE p2_effects (b BIGINT);
CREATE TRIGGER on_s3 ON STREAM s3 AS BEGIN INSERT INTO p2_effects SELECT $ts; END;
"""
    )
    first = shared_client.push("s1", {"x": [1]}).result()
    bad = shared_client.push("s1", {"x": [4, -9]}).result()  # p1 emits -8 on s2: p2 aborts
    nxt = shared_client.push("s1", {"x": [5]}).result()
    assert first.outcome == nxt.outcome == "committed" and first.reason == nxt.reason == ""
    # the border TE committed: the batch is COMMITTED; the reason names the aborted downstream TE
    assert bad.outcome == "committed", bad
    assert "p2" in bad.reason and "p2 refuses -8" in bad.reason and "downstream" in bad.reason
    procs = [(proc, b) for proc, b, _, _ in log(shared_client)]
    assert procs == [
        ("p1", first.timestamp),
        ("p2", first.timestamp),
        ("p3", first.timestamp),
        ("p1", bad.timestamp),  # p1's effects stay; p2's log row was undone; p3 never ran
        ("p1", nxt.timestamp),
        ("p2", nxt.timestamp),
        ("p3", nxt.timestamp),
    ]
    # p2's emission (and the EE trigger it fired) were undone
    assert shared_client.query("SELECT b FROM p2_effects ORDER BY b").fetchall() == [
        (first.timestamp,),
        (nxt.timestamp,),
    ]
    assert shared_client.query("SELECT DISTINCT __ts FROM s4 ORDER BY 1").fetchall() == [
        (first.timestamp,),
        (nxt.timestamp,),
    ]
    # the aborted TE's input was garbage collected all the same
    for s in ("s1", "s2", "s3"):
        assert shared_client.query(f"SELECT count(*) FROM streams.{s}").fetchall() == [(0,)], s
    # ... and the log counter shows the ord values stayed contiguous (nothing half-applied)
    assert [o for _, _, o, _ in log(shared_client)] == list(range(7))


def test_aborting_sibling_does_not_affect_the_other_branch(shared_client):
    """In the diamond, p3 aborts for one batch: p2's output still reaches p4; p3's does not."""
    shared_client.deploy(
        DIAMOND.replace(
            "INSERT INTO s4 SELECT x * 100, 'p3' FROM s2;",
            "SELECT error('p3 says no') FROM s2 HAVING min(x) = 7;\n    INSERT INTO s4 SELECT x * 100, 'p3' FROM s2;",
        )
    )
    acks = [shared_client.push("s1", {"x": [x]}).result() for x in (6, 7, 8)]
    assert [a.outcome for a in acks] == ["committed"] * 3
    assert "p3 says no" in acks[1].reason and acks[0].reason == acks[2].reason == ""
    got = shared_client.query("SELECT __ts, n, vias FROM s5 ORDER BY __ts").fetchall()
    assert got == [(acks[0].timestamp, 2, 2), (acks[1].timestamp, 1, 1), (acks[2].timestamp, 2, 2)]
    for s in ("s2", "s4"):
        assert shared_client.query(f"SELECT count(*) FROM streams.{s}").fetchall() == [(0,)], s


def copy_chain(tag: str, where: str) -> str:
    """Steps that only copy columns (reordered, repeated, `*`); `where` = " WHERE true" makes DuckDB run them."""
    return f"""
CREATE TABLE {tag}_out (p BIGINT, q BIGINT, r VARCHAR, t VARCHAR, b BIGINT);
CREATE STREAM {tag}_s1 (a BIGINT, b VARCHAR, c DOUBLE);
CREATE STREAM {tag}_s2 (x VARCHAR, y BIGINT);
CREATE STREAM {tag}_s3 (p BIGINT, q BIGINT, r VARCHAR);
CREATE STREAM {tag}_s4 (p BIGINT, q BIGINT, r VARCHAR);
CREATE PROCEDURE {tag}_p1 ON STREAM {tag}_s1 AS BEGIN
    INSERT INTO {tag}_s2 (y, x) SELECT a, {tag}_s1.b FROM {tag}_s1{where};
END;
CREATE PROCEDURE {tag}_p2 ON STREAM {tag}_s2 AS BEGIN
    INSERT INTO {tag}_s3 SELECT y, y AS again, x FROM {tag}_s2 s{where};
END;
CREATE PROCEDURE {tag}_p3 ON STREAM {tag}_s3 AS BEGIN INSERT INTO {tag}_s4 SELECT * FROM {tag}_s3{where}; END;
CREATE PROCEDURE {tag}_p4 ON STREAM {tag}_s4 AS BEGIN
    INSERT INTO {tag}_out SELECT p, q, r, typeof(p), $ts FROM {tag}_s4;
END;
"""


def test_steps_that_copy_columns_give_what_duckdb_gives(shared_client):
    """Copies run on the batch's Arrow table (compile.py `copies`): same rows, order, NULLs and types as SQL."""
    from streamtx.server.catalog.compile import Scope, compile_statement

    scope = Scope("procedure p", frozenset(), {"s": ("a", "b"), "o": ("x", "y")}, {}, "s", frozenset(), frozenset())
    assert compile_statement("INSERT INTO o (y, x) SELECT a, s.b FROM s", scope).copies == ("b", "a")
    for sql in ("SELECT a, b FROM s WHERE a > 0", "SELECT DISTINCT a, b FROM s", "SELECT a, b + 1 FROM s"):
        assert compile_statement(f"INSERT INTO o {sql}", scope).copies is None, sql

    shared_client.deploy(copy_chain("cp", "") + copy_chain("sq", " WHERE true"))
    batches = [{"a": [1, None, 3], "b": ["x", "y", None], "c": [0.5, None, 2.0]}, {"a": [], "b": [], "c": []}]
    batches += [{"a": [i, -i], "b": [str(i), None], "c": [i / 2, None]} for i in range(4, 30)]
    for tag in ("cp", "sq"):
        acks = [shared_client.push(f"{tag}_s1", b).result() for b in batches]
        assert [a.outcome for a in acks] == ["committed"] * len(batches)
    copied = shared_client.query("SELECT p, q, r, t FROM cp_out ORDER BY b, p NULLS LAST").fetchall()
    assert copied == shared_client.query("SELECT p, q, r, t FROM sq_out ORDER BY b, p NULLS LAST").fetchall()
    assert copied[:3] == [(1, 1, "x", "BIGINT"), (3, 3, None, "BIGINT"), (None, None, "y", "BIGINT")]
    assert len(copied) == 3 + 2 * 26


def test_ts_and_its_older_name_batch_id_are_the_running_timestamp(shared_client):
    shared_client.deploy(
        "CREATE STREAM ts_in (v BIGINT); CREATE TABLE ts_out (a BIGINT, b BIGINT, v BIGINT);"
        "CREATE PROCEDURE ts_copy ON STREAM ts_in AS BEGIN INSERT INTO ts_out SELECT $ts, $batch_id, v FROM ts_in; END;"
    )
    ack = shared_client.push("ts_in", {"v": [7]}).result()
    assert shared_client.query("SELECT a, b, v FROM ts_out").fetchall() == [(ack.timestamp, ack.timestamp, 7)]
    for name in ("ts", "batch_id"):
        with pytest.raises(InvalidArgument, match=rf"parameter name \${name} is reserved"):
            shared_client.deploy(f"CREATE PROCEDURE p_{name} ({name} BIGINT) AS BEGIN SELECT 1; END;")


def test_a_streams_own_batch_id_column_is_data_and_its_tuples_timestamp_is_the_system_column_ts(shared_client):
    """`batch_id` names the producer's batch; the stored tuple's timestamp is the system column `__ts`."""
    shared_client.deploy(
        "CREATE STREAM own_in (batch_id BIGINT, v BIGINT); CREATE STREAM own_out (batch_id BIGINT, v BIGINT);"
        "CREATE PROCEDURE own_copy ON STREAM own_in AS BEGIN "
        "INSERT INTO own_out SELECT batch_id, v * 2 FROM own_in; END;"
    )
    acks = [shared_client.push("own_in", {"batch_id": [100 + i], "v": [i]}).result() for i in range(3)]
    assert [a.batch_id for a in acks] == [1, 2, 3] and len({a.timestamp for a in acks}) == 3
    stamps = [a.timestamp for a in acks]
    assert shared_client.query("SELECT batch_id, v, __ts FROM own_out ORDER BY __ts").fetchall() == [
        (100 + i, 2 * i, ts) for i, ts in enumerate(stamps)
    ]
    with contextlib.closing(shared_client.subscribe("own_out", from_ts=stamps[1])) as sub:
        got = [(ts, rows.fetchall()) for ts, rows in itertools.islice(sub, 2)]
    assert got == [(stamps[1], [(101, 2)]), (stamps[2], [(102, 4)])]
