"""State procedures over partitioned tables: `PARTITION ON (columns)`, local and coordinated batches.

One server with three partitions (so that a batch can involve some
partitions and not others) runs `examples.counters:bounded_add`, whose event
adds `delta` to counter `key` and, if `mirror` is set, to counter `mirror`
too. Declared `PARTITION ON (key, mirror)` every batch must give what one
partition gives (the plain model below), wherever its keys live; declared
`PARTITION ON (key)` alone, an event naming a mirror elsewhere must be
refused loudly, never run over a missing row.
"""

from __future__ import annotations

import grpc
import pyarrow as pa
import pytest

from streamtx.client import Client
from streamtx.errors import InvalidArgument
from streamtx.procedures.examples.counters import EVENTS, reference_add
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.partitioning import PartitionMap

pytestmark = pytest.mark.timeout(300)

P = 3
TABLES = """
CREATE TABLE counters (key BIGINT PRIMARY KEY, n BIGINT NOT NULL) PARTITION BY (key);
CREATE STREAM counter_events (event_id BIGINT, key BIGINT, delta BIGINT, "limit" BIGINT, mirror BIGINT);
CREATE STREAM counter_results (event_id BIGINT, ok BOOLEAN);
"""
PROC = "CREATE PROCEDURE bounded_add ON STREAM counter_events {how} AS PYTHON 'examples.counters:bounded_add';"


def keys_on(partition: int, n: int) -> list[int]:
    owners = PartitionMap.round_robin(P, 1024).owners(pa.array(range(1000), pa.int64())).tolist()
    return [k for k, p in enumerate(owners) if p == partition][:n]


K0, K1, K2 = keys_on(0, 4), keys_on(1, 4), keys_on(2, 4)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with EmbeddedServer(tmp_path_factory.mktemp("p3"), partitions=P, executor="opchain") as srv:
        yield srv


@pytest.fixture
def client(server):
    with Client(server.target) as c:
        names = c.status()
        drops = [f"DROP {k.upper()} {n};" for k in ("procedure", "stream", "table") for n in names.get(k + "s", [])]
        if drops:
            c.deploy("\n".join(drops))
        yield c


def events(rows: list[tuple[int, int, int, int | None]]) -> pa.Table:
    """(event_id, key, delta, mirror) with a limit no event reaches."""
    return pa.Table.from_pylist(
        [{"event_id": i, "key": k, "delta": d, "limit": 10**9, "mirror": m} for i, k, d, m in rows], schema=EVENTS
    )


def model(rows: list[tuple[int, int, int, int | None]]) -> dict[int, int]:
    counters: dict[int, int] = {}
    for _, key, delta, mirror in rows:
        assert reference_add(counters, key, delta, 10**9, mirror)
    return counters


def deploy_error(c: Client, script: str) -> str:
    with pytest.raises(InvalidArgument) as err:
        c.deploy(script)
    return err.value.message


def test_partition_on_declarations_are_checked_at_deploy(client):
    c = client
    assert "'keyz' is not a column of stream 'counter_events'" in deploy_error(
        c, TABLES + PROC.format(how="PARTITION ON (key, keyz)")
    )
    text = deploy_error(
        c, TABLES.replace("mirror BIGINT)", "mirror DOUBLE)") + PROC.format(how="PARTITION ON (key, mirror)")
    )
    assert "column 'mirror' of stream 'counter_events' is DOUBLE" in text and "BIGINT[]" in text
    assert 'lists column "key" twice' in deploy_error(c, TABLES + PROC.format(how="PARTITION ON (key, key)"))
    assert "lists no column" in deploy_error(c, TABLES + PROC.format(how="PARTITION ON ()"))
    sql = TABLES + "CREATE PROCEDURE p ON STREAM counter_events PARTITION ON (key) AS BEGIN SELECT 1; END;"
    assert "procedure 'p': PARTITION ON (key)" in deploy_error(c, sql) and "SQL procedure" in deploy_error(c, sql)
    plain = TABLES + "CREATE PROCEDURE p ON STREAM counter_events PARTITION ON (key) AS PYTHON 'examples.procs:enrich';"
    assert "is not a StateProcedure" in deploy_error(c, plain)
    keyed_stream = TABLES.replace("mirror BIGINT)", "mirror BIGINT) PARTITION BY (key)")
    assert "is PARTITION BY (key)" in deploy_error(c, keyed_stream + PROC.format(how="PARTITION ON (key)"))
    second = "CREATE PROCEDURE other ON STREAM counter_events AS BEGIN SELECT 1; END;"
    text = deploy_error(c, TABLES + PROC.format(how="PARTITION ON (key)") + second)
    assert "only consumer of stream 'counter_events', which other consumes too" in text
    assert "one parameter, not 2" in deploy_error(
        c, "CREATE PROCEDURE f (a BIGINT, b BIGINT) PARTITION ON (a, b) AS BEGIN SELECT 1; END;"
    )
    assert c.status().get("tables", []) == []  # every refused deploy changed nothing


def test_batches_anywhere_equal_one_partition(client):
    """Local batches on each partition, batches over two of three and over all three: the model's result."""
    c = client
    c.deploy(TABLES + PROC.format(how="PARTITION ON (key, mirror)"))
    rows = [
        (0, K1[0], 5, None),  # local on partition 1
        (1, K2[0], 7, K2[1]),  # local on partition 2
        (2, K0[0], 1, K1[0]),  # partitions 0 and 1
        (3, K1[1], 2, K2[0]),  # 1 and 2 (and home, which emits)
        (4, K1[0], 3, K1[2]),
        (5, K2[2], 4, K0[1]),
        (6, K0[2], 6, None),
    ]
    batches = [rows[0:1], rows[1:2], rows[2:3], rows[3:5], rows[5:7]]
    acks = [c.push("counter_events", events(b)).result() for b in batches]
    assert [(a.outcome, a.reason) for a in acks] == [("committed", "")] * len(batches)
    assert dict(c.query("SELECT key, n FROM counters").fetchall()) == model(rows)
    assert c.query("SELECT event_id, ok FROM counter_results ORDER BY event_id").fetchall() == [
        (i, True) for i in range(len(rows))
    ]
    counters = c.status()["counters"]
    held = [int(counters.get(f"partition{p}.rows.counters", 0)) for p in range(P)]
    mine = [sum(1 for k in model(rows) if k in keys) for keys in (K0, K1, K2)]
    assert held == mine  # each counter was written back on its own partition only
    assert int(counters.get("coordinated", 0)) == 3


def test_a_key_outside_partition_on_fails_loudly(client):
    """PARTITION ON (key) while events also name `mirror`: refused, whether the batch is local or coordinated."""
    c = client
    c.deploy(TABLES + PROC.format(how="PARTITION ON (key)"))
    local = c.push("counter_events", events([(0, K1[0], 5, K2[0])])).result()
    assert local.outcome == "rejected" and local.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"counters[{K2[0]}], which lives on partition 2, but its batch runs on partition 1" in local.reason
    assert "PARTITION ON" in local.reason
    spanning = c.push("counter_events", events([(1, K0[0], 1, None), (2, K1[1], 1, K2[1])])).result()
    assert spanning.outcome == "rejected" and spanning.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"counters[{K2[1]}], which lives on partition 2, but its batch involves partitions 0, 1" in spanning.reason
    fine = c.push("counter_events", events([(3, K2[2], 4, None)])).result()
    assert (fine.outcome, fine.reason) == ("committed", "")
    assert c.query("SELECT key, n FROM counters").fetchall() == [(K2[2], 4)]  # the refused batches changed nothing


def test_keys_found_local_are_remembered_key_by_key_never_batch_by_batch(client):
    """A partition remembers the rows it found its own (`check_local`); an event naming one of those and a
    stray row is still refused, and the remembered rows keep running."""
    c = client
    c.deploy(TABLES + PROC.format(how="PARTITION ON (key)"))
    pushed = [(0, K1[0], 5, None), (1, K1[0], 1, K1[1]), (2, K1[1], 2, K1[0])]
    acks = [c.push("counter_events", events([row])).result() for row in pushed]
    assert [(a.outcome, a.reason) for a in acks] == [("committed", "")] * 3
    stray = c.push("counter_events", events([(3, K1[0], 1, K2[0])])).result()
    assert stray.outcome == "rejected" and stray.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"counters[{K2[0]}], which lives on partition 2, but its batch runs on partition 1" in stray.reason
    again = c.push("counter_events", events([(4, K1[1], 1, K1[0])])).result()
    assert (again.outcome, again.reason) == ("committed", "")
    assert dict(c.query("SELECT key, n FROM counters").fetchall()) == model([*pushed, (4, K1[1], 1, K1[0])])


def test_a_state_procedure_without_partition_on_refuses_rows_of_other_partitions(client):
    c = client
    c.deploy(TABLES + PROC.format(how=""))
    home = c.push("counter_events", events([(0, K0[0], 2, K0[1])])).result()
    assert (home.outcome, home.reason) == ("committed", "")
    away = c.push("counter_events", events([(1, K0[0], 2, K1[0])])).result()
    assert away.outcome == "rejected" and away.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"counters[{K1[0]}], which lives on partition 1, but its batch runs on partition 0" in away.reason
    assert "declare the event columns" in away.reason
    assert sorted(c.query("SELECT key, n FROM counters").fetchall()) == sorted([(K0[0], 2), (K0[1], 2)])


@pytest.mark.parametrize("partitions", [1, P])
def test_a_state_procedure_writing_a_replicated_table_is_refused(client, tmp_path, partitions):
    """A TE runs on one partition or a few: writing a replicated table would leave the other copies behind."""
    replicated = TABLES.replace("NOT NULL) PARTITION BY (key);", "NOT NULL) REPLICATED;")
    with EmbeddedServer(tmp_path / "d", partitions=partitions, executor="opchain") as srv, Client(srv.target) as c:
        c.deploy(replicated + PROC.format(how=""))
        ack = c.push("counter_events", events([(0, 1, 5, None)])).result()
        assert ack.outcome == "rejected" and ack.code == grpc.StatusCode.FAILED_PRECONDITION, ack
        assert "writes replicated table 'counters'" in ack.reason, ack.reason
        assert c.query("SELECT count(*) FROM counters").fetchall() == [(0,)]
