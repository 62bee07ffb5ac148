"""Nested transactions: `CREATE TRANSACTION GROUP g (p1, p2)`.

p1 and p2 run in one dataflow; their TEs for a batch are one isolation unit
(nothing outside sees the state between them) and are undone together. p1
writes X, p2 writes the matching Y, so `X == Y` is the invariant every reader
must see. The tests of a partition count share a real server (conftest
`shared_client`), each deploying its app afresh on the emptied server.
"""

from __future__ import annotations

import threading

import pytest
from conftest import PARTITION_COUNTS

from streamtx.client import Client
from streamtx.errors import InvalidArgument

PARTITIONS = PARTITION_COUNTS

pytestmark = pytest.mark.timeout(180)

GROUP_APP = """
CREATE TABLE xt (id INTEGER PRIMARY KEY, v BIGINT NOT NULL, n BIGINT NOT NULL);
CREATE TABLE yt (id INTEGER PRIMARY KEY, v BIGINT NOT NULL, n BIGINT NOT NULL);
CREATE TABLE wlog (b BIGINT, xs BIGINT[]);
CREATE STREAM s1 (x BIGINT);
CREATE STREAM s2 (x BIGINT);
CREATE STREAM x_out (x BIGINT);
CREATE WINDOW w ON s2 ROWS 3 SLIDE 1;
CREATE PROCEDURE init AS BEGIN
    INSERT INTO xt VALUES (1, 0, 0);
    INSERT INTO yt VALUES (1, 0, 0);
END;
CREATE PROCEDURE p1 ON STREAM s1 AS BEGIN
    UPDATE xt SET v = v + (SELECT sum(x) FROM s1), n = n + 1 WHERE id = 1;
    INSERT INTO x_out SELECT x FROM s1;
    INSERT INTO s2 SELECT x FROM s1;
END;
CREATE PROCEDURE p2 ON STREAM s2 AS BEGIN
    SELECT error('p2 refuses ' || min(x)) FROM s2 HAVING min(x) < 0;
    UPDATE yt SET v = v + (SELECT sum(x) FROM s2), n = n + 1 WHERE id = 1;
    SELECT count(*) FROM w;
END;
CREATE TRIGGER log_w ON WINDOW w AS BEGIN
    INSERT INTO wlog SELECT $ts, list(x ORDER BY x) FROM w;
END;
CREATE PROCEDURE check_xy AS BEGIN
    SELECT x.v, y.v, x.n, y.n FROM xt x, yt y;
END;
CREATE TRANSACTION GROUP g (p1, p2);
"""

XY = "SELECT x.v, y.v, x.n, y.n FROM xt x, yt y"


def xy(client) -> tuple:
    return client.query(XY).fetchall()[0]


def test_readers_never_see_the_state_between_group_members(shared_client):
    shared_client.deploy(GROUP_APP)
    assert shared_client.status()["groups"] == ["g"]  # conftest's drop_all drops it by this list
    shared_client.call("init")
    stop = threading.Event()
    seen: list[list[tuple]] = [[], []]
    errors: list[BaseException] = []

    def reader(mine: list[tuple]) -> None:
        try:
            with Client(shared_client.target) as r:
                i = 0
                while not stop.is_set() or i < 10:
                    row = r.query(XY).fetchall()[0] if i % 2 else r.call("check_xy")[0].fetchall()[0]
                    mine.append(row)
                    i += 1
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(mine,)) for mine in seen]
    for t in threads:
        t.start()
    try:
        batches = [[i, -i] if i % 10 == 0 else [i, 2 * i] for i in range(1, 201)]
        acks = [f.result() for f in [shared_client.push("s1", {"x": xs}) for xs in batches]]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    rows = seen[0] + seen[1]
    assert len(rows) >= 20
    torn = [row for row in rows if row[0] != row[1] or row[2] != row[3]]
    assert torn == [], torn[:5]
    for mine in seen:  # each reader saw the batches applied in order, never partially
        assert [n for _, _, n, _ in mine] == sorted(n for _, _, n, _ in mine)
    # the batches p2 refused were undone with p1's part: p1 is the border procedure, so they are REJECTED
    for xs, ack in zip(batches, acks, strict=True):
        if min(xs) < 0:
            assert ack.outcome == "rejected", ack
            assert "transaction group g undone" in ack.reason and "p2 refuses" in ack.reason
        else:
            assert ack.outcome == "committed" and ack.reason == "", ack
    good = [xs for xs in batches if min(xs) >= 0]
    total = sum(sum(xs) for xs in good)
    assert xy(shared_client) == (total, total, len(good), len(good))
    assert shared_client.query("SELECT count(*) FROM x_out").fetchall() == [(2 * len(good),)]


def test_group_abort_undoes_every_member_and_the_window(shared_client):
    shared_client.deploy(GROUP_APP)
    shared_client.call("init")
    a = shared_client.push("s1", {"x": [1, 2]}).result()
    bad = shared_client.push("s1", {"x": [5, -4]}).result()
    c = shared_client.push("s1", {"x": [3]}).result()
    assert (a.outcome, bad.outcome, c.outcome) == ("committed", "rejected", "committed")
    assert "p2 refuses -4" in bad.reason and "transaction group g" in bad.reason
    assert xy(shared_client) == (6, 6, 2, 2)
    # p1's emission on x_out and p2's window were undone with the group
    assert shared_client.query("SELECT __ts, x FROM x_out ORDER BY __ts, x").fetchall() == [
        (a.timestamp, 1),
        (a.timestamp, 2),
        (c.timestamp, 3),
    ]
    assert shared_client.query("SELECT b, xs FROM wlog ORDER BY b").fetchall() == [
        (a.timestamp, [1, 2]),
        (c.timestamp, [1, 2, 3]),
    ]
    assert shared_client.query("SELECT count(*) FROM windows.w WHERE __ts = $b", {"b": bad.timestamp}).fetchall() == [
        (0,)
    ]
    for s in ("s1", "s2"):
        assert shared_client.query(f"SELECT count(*) FROM streams.{s}").fetchall() == [(0,)], s


def test_subscribers_do_not_see_a_batch_of_an_undone_group(shared_client):
    shared_client.deploy(GROUP_APP)
    shared_client.call("init")
    a = shared_client.push("s1", {"x": [1]}).result()
    bad = shared_client.push("s1", {"x": [-1]}).result()
    c = shared_client.push("s1", {"x": [2]}).result()
    assert bad.outcome == "rejected"
    got = []
    for ts, rows in shared_client.subscribe("x_out", from_ts=0):
        got.append((ts, rows.fetchall()))
        if ts >= c.timestamp:
            break
    assert got == [(a.timestamp, [(1,)]), (c.timestamp, [(2,)])]


INTERIOR_GROUP = """
CREATE TABLE a (b BIGINT, n BIGINT);
CREATE TABLE z (b BIGINT, n BIGINT);
CREATE TABLE xt (b BIGINT, n BIGINT);
CREATE TABLE yt (b BIGINT, n BIGINT);
CREATE STREAM s0 (x BIGINT);
CREATE STREAM s1 (x BIGINT);
CREATE STREAM s2 (x BIGINT);
CREATE PROCEDURE p0 ON STREAM s0 AS BEGIN
    INSERT INTO a SELECT $ts, sum(x) FROM s0;
    INSERT INTO s1 SELECT x FROM s0;
END;
CREATE PROCEDURE p1 ON STREAM s1 AS BEGIN
    INSERT INTO xt SELECT $ts, sum(x) FROM s1;
    INSERT INTO s2 SELECT x FROM s1;
END;
CREATE PROCEDURE pz ON STREAM s1 AS BEGIN
    INSERT INTO z SELECT $ts, sum(x) FROM s1;
END;
CREATE PROCEDURE p2 ON STREAM s2 AS BEGIN
    SELECT error('p2 refuses ' || min(x)) FROM s2 HAVING min(x) < 0;
    INSERT INTO yt SELECT $ts, sum(x) FROM s2;
END;
CREATE TRANSACTION GROUP g (p1, p2);
"""


def test_interior_group_abort_leaves_procedures_outside_the_group_alone(shared_client):
    shared_client.deploy(INTERIOR_GROUP)
    acks = [shared_client.push("s0", {"x": xs}).result() for xs in ([1], [2, -7], [3])]
    first, bad, last = acks
    assert [x.outcome for x in acks] == ["committed"] * 3  # the border TE (p0) committed every time
    assert "p2" in bad.reason and "transaction group g undone" in bad.reason and "p2 refuses -7" in bad.reason
    assert first.reason == last.reason == ""
    b1, b2, b3 = (x.timestamp for x in acks)
    # outside the group: p0 (upstream) and pz (a sibling of p1 on s1) keep their effects
    assert shared_client.query("SELECT b, n FROM a ORDER BY b").fetchall() == [(b1, 1), (b2, -5), (b3, 3)]
    assert shared_client.query("SELECT b, n FROM z ORDER BY b").fetchall() == [(b1, 1), (b2, -5), (b3, 3)]
    # inside: p1's write for the refused batch was undone with p2
    assert shared_client.query("SELECT b, n FROM xt ORDER BY b").fetchall() == [(b1, 1), (b3, 3)]
    assert shared_client.query("SELECT b, n FROM yt ORDER BY b").fetchall() == [(b1, 1), (b3, 3)]
    for s in ("s0", "s1", "s2"):
        assert shared_client.query(f"SELECT count(*) FROM streams.{s}").fetchall() == [(0,)], s


def test_group_members_run_back_to_back(shared_client):
    """pz, a sibling of p1 on s1 outside the group, ranks between p1 and p2 but never runs between them."""
    script = INTERIOR_GROUP.replace(
        "INSERT INTO z SELECT $ts, sum(x) FROM s1;",
        "INSERT INTO z SELECT $ts, (SELECT count(*) FROM xt) - (SELECT count(*) FROM yt);",
    )
    assert script != INTERIOR_GROUP
    shared_client.deploy(script)
    acks = [shared_client.push("s0", {"x": [i]}).result() for i in range(1, 6)]
    assert all(x.outcome == "committed" and not x.reason for x in acks)
    assert shared_client.query("SELECT b, n FROM z ORDER BY b").fetchall() == [(x.timestamp, 0) for x in acks]
    assert shared_client.query("SELECT count(*) FROM xt").fetchall() == [(5,)]


def test_group_split_by_a_non_member_is_refused_or_undone_as_a_whole(shared_client):
    script = """
CREATE TABLE log (who VARCHAR, b BIGINT);
CREATE STREAM s1 (x BIGINT);
CREATE STREAM s2 (x BIGINT);
CREATE STREAM s3 (x BIGINT);
CREATE PROCEDURE p1 ON STREAM s1 AS BEGIN
    INSERT INTO log VALUES ('p1', $ts);
    INSERT INTO s2 SELECT x FROM s1;
END;
CREATE PROCEDURE p2 ON STREAM s2 AS BEGIN
    INSERT INTO log VALUES ('p2', $ts);
    INSERT INTO s3 SELECT x FROM s2;
END;
CREATE PROCEDURE p3 ON STREAM s3 AS BEGIN
    INSERT INTO log VALUES ('p3', $ts);
    SELECT error('p3 refuses') FROM s3 HAVING min(x) < 0;
END;
CREATE TRANSACTION GROUP g (p1, p3);
"""
    try:
        shared_client.deploy(script)
    except InvalidArgument as e:
        assert "g" in e.message
        return
    ok = shared_client.push("s1", {"x": [1]}).result()
    bad = shared_client.push("s1", {"x": [-1]}).result()
    assert ok.outcome == "committed"
    # p3 aborted: the group (p1 and p3) is undone; p1 is the border procedure, so the batch is rejected
    assert bad.outcome == "rejected", bad
    assert shared_client.query("SELECT who FROM log WHERE b = $b ORDER BY who", {"b": bad.timestamp}).fetchall() == []
