"""Windows (`ROWS n SLIDE m`, `RANGE t SLIDE s`): staging, slides, expiry, scoping, undo.

The tests of a partition count share a real server (conftest `shared_client`),
each deploying its app afresh on the emptied server. A window's EE trigger
copies what the trigger sees (`SELECT ... FROM w`) into a log table, stamped with
the running batch id, so each slide's window is recorded; Query on `windows.<w>`
shows the stored tuples (visible and staged, with `__seq` and `__staged`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from conftest import PARTITION_COUNTS

from streamtx.errors import InvalidArgument

PARTITIONS = PARTITION_COUNTS

pytestmark = pytest.mark.timeout(180)


def rows_app(size: int, slide: int) -> str:
    """Stream s, window w owned by p (which aborts a batch holding a negative x), trigger logging w."""
    return f"""
CREATE TABLE wlog (b BIGINT, n BIGINT, xs BIGINT[]);
CREATE TABLE seen (b BIGINT, x BIGINT);
CREATE STREAM s (x BIGINT);
CREATE WINDOW w ON s ROWS {size} SLIDE {slide};
CREATE PROCEDURE p ON STREAM s AS BEGIN
    SELECT error('negative x') WHERE EXISTS (SELECT 1 FROM s WHERE x < 0);
    INSERT INTO seen SELECT $batch_id, x FROM s;
END;
CREATE TRIGGER log_w ON WINDOW w AS BEGIN
    INSERT INTO wlog SELECT $batch_id, count(*), coalesce(list(x ORDER BY x), []) FROM w;
END;
"""


def range_app(size: int, slide: int) -> str:
    return f"""
CREATE TABLE wlog (b BIGINT, n BIGINT, xs BIGINT[]);
CREATE STREAM s (ts BIGINT, x BIGINT);
CREATE WINDOW w ON s RANGE {size} SLIDE {slide};
CREATE PROCEDURE p ON STREAM s AS BEGIN
    SELECT error('negative x') WHERE EXISTS (SELECT 1 FROM s WHERE x < 0);
END;
CREATE TRIGGER log_w ON WINDOW w AS BEGIN
    INSERT INTO wlog SELECT $batch_id, count(*), coalesce(list(ts ORDER BY ts), []) FROM w;
END;
"""


def wlog(client) -> list[tuple]:
    return [(b, n, list(xs)) for b, n, xs in client.query("SELECT b, n, xs FROM wlog ORDER BY b").fetchall()]


def stored(client, col: str = "x") -> tuple[list[int], list[int]]:
    """(visible, staged) values of windows.w, in __seq order."""
    rows = client.query(f"SELECT {col}, __staged FROM windows.w ORDER BY __seq").fetchall()
    return [v for v, staged in rows if not staged], [v for v, staged in rows if staged]


def view(client, col: str = "x") -> list[int]:
    return sorted(v for (v,) in client.query(f"SELECT {col} FROM w").fetchall())


def push(client, rows: dict):
    return client.push("s", rows).result()


# ------------------------------------------------------------------------ reference models


@dataclass
class RowsModel:
    """ROWS n SLIDE m: a slide every m tuples, the last n slid tuples visible."""

    size: int
    slide: int
    tuples: list[int] = field(default_factory=list)
    visible_end: int = 0

    def feed(self, xs: list[int]) -> bool:
        self.tuples += xs
        slides = (len(self.tuples) - self.visible_end) // self.slide
        self.visible_end += slides * self.slide
        return slides > 0

    @property
    def visible(self) -> list[int]:
        return self.tuples[max(0, self.visible_end - self.size) : self.visible_end]

    @property
    def staged(self) -> list[int]:
        return self.tuples[self.visible_end :]


@dataclass
class RangeModel:
    """RANGE t SLIDE s on ts: ends advance by s while a tuple has ts >= end + s; visible end-t <= ts < end."""

    size: int
    slide: int
    tuples: list[int] = field(default_factory=list)
    end: int | None = None

    def feed(self, ts: list[int]) -> bool:
        self.tuples += ts
        if self.end is None:
            self.end = (min(ts) // self.slide) * self.slide
        hi = max(ts)
        if hi < self.end + self.slide:
            return False
        self.end += (hi - self.end) // self.slide * self.slide
        return True

    @property
    def visible(self) -> list[int]:
        if self.end is None:
            return []
        return sorted(t for t in self.tuples if self.end - self.size <= t < self.end)

    @property
    def staged(self) -> list[int]:
        return sorted(t for t in self.tuples if self.end is None or t >= self.end)


# ------------------------------------------------------------------------------ ROWS


def test_rows_window_stages_until_a_slide_then_slides_and_expires(shared_client):
    shared_client.deploy(rows_app(4, 2))
    expected_log = []
    model = RowsModel(4, 2)
    for x in range(1, 10):
        ack = push(shared_client, {"x": [x]})
        assert ack.outcome == "committed", ack
        if model.feed([x]):
            expected_log.append((ack.timestamp, len(model.visible), model.visible))
        visible, staged = stored(shared_client)
        assert (visible, staged) == (model.visible, model.staged), f"after x={x}"
        assert view(shared_client) == model.visible
        assert wlog(shared_client) == expected_log
    # concretely: x=1 staged; x=2 completes the first slide (1, 2 visible); x=3 staged; x=4 -> 1..4;
    # x=6 -> 3..6 (1, 2 expired and deleted); x=8 -> 5..8; x=9 staged
    assert [xs for _, _, xs in expected_log] == [[1, 2], [1, 2, 3, 4], [3, 4, 5, 6], [5, 6, 7, 8]]
    assert stored(shared_client) == ([5, 6, 7, 8], [9])
    assert shared_client.query("SELECT count(*) FROM windows.w WHERE x < 5").fetchall() == [(0,)]
    # the window tuples keep the batch id of the batch that brought them
    seqs = shared_client.query("SELECT x, __ts, __seq FROM windows.w ORDER BY __seq").fetchall()
    assert [s for _, _, s in seqs] == [4, 5, 6, 7, 8]
    by_x = dict(shared_client.query("SELECT x, b FROM seen").fetchall())
    assert all(b == by_x[x] for x, b, _ in seqs)


def test_staged_tuples_are_invisible_to_the_owner_and_its_trigger(shared_client):
    shared_client.deploy(
        """
CREATE TABLE obs (b BIGINT, who VARCHAR, n BIGINT);
CREATE STREAM s (x BIGINT);
CREATE WINDOW w ON s ROWS 10 SLIDE 3;
CREATE PROCEDURE p ON STREAM s AS BEGIN
    INSERT INTO obs SELECT $batch_id, 'proc', count(*) FROM w;
END;
CREATE TRIGGER t ON WINDOW w AS BEGIN
    INSERT INTO obs SELECT $batch_id, 'trigger', count(*) FROM w;
END;
"""
    )
    stamps = [push(shared_client, {"x": xs}).timestamp for xs in ([1], [2], [3], [4, 5], [6])]
    got = shared_client.query("SELECT b, who, n FROM obs ORDER BY b, who").fetchall()
    b1, b2, b3, b4, b5 = stamps
    # the procedure runs after the window was fed: it sees the window as of its own batch
    assert got == [
        (b1, "proc", 0),
        (b2, "proc", 0),
        (b3, "proc", 3),
        (b3, "trigger", 3),
        (b4, "proc", 3),
        (b5, "proc", 6),
        (b5, "trigger", 6),
    ]


def test_one_batch_completing_several_slides_moves_the_window_once(shared_client):
    shared_client.deploy(rows_app(4, 1))
    a = push(shared_client, {"x": [1, 2, 3, 4, 5, 6]})
    assert wlog(shared_client) == [(a.timestamp, 4, [3, 4, 5, 6])]  # one trigger run, after the last slide
    assert stored(shared_client) == ([3, 4, 5, 6], [])
    b = push(shared_client, {"x": [7, 8]})
    assert wlog(shared_client)[-1] == (b.timestamp, 4, [5, 6, 7, 8])
    assert len(wlog(shared_client)) == 2


def test_one_batch_completing_several_slides_with_a_remainder(shared_client):
    shared_client.deploy(rows_app(6, 3))
    a = push(shared_client, {"x": [1]})
    b = push(shared_client, {"x": list(range(2, 10))})  # 9 tuples: three slides
    c = push(shared_client, {"x": [10, 11]})  # 11 tuples: still three slides, 10 and 11 staged
    d = push(shared_client, {"x": [12, 13, 14]})  # 14 tuples: four slides, 13 and 14 staged
    assert wlog(shared_client) == [(b.timestamp, 6, [4, 5, 6, 7, 8, 9]), (d.timestamp, 6, [7, 8, 9, 10, 11, 12])]
    assert stored(shared_client) == ([7, 8, 9, 10, 11, 12], [13, 14])
    assert a.ok and c.ok


def test_tumbling_rows_window(shared_client):
    shared_client.deploy(rows_app(3, 3))
    acks = [push(shared_client, {"x": [x]}) for x in range(1, 8)]
    assert wlog(shared_client) == [(acks[2].timestamp, 3, [1, 2, 3]), (acks[5].timestamp, 3, [4, 5, 6])]
    assert stored(shared_client) == ([4, 5, 6], [7])


def test_rows_window_against_a_reference_model(shared_client):
    """Random batch sizes (fixed seed), some batches aborted: every slide's window as the model says."""
    size, slide = 7, 3
    shared_client.deploy(rows_app(size, slide))
    rnd = random.Random(20240601)
    model = RowsModel(size, slide)
    batches, next_x = [], 1
    for _ in range(60):
        xs = list(range(next_x, next_x + rnd.randint(1, 8)))
        next_x += len(xs)
        abort = rnd.random() < 0.15
        if abort:
            xs = xs[:-1] + [-xs[-1]]
        batches.append((xs, abort))
    futures = [shared_client.push("s", {"x": xs}) for xs, _ in batches]
    acks = [f.result() for f in futures]
    expected_log = []
    for (xs, abort), ack in zip(batches, acks, strict=True):
        assert ack.outcome == ("rejected" if abort else "committed"), ack
        if not abort and model.feed(xs):
            expected_log.append((ack.timestamp, len(model.visible), model.visible))
    assert wlog(shared_client) == expected_log
    assert stored(shared_client) == (model.visible, model.staged)


# ----------------------------------------------------------------------------- RANGE


def test_range_window_slides_on_ts(shared_client):
    shared_client.deploy(range_app(10, 5))

    def go(ts: list[int]):
        ack = push(shared_client, {"ts": ts, "x": ts})
        assert ack.outcome == "committed", ack
        return ack.timestamp

    b1 = go([3])  # the first tuple sets end = 0 (3 // 5 * 5); 3 < 0 + 5: nothing slides
    assert wlog(shared_client) == [] and stored(shared_client, "ts") == ([], [3])
    b2 = go([7])  # 7 >= 0 + 5: end = 5, visible -5 <= ts < 5
    assert wlog(shared_client) == [(b2, 1, [3])]
    assert stored(shared_client, "ts") == ([3], [7]) and view(shared_client, "ts") == [3]
    b3 = go([12])  # end = 10: visible 0 <= ts < 10
    assert wlog(shared_client)[-1] == (b3, 2, [3, 7])
    go([14])  # 14 < 10 + 5: staged
    assert len(wlog(shared_client)) == 2 and stored(shared_client, "ts") == ([3, 7], [12, 14])
    b5 = go([26])  # three slides at once: end = 25, visible 15 <= ts < 25 (empty); 3, 7, 12, 14 expire
    assert wlog(shared_client)[-1] == (b5, 0, [])
    assert stored(shared_client, "ts") == ([], [26])
    b6 = go([29, 30, 31])  # end = 30: visible 20 <= ts < 30
    assert wlog(shared_client)[-1] == (b6, 2, [26, 29])
    assert stored(shared_client, "ts") == ([26, 29], [30, 31])
    assert len(wlog(shared_client)) == 4 and b1 < b2


def test_range_window_first_batch_can_slide_and_tuples_within_a_batch_may_be_unordered(shared_client):
    shared_client.deploy(range_app(8, 4))
    a = push(shared_client, {"ts": [13, 5, 9], "x": [1, 2, 3]})  # end starts at 4; 13 >= 8: end = 12
    assert wlog(shared_client) == [(a.timestamp, 2, [5, 9])]  # 4 <= ts < 12
    assert stored(shared_client, "ts") == ([5, 9], [13])


def test_range_window_against_a_reference_model(shared_client):
    size, slide = 12, 4
    shared_client.deploy(range_app(size, slide))
    rnd = random.Random(7)
    model = RangeModel(size, slide)
    batches, ts = [], 50
    for _ in range(60):
        batch = []
        for _ in range(rnd.randint(1, 4)):
            ts += rnd.choice([0, 0, 1, 2, 3, 5, 9])
            batch.append(ts)
        abort = rnd.random() < 0.15
        batches.append((batch, abort))
    futures = [shared_client.push("s", {"ts": b, "x": [-1 if abort else 1] * len(b)}) for b, abort in batches]
    acks = [f.result() for f in futures]
    expected_log = []
    for (batch, abort), ack in zip(batches, acks, strict=True):
        assert ack.outcome == ("rejected" if abort else "committed"), ack
        if not abort and model.feed(batch):
            expected_log.append((ack.timestamp, len(model.visible), model.visible))
    assert wlog(shared_client) == expected_log
    visible, staged = stored(shared_client, "ts")
    assert (sorted(visible), sorted(staged)) == (model.visible, model.staged)


def test_range_window_recreated_under_the_same_name_starts_afresh(shared_client):
    shared_client.deploy(range_app(10, 5))
    for ts in (100, 110, 120):
        assert push(shared_client, {"ts": [ts], "x": [ts]}).ok
    shared_client.deploy("DROP TRIGGER log_w; DROP PROCEDURE p; DROP WINDOW w;")
    shared_client.deploy(
        """
CREATE WINDOW w ON s RANGE 10 SLIDE 5;
CREATE PROCEDURE p ON STREAM s AS BEGIN SELECT 1; END;
CREATE TRIGGER log_w ON WINDOW w AS BEGIN
    INSERT INTO wlog SELECT $batch_id, count(*), coalesce(list(ts ORDER BY ts), []) FROM w;
END;
"""
    )
    before = len(wlog(shared_client))
    push(shared_client, {"ts": [3], "x": [3]})
    b = push(shared_client, {"ts": [7], "x": [7]})  # a new window: end = 0, then 5
    assert wlog(shared_client)[before:] == [(b.timestamp, 1, [3])]
    assert stored(shared_client, "ts") == ([3], [7])


# --------------------------------------------------------------------------- scoping

BASE = """
CREATE TABLE t (x BIGINT);
CREATE STREAM s (x BIGINT);
CREATE WINDOW w ON s ROWS 3 SLIDE 1;
"""
OWNER = "CREATE PROCEDURE p ON STREAM s AS BEGIN INSERT INTO t SELECT x FROM w; END;\n"


def deploy_error(client, script: str) -> str:
    with pytest.raises(InvalidArgument) as info:
        client.deploy(script)
    return info.value.message


def test_window_read_by_a_procedure_that_does_not_own_it_is_rejected(shared_client):
    msg = deploy_error(shared_client, BASE + OWNER + "CREATE PROCEDURE q AS BEGIN SELECT count(*) FROM w; END;")
    assert "'w'" in msg and "q" in msg and "belongs to procedure 'p'" in msg
    msg = deploy_error(
        shared_client,
        BASE
        + OWNER
        + "CREATE STREAM s2 (x BIGINT);"
        + "CREATE PROCEDURE q ON STREAM s2 AS BEGIN INSERT INTO t SELECT x FROM w; END;",
    )
    assert "'w'" in msg and "q" in msg
    assert shared_client.status()["windows"] == []  # nothing deployed


def test_window_whose_stream_has_no_consumer_is_rejected(shared_client):
    msg = deploy_error(shared_client, BASE)
    assert "window 'w'" in msg and "no procedure consumes it" in msg


def test_window_used_by_two_consumers_is_rejected(shared_client):
    msg = deploy_error(
        shared_client,
        BASE + OWNER + "CREATE PROCEDURE p2 ON STREAM s AS BEGIN INSERT INTO t SELECT x + 1 FROM w; END;",
    )
    assert "window 'w'" in msg and "p, p2" in msg


def test_triggers_may_read_only_the_window_they_are_on(shared_client):
    shared_client.deploy(
        BASE + OWNER + "CREATE TRIGGER tw ON WINDOW w AS BEGIN INSERT INTO t SELECT sum(x) FROM w; END;"
    )
    msg = deploy_error(shared_client, "CREATE TRIGGER ts ON STREAM s AS BEGIN INSERT INTO t SELECT sum(x) FROM w; END;")
    assert "'w'" in msg and "ts" in msg


def test_window_owner_is_the_consumer_that_uses_it(shared_client):
    """s2 has two consumers; only q2 reads w2, so q2 owns it and feeds it (q1 does not)."""
    shared_client.deploy(
        """
CREATE TABLE t (who VARCHAR, b BIGINT, n BIGINT);
CREATE STREAM s (x BIGINT);
CREATE STREAM s2 (x BIGINT);
CREATE WINDOW w2 ON s2 ROWS 5 SLIDE 1;
CREATE PROCEDURE p ON STREAM s AS BEGIN INSERT INTO s2 SELECT x FROM s; END;
CREATE PROCEDURE q1 ON STREAM s2 AS BEGIN INSERT INTO t SELECT 'q1', $batch_id, count(*) FROM s2; END;
CREATE PROCEDURE q2 ON STREAM s2 AS BEGIN INSERT INTO t SELECT 'q2', $batch_id, count(*) FROM w2; END;
"""
    )
    acks = [push(shared_client, {"x": xs}) for xs in ([1, 2], [3, 4, 5], [6])]
    got = shared_client.query("SELECT who, b, n FROM t ORDER BY b, who").fetchall()
    b1, b2, b3 = (a.timestamp for a in acks)
    assert got == [("q1", b1, 2), ("q2", b1, 2), ("q1", b2, 3), ("q2", b2, 5), ("q1", b3, 1), ("q2", b3, 5)]
    assert shared_client.query("SELECT list(x ORDER BY x) FROM w2").fetchall() == [([2, 3, 4, 5, 6],)]


# ------------------------------------------------------------------------- state, undo


def test_window_state_carries_over_between_tes_and_deploys(shared_client):
    shared_client.deploy(rows_app(4, 2))
    push(shared_client, {"x": [1]})
    push(shared_client, {"x": [2]})
    push(shared_client, {"x": [3]})
    shared_client.deploy("CREATE TABLE unrelated (a INTEGER);")  # the window survives a deploy untouched
    assert stored(shared_client) == ([1, 2], [3])
    d = push(shared_client, {"x": [4]})  # completes the slide begun before the deploy
    assert wlog(shared_client)[-1] == (d.timestamp, 4, [1, 2, 3, 4])
    e = push(shared_client, {"x": [5, 6]})
    assert wlog(shared_client)[-1] == (e.timestamp, 4, [3, 4, 5, 6])


def test_aborted_batch_leaves_no_trace_in_the_window(shared_client):
    shared_client.deploy(rows_app(4, 2))
    push(shared_client, {"x": [1]})
    bad = push(shared_client, {"x": [2, -3, 4]})  # would complete a slide; its trigger ran, then the TE aborted
    assert bad.outcome == "rejected" and "negative x" in bad.reason
    assert wlog(shared_client) == []
    assert stored(shared_client) == ([], [1])
    assert shared_client.query("SELECT count(*) FROM windows.w WHERE __ts = $b", {"b": bad.timestamp}).fetchall() == [
        (0,)
    ]
    # later slides are as if the batch never came
    c = push(shared_client, {"x": [5]})
    d = push(shared_client, {"x": [6, 7]})
    assert wlog(shared_client) == [(c.timestamp, 2, [1, 5]), (d.timestamp, 4, [1, 5, 6, 7])]
    assert stored(shared_client) == ([1, 5, 6, 7], [])
    seqs = [s for (s,) in shared_client.query("SELECT __seq FROM windows.w ORDER BY __seq").fetchall()]
    assert seqs == [0, 1, 2, 3]  # positions continue without a gap


def test_aborted_batch_on_a_range_window_leaves_no_trace(shared_client):
    shared_client.deploy(range_app(10, 5))
    push(shared_client, {"ts": [1], "x": [1]})
    bad = push(shared_client, {"ts": [40], "x": [-1]})  # would move end to 40
    assert bad.outcome == "rejected"
    assert wlog(shared_client) == [] and stored(shared_client, "ts") == ([], [1])
    b = push(shared_client, {"ts": [6], "x": [6]})  # end 0 -> 5, as if ts=40 never came
    assert wlog(shared_client) == [(b.timestamp, 1, [1])]
    assert stored(shared_client, "ts") == ([1], [6])


def test_window_trigger_failure_aborts_the_owner_te(shared_client):
    shared_client.deploy(
        """
CREATE TABLE seen (x BIGINT);
CREATE STREAM s (x BIGINT);
CREATE WINDOW w ON s ROWS 2 SLIDE 2;
CREATE PROCEDURE p ON STREAM s AS BEGIN INSERT INTO seen SELECT x FROM s; END;
CREATE TRIGGER t ON WINDOW w AS BEGIN
    SELECT error('window sum too big') WHERE (SELECT sum(x) FROM w) > 100;
END;
"""
    )
    assert push(shared_client, {"x": [1]}).ok
    bad = push(shared_client, {"x": [200]})
    assert bad.outcome == "rejected" and "window sum too big" in bad.reason
    assert shared_client.query("SELECT x FROM seen").fetchall() == [(1,)]
    assert stored(shared_client) == ([], [1])
    assert push(shared_client, {"x": [2]}).ok
    assert stored(shared_client) == ([1, 2], [])


def test_resent_batch_does_not_feed_the_window_twice(shared_client):
    shared_client.deploy(rows_app(4, 2))
    push(shared_client, {"x": [1]})
    b = push(shared_client, {"x": [2]})
    again = shared_client.push("s", {"x": [2]}, batch_id=2).result()  # the producer re-sends batch 2
    assert again.outcome == "duplicate" and again.original == "committed"
    aborted = push(shared_client, {"x": [-3]})
    again = shared_client.push("s", {"x": [-3]}, batch_id=3).result()
    assert aborted.outcome == "rejected" and again.outcome == "duplicate" and again.original == "rejected"
    assert wlog(shared_client) == [(b.timestamp, 2, [1, 2])]
    assert stored(shared_client) == ([1, 2], [])
    d = push(shared_client, {"x": [4]})
    assert d.batch_id == 4 and stored(shared_client) == ([1, 2], [4])


def test_window_trigger_emission_activates_a_pe_trigger(shared_client):
    shared_client.deploy(
        """
CREATE TABLE handled (b BIGINT, n BIGINT, top BIGINT);
CREATE STREAM s (x BIGINT);
CREATE STREAM alerts (n BIGINT, top BIGINT);
CREATE WINDOW w ON s ROWS 4 SLIDE 2;
CREATE PROCEDURE p ON STREAM s AS BEGIN SELECT count(*) FROM w; END;
CREATE TRIGGER t ON WINDOW w AS BEGIN INSERT INTO alerts SELECT count(*), max(x) FROM w; END;
CREATE PROCEDURE handle ON STREAM alerts AS BEGIN INSERT INTO handled SELECT $batch_id, n, top FROM alerts; END;
"""
    )
    acks = [push(shared_client, {"x": [x]}) for x in range(1, 6)]
    assert shared_client.query("SELECT b, n, top FROM handled ORDER BY b").fetchall() == [
        (acks[1].timestamp, 2, 2),
        (acks[3].timestamp, 4, 4),
    ]
    assert shared_client.query("SELECT count(*) FROM streams.alerts").fetchall() == [(0,)]
