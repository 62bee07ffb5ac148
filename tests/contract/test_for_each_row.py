"""`FOR EACH ROW`: a procedure takes its batch one tuple at a time, each with all it triggers, atomically.

`each` is partitioned by `k` and FOR EACH ROW; `down`, downstream on a single
table, logs every tuple with the number of rows logged before it. Taken one
tuple at a time (depth first), the i-th tuple of a batch sees i - 1 earlier
rows of the same batch; set-based, all would see the same count. At P = 2 a
batch with keys on both partitions is coordinated by the front, so both the
partition's and the coordinator's walk of the schedule (server/schedule.py)
are checked, under both executors.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from conftest import drop_all

from streamtx.client import Client
from streamtx.errors import InvalidArgument
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.partitioning import PartitionMap

pytestmark = pytest.mark.timeout(180)

APP = """
CREATE TABLE acc (k BIGINT PRIMARY KEY, n BIGINT NOT NULL) PARTITION BY (k);
CREATE TABLE log (x BIGINT, seen BIGINT);
CREATE STREAM s1 (k BIGINT, x BIGINT) PARTITION BY (k);
CREATE STREAM s2 (x BIGINT);
CREATE PROCEDURE each ON STREAM s1 FOR EACH ROW AS BEGIN
    SELECT error('each refuses ' || min(x)) FROM s1 HAVING min(x) < 0;
    INSERT INTO acc SELECT k, 1 FROM s1 ON CONFLICT DO UPDATE SET n = acc.n + 1;
    INSERT INTO s2 SELECT x FROM s1;
END;
CREATE PROCEDURE down ON STREAM s2 AS BEGIN
    SELECT error('down refuses ' || min(x)) FROM s2 HAVING min(x) = 13;
    INSERT INTO log SELECT x, (SELECT count(*) FROM log) FROM s2;
END;
"""


@pytest.fixture(
    scope="module",
    params=[(1, "opchain"), (1, "serial"), (2, "opchain"), (2, "serial")],
    ids=lambda p: f"P{p[0]}-{p[1]}",
)
def srv(request, tmp_path_factory) -> Iterator[tuple[EmbeddedServer, int]]:
    partitions, executor = request.param
    with EmbeddedServer(tmp_path_factory.mktemp("each"), partitions=partitions, executor=executor) as s:
        yield s, partitions


@pytest.fixture
def client(srv) -> Iterator[tuple[Client, list[int]]]:
    """The app freshly deployed, and two keys on different partitions (when there are two)."""
    s, partitions = srv
    with Client(s.target) as c:
        drop_all(c)
        c.deploy(APP)
        yield c, keys_on_each(partitions)


def keys_on_each(partitions: int) -> list[int]:
    owner = PartitionMap.round_robin(partitions, 1024).owners(pa.array(range(1, 100), pa.int64())).tolist()
    return [1 + owner.index(p) for p in range(partitions)]


def rows(pairs: list[tuple[int, int]]) -> dict[str, list[int]]:
    return {"k": [k for k, _ in pairs], "x": [x for _, x in pairs]}


def logged(c: Client) -> list[tuple[int, int]]:
    return c.query("SELECT x, seen FROM log ORDER BY seen, x").fetchall()


def counts(c: Client) -> list[tuple[int, int]]:
    return c.query("SELECT k, n FROM acc ORDER BY k").fetchall()


def test_each_tuple_runs_with_what_it_triggers_before_the_next(client):
    c, keys = client
    a, b = keys[0], keys[-1]
    ack = c.push("s1", rows([(a, 1), (b, 2), (a, 3)])).result()
    assert ack.outcome == "committed" and not ack.reason, ack
    assert logged(c) == [(1, 0), (2, 1), (3, 2)]
    assert counts(c) == sorted(({a: 2, b: 1} if a != b else {a: 3}).items())
    c.push("s1", rows([(b, 4), (a, 5)])).result()
    assert logged(c)[-2:] == [(4, 3), (5, 4)]


def test_a_batch_stays_atomic_when_a_later_tuple_aborts(client):
    c, keys = client
    a, b = keys[0], keys[-1]
    c.push("s1", rows([(a, 1)])).result()
    bad = c.push("s1", rows([(a, 2), (b, 3), (b, -1), (a, 4)])).result()
    assert bad.outcome == "rejected" and "each refuses -1" in bad.reason, bad
    assert logged(c) == [(1, 0)] and counts(c) == [(a, 1)]
    nxt = c.push("s1", rows([(b, 5)])).result()
    assert nxt.outcome == "committed" and logged(c) == [(1, 0), (5, 1)]


def test_a_downstream_abort_undoes_that_tuples_te_only(client):
    c, keys = client
    a, b = keys[0], keys[-1]
    ack = c.push("s1", rows([(a, 12), (b, 13), (a, 14)])).result()
    assert ack.outcome == "committed" and "down refuses 13" in ack.reason, ack
    assert logged(c) == [(12, 0), (14, 1)]  # 13's log row was undone; 14 ran after it all the same
    assert counts(c) == sorted(({a: 2, b: 1} if a != b else {a: 3}).items())


def test_a_resent_batch_changes_nothing(client):
    c, keys = client
    with Client(c.target, producer_id="each-resender") as p:
        first = p.push("s1", rows([(keys[0], 1), (keys[-1], 2)]), batch_id=1).result()
        again = p.push("s1", rows([(keys[0], 1), (keys[-1], 2)]), batch_id=1).result()
    assert first.outcome == "committed" and again.outcome == "duplicate"
    assert logged(c) == [(1, 0), (2, 1)]


def test_a_for_each_row_procedure_cannot_be_in_a_transaction_group(client):
    c, _ = client
    before = c.status()["procedures"]
    with pytest.raises(InvalidArgument, match="procedure 'each' is FOR EACH ROW, so it cannot be in transaction group"):
        c.deploy("CREATE TRANSACTION GROUP g (each, down);")
    assert c.status()["procedures"] == before


SHARED = """
CREATE STREAM s3 (k BIGINT, x BIGINT) PARTITION BY (k);
CREATE STREAM mid (x BIGINT, src VARCHAR);
CREATE TABLE runs (n BIGINT, srcs VARCHAR, xs VARCHAR);
CREATE PROCEDURE by_one ON STREAM s3 FOR EACH ROW AS BEGIN INSERT INTO mid SELECT x, 'one' FROM s3; END;
CREATE PROCEDURE by_all ON STREAM s3 AS BEGIN INSERT INTO mid SELECT x * 10, 'all' FROM s3; END;
CREATE PROCEDURE tally ON STREAM mid AS BEGIN
    INSERT INTO runs SELECT count(*), string_agg(DISTINCT src, ',' ORDER BY src), string_agg(x::VARCHAR, ',' ORDER BY x)
    FROM mid;
END;
"""


def test_a_stream_with_a_for_each_row_consumer_is_taken_one_tuple_at_a_time_by_all(client):
    """Both consumers of s3 take each tuple as its own batch, as if the tuples had come one batch each;
    `tally` reads everything both emitted for that tuple as one batch, at P = 1 and across partitions."""
    c, keys = client
    c.deploy(SHARED)
    a, b = keys[0], keys[-1]
    assert c.push("s3", rows([(a, 1), (b, 2), (a, 3)])).result().outcome == "committed"
    assert c.query("SELECT n, srcs, xs FROM runs ORDER BY xs").fetchall() == [
        (2, "all,one", "1,10"),
        (2, "all,one", "2,20"),
        (2, "all,one", "3,30"),
    ]
    for x in (4, 5):  # one row a batch, on either partition: both consumers' output reaches `tally` together
        assert c.push("s3", rows([(b if x == 4 else a, x)])).result().outcome == "committed"
    assert c.query("SELECT n, srcs, xs FROM runs WHERE xs > '4' ORDER BY xs").fetchall() == [
        (2, "all,one", "4,40"),
        (2, "all,one", "5,50"),
    ]


FAN = """
CREATE STREAM s4 (k BIGINT, x BIGINT) PARTITION BY (k);
CREATE STREAM fanned (x BIGINT);
CREATE STREAM mid (x BIGINT, src VARCHAR);
CREATE TABLE runs (n BIGINT, srcs VARCHAR, xs VARCHAR);
CREATE PROCEDURE fan ON STREAM s4 AS BEGIN INSERT INTO fanned SELECT x FROM s4; END;
CREATE PROCEDURE left_arm ON STREAM fanned AS BEGIN INSERT INTO mid SELECT x, 'left' FROM fanned; END;
CREATE PROCEDURE right_arm ON STREAM fanned AS BEGIN INSERT INTO mid SELECT x * 10, 'right' FROM fanned; END;
CREATE PROCEDURE tally ON STREAM mid AS BEGIN
    INSERT INTO runs SELECT count(*), string_agg(DISTINCT src, ',' ORDER BY src), string_agg(x::VARCHAR, ',' ORDER BY x)
    FROM mid;
END;
"""


def test_a_consumer_reads_what_every_producer_emitted_in_the_command_as_one_batch(client):
    """left_arm and right_arm, two TEs, emit on mid; `tally` runs once per batch over both outputs (one TE
    per stream and command, as on one partition: the coordinator used to run it once per producer)."""
    c, keys = client
    c.deploy(FAN)
    a, b = keys[0], keys[-1]
    assert c.push("s4", rows([(a, 1), (b, 2)])).result().outcome == "committed"
    assert c.query("SELECT n, srcs, xs FROM runs").fetchall() == [(4, "left,right", "1,2,10,20")]
