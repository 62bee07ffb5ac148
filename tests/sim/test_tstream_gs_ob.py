"""GS (grep and sum) and OB (online bidding) on real servers against their sequential references.

One server per (executor, interval size), started once per partition count
(P = 1, then P = 2, where the tables are partitioned and a batch whose keys
span both partitions runs coordinated); each run deploys the workload,
pushes its events pipelined, reads the final table and the output stream,
and drops the workload again, so the next run starts from a fresh table on
the same server. Every run must equal the plain sequential `Reference`, and
serial must equal opchain for the same input.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamtx import errors
from streamtx.client import Client
from streamtx.procedures.tstream import common, gs, ob
from streamtx.server.embedded import EmbeddedServer

pytestmark = pytest.mark.timeout(600)

EXECUTORS = ("serial", "opchain")
INTERVALS = (1, 7, 500)
PARTITIONS = (1, 2)

# What each workload's deploy script creates, in an order DROP accepts.
OBJECTS = {
    "gs": [
        ("PROCEDURE", "grep_sum"),
        ("PROCEDURE", "setup_gs"),
        ("STREAM", "gs_events"),
        ("STREAM", "gs_out"),
        ("TABLE", "gs_records"),
    ],
    "ob": [
        ("PROCEDURE", "trade"),
        ("PROCEDURE", "setup_ob"),
        ("STREAM", "ob_events"),
        ("STREAM", "ob_out"),
        ("TABLE", "ob_items"),
    ],
}


class Servers(dict[tuple[str, int], EmbeddedServer]):
    """The servers of one partition count, by (executor, interval size)."""

    partitions: int


@pytest.fixture(scope="module", params=PARTITIONS, ids=[f"P{p}" for p in PARTITIONS])
def servers(request) -> Iterator[Servers]:
    started = Servers(
        {
            (e, i): EmbeddedServer(executor=e, interval_size=i, partitions=request.param)
            for e in EXECUTORS
            for i in INTERVALS
        }
    )
    started.partitions = request.param
    try:
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(EmbeddedServer.start, started.values()))
        yield started
    finally:
        for srv in started.values():
            srv.close()


def drop(target: str, workload: ModuleType) -> None:
    """Removes what the workload deployed, so that it can be deployed again on the same server."""
    with Client(target) as c:
        try:
            c.deploy("".join(f"DROP {kind} {name};\n" for kind, name in OBJECTS[workload.NAME]))
        except errors.InvalidArgument:  # a failed run left only part of it: drop what exists
            for kind, name in OBJECTS[workload.NAME]:
                with contextlib.suppress(errors.InvalidArgument):
                    c.deploy(f"DROP {kind} {name};")


def run(srv: EmbeddedServer, workload: ModuleType, events: pa.Table, batch_size: int, records: int) -> common.RunResult:
    """common.run_on_server, then drop the workload again (also when the run fails, so later runs start clean)."""
    try:
        return common.run_on_server(workload, srv.target, events, batch_size, records)
    finally:
        with contextlib.suppress(Exception):
            drop(srv.target, workload)


def check_all(
    servers: dict[tuple[str, int], EmbeddedServer],
    workload: ModuleType,
    events: pa.Table,
    batch_size: int,
    records: int,
) -> common.RunResult:
    """Runs `events` on every server (concurrently: they are separate processes), checks that every batch
    committed with no reason, that each equals the reference and that serial equals opchain. Returns the reference."""
    ref = common.run_reference(workload, events, records)
    with ThreadPoolExecutor(len(servers)) as pool:
        futures = {cfg: pool.submit(run, srv, workload, events, batch_size, records) for cfg, srv in servers.items()}
        got = {cfg: f.result() for cfg, f in futures.items()}
    batches = -(-events.num_rows // batch_size)
    for (executor, interval), res in got.items():
        where = (
            f"{workload.NAME} P={servers.partitions} executor={executor} interval={interval} batch_size={batch_size}"
        )
        assert len(res.acks) == batches, where
        bad = [(a.batch_id, a.outcome, a.reason) for a in res.acks if a.outcome != "committed" or a.reason]
        assert bad == [], where
        assert res.tables == ref.tables, where
        assert res.outputs == ref.outputs, where
    for interval in INTERVALS:
        serial, opchain = got[("serial", interval)], got[("opchain", interval)]
        assert (serial.tables, serial.outputs) == (opchain.tables, opchain.outputs), f"interval={interval}"
    return ref


# ---------------------------------------------------------------- randomized
@pytest.mark.parametrize("workload", [gs, ob], ids=["gs", "ob"])
@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    events=st.integers(50, 250),
    records=st.integers(50, 2000),
    theta=st.sampled_from([0.0, 0.6, 0.99]),
    batch_size=st.integers(1, 20),
    mp_ratio=st.sampled_from([0.0, 0.25, 1.0]),
)
@example(seed=7, events=200, records=10, theta=0.99, batch_size=5, mp_ratio=0.25)  # one hot key, few records
@example(seed=11, events=250, records=10, theta=0.99, batch_size=20, mp_ratio=0.25)
@example(seed=5, events=150, records=200, theta=0.6, batch_size=1, mp_ratio=0.25)  # local and coordinated
def test_matches_reference(servers, workload, seed, events, records, theta, batch_size, mp_ratio):
    """At P = 2 the events' keys are placed like WORKLOADS.md says (an `mp_ratio` share spans partitions)."""
    rows = workload.generate(
        events, seed=seed, records=records, theta=theta, partitions=servers.partitions, mp_ratio=mp_ratio
    )
    check_all(servers, workload, rows, batch_size, records)


@pytest.mark.slow
@pytest.mark.parametrize("workload", [gs, ob], ids=["gs", "ob"])
@settings(max_examples=4, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    events=st.integers(800, 1500),
    records=st.sampled_from([10, 100, 10_000]),
    theta=st.sampled_from([0.0, 0.6, 0.99]),
    batch_size=st.integers(20, 300),
)
def test_matches_reference_long(servers, workload, seed, events, records, theta, batch_size):
    """Longer streams, bigger batches, the default 10k records: intervals of many batches and long chains."""
    rows = workload.generate(events, seed=seed, records=records, theta=theta, partitions=servers.partitions)
    check_all(servers, workload, rows, batch_size, records)


# ---------------------------------------------------------------- hand-checked
def gs_rows(spec: list[tuple[bool, list[int], list[int]]]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"event_id": i, "is_read": r, "keys": k, "vals": v} for i, (r, k, v) in enumerate(spec)], schema=gs.SCHEMA
    )


def ob_rows(spec: list[tuple[str, list[int], list[int], list[int]]]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"event_id": i, "kind": kd, "keys": k, "prices": p, "quantities": q} for i, (kd, k, p, q) in enumerate(spec)],
        schema=ob.SCHEMA,
    )


@pytest.mark.parametrize("batch_size", [1, 3, 100])
def test_gs_reads_see_earlier_writes(servers, batch_size):
    records = 12
    rows = gs_rows(
        [
            (True, list(range(10)), []),
            (False, [0, 1, 2], [100, 200, 300]),
            (True, [0, 1, 2, 3], []),
            (False, [3], [-5]),
            (True, [3, 11], []),
            (False, [11, 0], [0, 7]),
            (True, [0, 11, 1], []),
        ]
    )
    ref = check_all(servers, gs, rows, batch_size, records)
    assert ref.outputs == {"gs_out": [(0, 45), (2, 603), (4, 6), (6, 207)]}
    values = dict(enumerate(range(records))) | {0: 7, 1: 200, 2: 300, 3: -5, 11: 0}
    assert ref.tables == {"gs_records": [(k, v, gs.PAD) for k, v in sorted(values.items())]}


@pytest.mark.parametrize("batch_size", [1, 4, 100])
def test_ob_bids_fail_mid_chain_on_a_hot_item(servers, batch_size):
    """A long chain of operations on item 2 (price 102, quantity 100) where bids fail between successes."""
    records = 5
    spec = [
        ("bid", [2], [110], [30]),  # ok: 70 left
        ("bid", [2], [110], [30]),  # ok: 40
        ("bid", [2], [101], [1]),  # price too low
        ("bid", [2], [110], [30]),  # ok: 10
        ("bid", [2], [110], [30]),  # not enough left
        ("bid", [2], [110], [10]),  # ok: 0
        ("bid", [2], [200], [1]),  # sold out
        ("top", [2, 0], [], [5, 1]),  # 5 left; item 0 has 101
        ("bid", [2], [110], [6]),  # not enough left
        ("bid", [2], [110], [5]),  # ok: 0
        ("alter", [2, 4], [150, 1], []),
        ("bid", [2], [110], [0]),  # the new price is too high
        ("top", [2], [], [50]),  # 50 left
        ("bid", [2], [150], [20]),  # ok: 30
        ("bid", [4], [1], [100]),  # ok: item 4 sold out
        ("bid", [2], [149], [1]),  # price too low
        ("bid", [2], [150], [31]),  # not enough left
        ("bid", [2], [150], [30]),  # ok: 0
        ("bid", [2], [150], [1]),  # sold out
    ]
    ref = check_all(servers, ob, ob_rows(spec), batch_size, records)
    ok = [True, True, False, True, False, True, False, True, False, True, True]
    ok += [False, True, True, True, False, False, True, False]
    assert ref.outputs == {"ob_out": [(i, s[0], o) for i, (s, o) in enumerate(zip(spec, ok, strict=True))]}
    assert ref.tables == {"ob_items": [(0, 100, 101), (1, 101, 100), (2, 150, 0), (3, 103, 100), (4, 1, 0)]}


# ---------------------------------------------------------------- generators
def test_generators_are_deterministic_and_shaped():
    a, b = gs.generate(200, seed=3, records=100), gs.generate(200, seed=3, records=100)
    assert a.equals(b) and not a.equals(gs.generate(200, seed=4, records=100))
    for row in a.to_pylist():
        assert len(set(row["keys"])) == 10 and all(0 <= k < 100 for k in row["keys"])
        assert len(row["vals"]) == (0 if row["is_read"] else 10)
    assert 0.35 < sum(a.column("is_read").to_pylist()) / 200 < 0.65

    o = ob.generate(800, seed=3, records=100)
    assert o.equals(ob.generate(800, seed=3, records=100))
    kinds = o.column("kind").to_pylist()
    assert 0.65 < kinds.count("bid") / 800 < 0.85 and kinds.count("alter") > 50 and kinds.count("top") > 50
    for row in o.to_pylist():
        n = 1 if row["kind"] == "bid" else 20
        assert len(set(row["keys"])) == n and all(0 <= k < 100 for k in row["keys"])
        assert len(row["prices"]) == (0 if row["kind"] == "top" else n)
        assert len(row["quantities"]) == (0 if row["kind"] == "alter" else n)
    # with 10 records, alter and top touch all of them
    small = ob.generate(100, seed=1, records=10, theta=0.99).to_pylist()
    assert all(sorted(r["keys"]) == list(range(10)) for r in small if r["kind"] != "bid")
    # every outcome happens: successful and rejected bids
    ref = ob.Reference(100)
    ref.process(o.to_pylist())
    bids = [okay for _, kind, okay in ref.outputs()["ob_out"] if kind == "bid"]
    assert 0.1 < sum(bids) / len(bids) < 0.9


def test_ob_one_hot_key_runs_out():
    """The one-hot-key example of test_matches_reference has bids failing on the quantity between successes."""
    ref = ob.Reference(10)
    reasons = []
    for row in ob.generate(400, seed=11, records=10, theta=0.99).to_pylist():
        k = row["keys"][0]
        if row["kind"] == "bid":
            if row["prices"][0] < ref.price[k]:
                reasons.append("price")
            else:
                reasons.append("ok" if ref.quantity[k] >= row["quantities"][0] else "quantity")
        ref.process([row])
    assert reasons.count("quantity") >= 5 and "ok" in reasons[reasons.index("quantity") :]
