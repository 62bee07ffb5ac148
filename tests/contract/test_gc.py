"""Garbage collection: consumed stream batches, retention of unconsumed streams, window expiry.

Stored stream tuples live in `streams.<s>` (column __ts), window tuples in
`windows.<w>`; Query reads both. Real servers in subprocesses.
"""

from __future__ import annotations

import random
import time

import pytest

from streamtx.client import Client
from streamtx.errors import OutOfRange
from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params
from streamtx.server.embedded import EmbeddedServer

pytestmark = pytest.mark.timeout(180)

CHAIN = """
CREATE TABLE totals (k BIGINT PRIMARY KEY, n BIGINT);
CREATE STREAM s1 (k BIGINT, v BIGINT);
CREATE STREAM s2 (k BIGINT, v BIGINT);
CREATE STREAM s3 (k BIGINT, v BIGINT);
CREATE STREAM s4 (k BIGINT, v BIGINT);
CREATE PROCEDURE p1 ON STREAM s1 AS BEGIN INSERT INTO s2 SELECT k, v FROM s1; END;
CREATE PROCEDURE p2a ON STREAM s2 AS BEGIN INSERT INTO s3 SELECT k, v FROM s2; END;
CREATE PROCEDURE p2b ON STREAM s2 AS BEGIN
    INSERT INTO totals SELECT k, sum(v) FROM s2 GROUP BY k ON CONFLICT DO UPDATE SET n = totals.n + excluded.n;
END;
CREATE PROCEDURE p3 ON STREAM s3 AS BEGIN
    SELECT error('p3 refuses') FROM s3 HAVING min(v) < 0;
    INSERT INTO s4 SELECT k, v * 2 FROM s3;
END;
"""


def count(client, table: str) -> int:
    return client.query(f"SELECT count(*) FROM {table}").fetchall()[0][0]


def batches_in(client, table: str) -> list[int]:
    return [b for (b,) in client.query(f"SELECT DISTINCT __ts FROM {table} ORDER BY 1").fetchall()]


def stream_and_window_tables(client) -> list[str]:
    rows = client.query(
        "SELECT table_schema, table_name FROM information_schema.tables "
        "WHERE table_schema IN ('streams', 'windows') ORDER BY 1, 2"
    ).fetchall()
    return [f'{schema}."{name}"' for schema, name in rows]


def test_consumed_streams_are_emptied_by_their_last_consumer(client):
    client.deploy(CHAIN)
    futures = [
        client.push("s1", {"k": [i % 7, (i + 1) % 7], "v": [-1 if i % 25 == 0 else 1, 1]}) for i in range(1, 301)
    ]
    acks = [f.result() for f in futures]
    assert all(a.outcome == "committed" for a in acks)
    aborted = [a for a in acks if a.reason]
    assert len(aborted) == 12 and all("p3 refuses" in a.reason for a in aborted)
    # s1: one consumer (never stored); s2: two consumers (the last one deletes); s3: consumer aborted sometimes
    for s in ("s1", "s2", "s3"):
        assert count(client, f"streams.{s}") == 0, s
    # s4 is consumed by nobody: every committed batch is kept (default retention is large)
    assert batches_in(client, "streams.s4") == [a.timestamp for a in acks if not a.reason]
    assert count(client, "totals") == 7


@pytest.fixture
def retention_server(tmp_path):
    with EmbeddedServer(tmp_path / "d", extra_args=["--stream-retention", "5"]) as srv:
        yield srv


RETAIN = """
CREATE STREAM raw (x BIGINT);
CREATE STREAM s (x BIGINT);
CREATE STREAM out (x BIGINT);
CREATE PROCEDURE p ON STREAM s AS BEGIN INSERT INTO out SELECT x FROM s; END;
"""


def test_unconsumed_streams_are_bounded_and_trimmed_oldest_first(retention_server):
    with Client(retention_server.target) as c:
        c.deploy(RETAIN)
        raw_ids, out_ids = [], []
        for i in range(1, 41):
            raw_ids.append(c.push("raw", {"x": [i, i]}).result().timestamp)
            out_ids.append(c.push("s", {"x": [i]}).result().timestamp)
            for table, ids in (("streams.raw", raw_ids), ("streams.out", out_ids)):
                kept = batches_in(c, table)
                assert kept == ids[-len(kept) :], table  # always the newest, contiguous
                assert min(len(ids), 5) <= len(kept) <= 6, (table, kept)  # the retention (+10%, at least 1)
        assert count(c, "streams.s") == 0
        # a subscriber asking for trimmed batches is told so; the kept ones are delivered
        with pytest.raises(OutOfRange):
            next(iter(c.subscribe("out", from_ts=out_ids[0])))
        got = []
        for ts, rows in c.subscribe("out", from_ts=out_ids[-5]):
            got.append((ts, rows.fetchall()))
            if ts == out_ids[-1]:
                break
        assert got == [(b, [(i,)]) for i, b in zip(range(36, 41), out_ids[-5:], strict=True)]


def test_unconsumed_stream_keeps_at_most_the_retention(retention_server):
    with Client(retention_server.target) as c:
        c.deploy(RETAIN)
        for i in range(1, 21):
            c.push("raw", {"x": [i]}).result()
            assert len(batches_in(c, "streams.raw")) <= 5, f"after batch {i}"


def test_rows_window_table_holds_the_window_and_less_than_a_slide_staged(client):
    size, slide = 10, 4
    client.deploy(
        f"""
CREATE TABLE t (n BIGINT);
CREATE STREAM s (x BIGINT);
CREATE WINDOW w ON s ROWS {size} SLIDE {slide};
CREATE PROCEDURE p ON STREAM s AS BEGIN INSERT INTO t SELECT count(*) FROM w; END;
"""
    )
    rnd = random.Random(3)
    total = 0
    for _ in range(80):
        n = rnd.choice([1, 1, 2, 3, 5, 9, 17])
        assert client.push("s", {"x": list(range(total, total + n))}).result().ok
        total += n
        visible, staged = client.query(
            "SELECT count(*) FILTER (WHERE NOT __staged), count(*) FILTER (WHERE __staged) FROM windows.w"
        ).fetchall()[0]
        slid = total // slide * slide
        assert visible == min(size, slid) and staged == total - slid < slide, (total, visible, staged)
    assert count(client, "streams.s") == 0


def test_range_window_does_not_keep_tuples_with_null_ts_forever(client):
    client.deploy(
        """
CREATE TABLE t (n BIGINT);
CREATE STREAM s (ts BIGINT, x BIGINT);
CREATE WINDOW w ON s RANGE 10 SLIDE 5;
CREATE PROCEDURE p ON STREAM s AS BEGIN INSERT INTO t SELECT count(*) FROM s; END;
"""
    )
    for i in range(20):
        client.push("s", {"ts": [i * 10, None], "x": [i, i]}).result()  # committed or rejected: either is fine
    # the window has moved far past every batch: nothing older than its extent may remain stored
    assert count(client, "windows.w WHERE ts IS NULL OR ts < 180") == 0


def test_range_window_table_holds_only_its_extent(client):
    client.deploy(
        """
CREATE TABLE t (n BIGINT);
CREATE STREAM s (ts BIGINT, x BIGINT);
CREATE WINDOW w ON s RANGE 20 SLIDE 5;
CREATE PROCEDURE p ON STREAM s AS BEGIN INSERT INTO t SELECT count(*) FROM w; END;
"""
    )
    ts = 0
    for i in range(60):
        batch = [ts + j for j in range(3)]
        ts += 3
        assert client.push("s", {"ts": batch, "x": [i] * 3}).result().ok
        lo, n = client.query("SELECT min(ts), count(*) FROM windows.w").fetchall()[0]
        end = (ts - 1) // 5 * 5
        assert lo >= end - 20 and n <= 20 + 5 + 3, (ts, lo, n)


# ------------------------------------------------------------------------------ long run


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~20 s on an idle 2-core machine; far more when the machine is busy
def test_long_voter_run_keeps_stream_and_window_tables_bounded(tmp_path):
    retention = 5
    config = VoterConfig(window=20, slide=3, delete_every=250)
    votes = generate_votes(900, seed=11)
    with (
        EmbeddedServer(tmp_path / "d", extra_args=["--stream-retention", str(retention)]) as srv,
        Client(srv.target) as c,
    ):
        c.deploy(deploy_script(config))
        c.call("setup", **setup_params(config))
        tables = stream_and_window_tables(c)
        assert 'streams."votes_in"' in tables and 'windows."trending"' in tables
        consumed = {'streams."votes_in"', 'streams."validated"', 'streams."to_delete"'}
        retained = {'streams."rejected_votes"', 'streams."deletions"'}
        sizes = []
        start = time.monotonic()
        for third in range(3):
            futures = [c.push("votes_in", votes.slice(i, 1)) for i in range(third * 300, (third + 1) * 300)]
            acks = [f.result() for f in futures]
            assert all(a.outcome == "committed" and not a.reason for a in acks), [a for a in acks if a.reason][:3]
            size = {t: count(c, t) for t in tables}
            sizes.append(size)
            for t in consumed:
                assert size[t] == 0, (third, t, size)
            for t in retained:  # one row at most per single-vote batch
                assert size[t] <= retention + max(1, retention // 10), (third, t, size)
            assert size['windows."trending"'] < config.window + config.slide, size
            assert set(size) == consumed | retained | {'windows."trending"'}
        elapsed = time.monotonic() - start
        # the tables did not grow from the first third on
        for t in tables:
            bound = max(sizes[0][t], retention + 1 if t in retained else config.window + config.slide - 1)
            assert sizes[1][t] <= bound and sizes[2][t] <= bound, (t, sizes)
        # the run did real work: votes were taken and rejected, contestants were deleted
        assert count(c, "votes") > 0 and count(c, "rejected_votes") > 0
        assert count(c, "contestants") < config.contestants
        print(f"900 single-vote batches in {elapsed:.1f} s")
