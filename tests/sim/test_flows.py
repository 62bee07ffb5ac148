"""Flows: batches whose dataflow goes from their keys' partition to home run in two stages (front/flows.py).

A SQL dataflow of the voter's shape: `take` runs on the partition of each
batch's key and feeds `tally_up` on the home partition, which aborts on a
negative value (its TE undone, the batch committed) and, for a value that is
a multiple of 7, feeds `wipe`, which runs on every partition and deletes what
`take` wrote: a batch reaching it cuts the flow, and the next batch's `take`
must see the deletion. Random pipelined batches must end, batch for batch,
in the outcomes of the same batches at P = 1, and in the tables of a plain
sequential model, on servers that run flows (opchain at P = 2, flows of 7 and
of 500 batches, at most) and one that coordinates each batch (serial, P = 2).
Re-sent batches get DUPLICATE with the first outcome and change nothing.
The same with `take` FOR EACH ROW: a batch's rows, on either partition, run
one by one, each through the whole dataflow before the next.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pyarrow as pa
import pytest
from conftest import drop_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.acks import expand

from streamtx.client import Client
from streamtx.server.embedded import EmbeddedServer
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import table_to_ipc

pytestmark = pytest.mark.timeout(600)

SCRIPT = """
CREATE TABLE items (k BIGINT PRIMARY KEY, v BIGINT NOT NULL) PARTITION BY (k);
CREATE TABLE totals (id INTEGER PRIMARY KEY, n BIGINT NOT NULL, s BIGINT NOT NULL);
CREATE STREAM inp (k BIGINT, v BIGINT) PARTITION BY (k);
CREATE STREAM seen (k BIGINT, v BIGINT);
CREATE STREAM wiped (k BIGINT);
CREATE PROCEDURE setup () AS BEGIN
    INSERT INTO totals VALUES (1, 0, 0);
END;
CREATE PROCEDURE take ON STREAM inp AS BEGIN
    INSERT INTO items SELECT k, sum(v) FROM inp GROUP BY k
        ON CONFLICT (k) DO UPDATE SET v = items.v + excluded.v;
    INSERT INTO seen SELECT k, v FROM inp;
END;
CREATE PROCEDURE tally_up ON STREAM seen AS BEGIN
    SELECT error('negative value ' || min(v)) FROM seen HAVING min(v) < 0;
    UPDATE totals SET n = n + (SELECT count(*) FROM seen), s = s + (SELECT sum(v) FROM seen) WHERE id = 1;
    INSERT INTO wiped SELECT k FROM seen WHERE v % 7 = 0;
END;
CREATE PROCEDURE wipe ON STREAM wiped AS BEGIN
    DELETE FROM items WHERE k IN (SELECT k FROM wiped);
END;
"""

EACH_ROW = SCRIPT.replace("ON STREAM inp AS", "ON STREAM inp FOR EACH ROW AS")

SERVERS = {  # name: (partitions, executor, interval size)
    "P1": (1, "opchain", 500),
    "P2-flows-500": (2, "opchain", 500),
    "P2-flows-7": (2, "opchain", 7),
    "P2-serial": (2, "serial", 500),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, EmbeddedServer]]:
    started = {
        name: EmbeddedServer(tmp_path_factory.mktemp(name), partitions=p, executor=e, interval_size=n)
        for name, (p, e, n) in SERVERS.items()
    }
    try:
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(lambda s: s.start(), started.values()))
        yield started
    finally:
        for srv in started.values():
            srv.close()


def model(
    batches: list[list[tuple[int, int]]], each_row: bool = False
) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """The dataflow one batch (FOR EACH ROW: one row) at a time: `items` rows and (n, s) of `totals`."""
    items: dict[int, int] = {}
    n = s = 0
    for rows in [[r] for b in batches for r in b] if each_row else batches:
        for k, v in rows:
            items[k] = items.get(k, 0) + v
        if min(v for _, v in rows) < 0:
            continue  # tally_up aborts: its TE (and what it would trigger) is undone
        n += len(rows)
        s += sum(v for _, v in rows)
        for k in {k for k, v in rows if v % 7 == 0}:
            items.pop(k, None)
    return sorted(items.items()), (n, s)


def table(rows: list[tuple[int, int]]) -> pa.Table:
    return pa.table({"k": pa.array([k for k, _ in rows], pa.int64()), "v": pa.array([v for _, v in rows], pa.int64())})


def run(
    srv: EmbeddedServer, batches: list[list[tuple[int, int]]], script: str = SCRIPT
) -> tuple[list[tuple], list, list]:
    """Deploys afresh, pushes the batches pipelined, re-sends them all; acks, re-send acks and tables."""
    with Client(srv.target, max_in_flight=256, producer_id="flows") as c:
        drop_all(c)
        c.deploy(script)
        c.call("setup")
        acks = [f.result() for f in [c.push("inp", table(b), batch_id=i) for i, b in enumerate(batches, 1)]]
        again = [f.result() for f in [c.push("inp", table(b), batch_id=i) for i, b in enumerate(batches, 1)]]
        items = c.query("SELECT k, v FROM items ORDER BY k").fetchall()
        totals = c.query("SELECT n, s FROM totals").fetchall()
        counters = c.status()["counters"]
    for first, second in zip(acks, again, strict=True):
        assert second.outcome == "duplicate" and second.original == first.outcome, (first, second)
    return [(a.outcome, a.code, a.reason) for a in acks], items, [*totals, counters]


# keys 0..15 fall on both partitions; a batch is one row, or rows of one key (one partition: it may join a flow)
rows = st.tuples(st.integers(0, 15), st.integers(-3, 40))
batch = st.one_of(
    rows.map(lambda r: [r]),
    st.tuples(st.integers(0, 15), st.lists(st.integers(0, 40), min_size=2, max_size=3)).map(
        lambda kv: [(kv[0], v) for v in kv[1]]
    ),
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(batch, min_size=1, max_size=90))
def test_flows_give_the_outcomes_and_tables_of_one_partition(servers, batches):
    items, totals = model(batches)
    results = {name: run(srv, batches) for name, srv in servers.items()}
    for name, (acks, got_items, (got_totals, _)) in results.items():
        assert got_items == items, name
        assert got_totals == totals, name
        assert acks == results["P1"][0], name


def test_flows_are_taken_and_cut_where_the_dataflow_leaves_home(servers):
    """Many 1-row batches: most run in flows; the wipes and aborts cut them, and the rest still runs in flows."""
    batches = [[(i % 13, (i * 5) % 23 - 1)] for i in range(400)]
    items, totals = model(batches)
    p1_acks = run(servers["P1"], batches)[0]
    for name in ("P2-flows-500", "P2-flows-7"):
        acks, got_items, (got_totals, counters) = run(servers[name], batches)
        assert (acks, got_items, got_totals) == (p1_acks, items, totals), name
        assert counters.get("flows", 0) > 10, counters
        assert counters.get("flows_cut", 0) > 0, counters
    assert sum(1 for _, _, reason in p1_acks if "negative value" in reason) > 0


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(rows, min_size=1, max_size=4), min_size=1, max_size=60))
def test_for_each_row_flows_give_the_outcomes_and_tables_of_one_partition(servers, batches):
    """Rows of any keys: a batch's rows run in its flow on both partitions, one at a time."""
    items, totals = model(batches, each_row=True)
    results = {name: run(srv, batches, EACH_ROW) for name, srv in servers.items()}
    for name, (acks, got_items, (got_totals, _)) in results.items():
        assert got_items == items, name
        assert got_totals == totals, name
        assert acks == results["P1"][0], name


def test_for_each_row_batches_spanning_partitions_run_in_flows(servers):
    batches = [[((i * 3 + r) % 16, (i * 5 + r) % 23 - 1) for r in range(3)] for i in range(200)]
    items, totals = model(batches, each_row=True)
    p1_acks = run(servers["P1"], batches, EACH_ROW)[0]
    acks, got_items, (got_totals, counters) = run(servers["P2-flows-500"], batches, EACH_ROW)
    assert (acks, got_items, got_totals) == (p1_acks, items, totals)
    assert counters.get("flow_batches", 0) > 100, counters
    assert counters.get("flows_cut", 0) > 0, counters


@pytest.mark.parametrize("script", [SCRIPT, EACH_ROW], ids=["batch", "each-row"])
def test_a_packed_message_is_sequenced_at_once_and_runs_as_its_batches_would(servers, script):
    """Every batch of one PushStream message goes as a run (`push_runs`): at P = 2 each batch joins a flow
    or runs alone exactly as if sent by itself, so acks and tables equal P = 1's and the model's."""
    batches = [[(i % 13, (i * 5) % 23 - 1)] if i % 4 else [(i % 16, i % 9), ((i + 5) % 16, i % 7)] for i in range(60)]
    rows_of = [r for b in batches for r in b]
    message = pb.PushRequest(
        stream="inp",
        producer_id="packed",
        batch_id=1,
        data=pb.RowData(arrow_ipc=table_to_ipc(table(rows_of))),
        batch_rows=[len(b) for b in batches],
    )
    items, totals = model(batches, each_row=script == EACH_ROW)
    seen = {}
    for name, srv in servers.items():
        with Client(srv.target) as c:
            drop_all(c)
            c.deploy(script)
            c.call("setup")
            before = c.status()["counters"].get("push_runs", 0)
            with grpc.insecure_channel(srv.target) as channel:
                acks = expand(list(pb_grpc.StreamTxStub(channel).PushStream(iter([message]), timeout=120)))
            assert c.query("SELECT k, v FROM items ORDER BY k").fetchall() == items, name
            assert c.query("SELECT n, s FROM totals").fetchall() == [totals], name
            runs = c.status()["counters"].get("push_runs", 0) - before
        assert [b for b, *_ in acks] == list(range(1, 61)), name
        seen[name] = [(o, orig) for _, o, orig, _ in acks]
        assert runs == (0 if SERVERS[name][1] == "serial" else 1), (name, runs)
    assert all(outcomes == seen["P1"] for outcomes in seen.values()), seen
