"""SL (streaming ledger) and TP (toll processing) on real servers equal their sequential references.

Every run goes to six module-scoped servers at once — executor serial and
opchain, punctuation interval 1, 7 and 500 — each freshly redeployed, first
with one partition, then with two (partitioned tables; a batch whose keys span
both runs coordinated, by replicated execution over the rows the partitions
exchange); the final tables and output streams must equal the reference's,
serial and opchain must agree with each other, and every batch must be
acknowledged committed with no reason (a rejected transfer is an event-level
outcome, not an abort).
The state procedures are also run in-process (pre_process, `apply_event`,
post_process) against the references, cheaply, over many more inputs.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest
from conftest import drop_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtx.client import Client
from streamtx.procedure import Event
from streamtx.procedures.tstream import common, sl, tp
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.partition.opchain import WorkingSet, apply_event

pytestmark = pytest.mark.timeout(600)

CONFIGS = [(executor, interval) for interval in (1, 7, 500) for executor in ("serial", "opchain")]
PARTITIONS = (1, 2)
Config = tuple[str, int]


class Targets(dict[Config, str]):
    """The servers of one partition count: (executor, interval size) -> target."""

    partitions: int


@pytest.fixture(scope="module", params=PARTITIONS, ids=[f"P{p}" for p in PARTITIONS])
def servers(request, tmp_path_factory) -> Targets:
    """One server per (executor, interval size), started together; yields their targets."""
    n_parts = request.param
    srvs = {
        (ex, n): EmbeddedServer(
            tmp_path_factory.mktemp(f"{ex}-{n}-p{n_parts}"), executor=ex, interval_size=n, partitions=n_parts
        )
        for ex, n in CONFIGS
    }
    with ThreadPoolExecutor(len(srvs)) as pool:
        try:
            list(pool.map(EmbeddedServer.start, srvs.values()))
            targets = Targets({cfg: s.target for cfg, s in srvs.items()})
            targets.partitions = n_parts
            yield targets
        finally:
            list(pool.map(EmbeddedServer.close, srvs.values()))


def run_everywhere(
    servers: dict[Config, str], workload: ModuleType, events: pa.Table, batch_size: int, records: int
) -> dict[Config, common.RunResult]:
    def one(cfg: Config) -> common.RunResult:
        with Client(servers[cfg]) as c:
            drop_all(c)
        return common.run_on_server(workload, servers[cfg], events, batch_size, records)

    with ThreadPoolExecutor(len(servers)) as pool:
        return dict(zip(servers, pool.map(one, servers), strict=True))


def check(
    servers: dict[Config, str], workload: ModuleType, events: pa.Table, batch_size: int, records: int
) -> common.RunResult:
    """Runs on every server; asserts acks, reference equality, serial == opchain. Returns the reference."""
    expected = common.run_reference(workload, events, records)
    results = run_everywhere(servers, workload, events, batch_size, records)
    batches = -(-events.num_rows // batch_size)
    for config, got in results.items():
        cfg = (*config, f"P={servers.partitions}")
        assert len(got.acks) == batches, cfg
        bad = [(a.batch_id, a.outcome, a.reason) for a in got.acks if a.outcome != "committed" or a.reason]
        assert not bad, (cfg, bad[:5])
        for name, rows in expected.tables.items():
            assert got.tables[name] == rows, (cfg, name)
        for name, rows in expected.outputs.items():
            assert got.outputs[name] == rows, (cfg, name)
    for _, interval in CONFIGS:
        serial, opchain = results[("serial", interval)], results[("opchain", interval)]
        assert (serial.tables, serial.outputs) == (opchain.tables, opchain.outputs), interval
    return expected


COLUMNS = {
    "accounts": ["id", "balance"],
    "assets": ["id", "balance"],
    "tp_speed": ["segment", "avg_speed", "reports"],
    "tp_vehicles": ["segment", "vehicles", "cnt"],
}


def in_process(workload: ModuleType, procedure: Any, events: pa.Table, records: int, batch_size: int) -> Any:
    """The state procedure without a server: one working set, batches in order, like opchain's interval."""
    ws = WorkingSet()
    setup = workload.Reference(records).tables()  # the set-up state, as rows
    for table, rows in setup.items():
        cols = COLUMNS[table]
        ws.load(table, {r[0]: dict(zip(cols, r, strict=True)) for r in rows})
    out: dict[str, list[tuple[Any, ...]]] = {s: [] for s in workload.OUTPUT_STREAMS}
    rows = events.to_pylist()
    for i in range(0, len(rows), batch_size):
        batch = [Event(r, i) for r in rows[i : i + batch_size]]
        for ev in batch:
            procedure.pre_process(ev)
        for ev in batch:
            apply_event(ev, ws)
        for ev in batch:
            procedure.post_process(ev)
            for stream, row in ev.out:
                out[stream].append(tuple(row.values()))
            assert not ev.rejected or ev.reason.startswith("condition failed"), ev.reason
    tables = {t: sorted(tuple(r.values()) for r in ws.rows[t].values()) for t in setup}
    return tables, {s: sorted(v) for s, v in out.items()}


# ----------------------------------------------------------------- in-process, many inputs
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    events=st.integers(1, 300),
    records=st.integers(1, 30),
    theta=st.sampled_from([0.0, 0.6, 0.99]),
    batch_size=st.integers(1, 50),
    transfer_max=st.sampled_from([100, 1000, 3000]),
    transfer_ratio=st.sampled_from([0.5, 0.9]),
)
def test_sl_procedure_in_process_equals_reference(
    seed, events, records, theta, batch_size, transfer_max, transfer_ratio
):
    ev = sl.generate(
        events, seed=seed, records=records, theta=theta, transfer_max=transfer_max, transfer_ratio=transfer_ratio
    )
    ref = common.run_reference(sl, ev, records)
    assert in_process(sl, sl.ledger, ev, records, batch_size) == (ref.tables, ref.outputs)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    events=st.integers(1, 400),
    records=st.integers(1, 30),
    theta=st.sampled_from([0.0, 0.2, 0.99]),
    batch_size=st.integers(1, 50),
    vehicles=st.integers(1, 300),
)
def test_tp_procedure_in_process_equals_reference(seed, events, records, theta, batch_size, vehicles):
    ev = tp.generate(events, seed=seed, records=records, theta=theta, vehicles=vehicles)
    ref = common.run_reference(tp, ev, records)
    assert in_process(tp, tp.toll_processing, ev, records, batch_size) == (ref.tables, ref.outputs)


def test_sl_rules():
    """Source == destination nets to zero but needs the balance; a failed transfer changes nothing."""
    ref = sl.Reference(2)
    b = sl.INITIAL_BALANCE

    def row(i: int, kind: str, sa: int, ss: int, da: int, ds: int, amount: int) -> dict[str, Any]:
        keys = ("src_account", "src_asset", "dst_account", "dst_asset")
        return {"event_id": i, "kind": kind, **dict(zip(keys, (sa, ss, da, ds), strict=True)), "amount": amount}

    ref.process(
        [
            row(0, "transfer", 0, 0, 0, 0, b),  # all equal, exactly the balance: ok, no change
            row(1, "transfer", 0, 1, 0, 1, b + 1),  # one more than the balance: refused
            row(2, "transfer", 0, 0, 1, 1, 10),
            row(3, "deposit", 1, 0, 0, 1, 5),  # deposits ignore dst_*
            row(4, "transfer", 0, 1, 1, 0, b),  # account 0 has b - 10: refused, asset 1 alone would do
        ]
    )
    assert ref.tables() == {"accounts": [(0, b - 10), (1, b + 15)], "assets": [(0, b - 5), (1, b + 10)]}
    assert ref.outputs() == {"sl_results": [(0, True), (1, False), (2, True), (3, True), (4, False)]}


def test_tp_rules():
    assert tp.with_vehicle([1, 5], 3) == [1, 3, 5] and tp.with_vehicle([1, 5], 5) == [1, 5]
    assert tp.toll(39.9, 51) == 2 and tp.toll(40.0, 100) == 0 and tp.toll(10.0, 50) == 0
    assert tp.toll(0.0, 60) == 200
    ref = tp.Reference(1)
    ref.process(
        [
            {"event_id": i, "vehicle": v, "segment": 0, "speed": s}
            for i, (v, s) in enumerate([(7, 30.5), (3, 10.25), (7, 0.1)])
        ]
    )
    avg = 0.0 + (30.5 - 0.0) / 1
    avg = avg + (10.25 - avg) / 2
    avg = avg + (0.1 - avg) / 3
    assert ref.tables() == {"tp_speed": [(0, avg, 3)], "tp_vehicles": [(0, [3, 7], 2)]}


def test_generators_are_seeded_and_shaped():
    for w, kw in ((sl, {}), (tp, {})):
        a, b = w.generate(200, seed=5, records=50, **kw), w.generate(200, seed=5, records=50, **kw)
        assert a.equals(b) and not a.equals(w.generate(200, seed=6, records=50, **kw))
        assert a.column("event_id").to_pylist() == list(range(200))
    ev = sl.generate(2000, seed=1, records=100)
    kinds = ev.column("kind").to_pylist()
    assert 0.4 < kinds.count("transfer") / len(kinds) < 0.6 and set(kinds) == {"deposit", "transfer"}
    segs = tp.generate(5000, seed=1).column("segment").to_pylist()
    assert set(segs) <= set(range(tp.SEGMENTS)) and len(set(segs)) > 90


# ----------------------------------------------------------------- real servers
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    events=st.integers(50, 400),
    records=st.integers(10, 2000),
    theta=st.sampled_from([0.0, 0.6, 0.99]),
    batch_size=st.integers(1, 20),
    transfer_max=st.sampled_from([100, 3000]),
    mp_ratio=st.sampled_from([0.0, 0.25, 1.0]),
)
def test_sl_on_servers_equals_reference(servers, seed, events, records, theta, batch_size, transfer_max, mp_ratio):
    ev = sl.generate(
        events,
        seed=seed,
        records=records,
        theta=theta,
        transfer_max=transfer_max,
        partitions=servers.partitions,
        mp_ratio=mp_ratio,
    )
    check(servers, sl, ev, batch_size, records)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    events=st.integers(50, 400),
    records=st.integers(10, 2000),
    theta=st.sampled_from([0.0, 0.6, 0.99]),
    batch_size=st.integers(1, 20),
    vehicles=st.integers(20, 300),
)
def test_tp_on_servers_equals_reference(servers, seed, events, records, theta, batch_size, vehicles):
    ev = tp.generate(events, seed=seed, records=records, theta=theta, vehicles=vehicles)
    check(servers, tp, ev, batch_size, records)


def chain_aborts(ev: pa.Table, ok: dict[int, bool], span: int) -> int:
    """Refused transfers with a successful access to their source account both just before and just after."""
    rows = ev.to_pylist()
    touched: dict[int, list[int]] = {}
    for r in rows:
        if ok[r["event_id"]]:
            for k in {r["src_account"], r["dst_account"]} if r["kind"] == "transfer" else {r["src_account"]}:
                touched.setdefault(k, []).append(r["event_id"])
    count = 0
    for r in rows:
        i = r["event_id"]
        if not ok[i]:
            near = touched.get(r["src_account"], [])
            count += any(i - span < j < i for j in near) and any(i < j < i + span for j in near)
    return count


@pytest.mark.parametrize("batch_size", [20, 2])
def test_sl_dependency_heavy_transfers(servers, batch_size):
    """Few hot keys, mostly transfers, amounts up to 3x the starting balance: many fail mid-chain.

    At P = 2 half the transfers move between the partitions (the hottest keys sit on both).
    """
    ev = sl.generate(
        400,
        seed=11,
        records=10,
        theta=0.99,
        transfer_ratio=0.8,
        transfer_max=3 * sl.INITIAL_BALANCE,
        partitions=servers.partitions,
        mp_ratio=0.5,
    )
    expected = check(servers, sl, ev, batch_size, 10)
    ok = dict(expected.outputs["sl_results"])
    transfers = [r["event_id"] for r in ev.to_pylist() if r["kind"] == "transfer"]
    refused = sum(not ok[i] for i in transfers)
    assert 0.2 * len(transfers) < refused < 0.9 * len(transfers)
    assert chain_aborts(ev, ok, 20) > 20  # aborts inside a batch of 20 / an interval, between successes


@pytest.mark.parametrize("workload", [sl, tp], ids=["sl", "tp"])
def test_one_hot_key(servers, workload):
    """A single key (every SL transfer has source == destination), then zipf 0.99 over 2000 keys."""
    extra = {"transfer_max": 2 * sl.INITIAL_BALANCE} if workload is sl else {"vehicles": 1000}
    for events, records, seed, batch_size in ((300, 1, 3, 9), (800, 2000, 4, 13)):
        ev = workload.generate(events, seed=seed, records=records, theta=0.99, partitions=servers.partitions, **extra)
        expected = check(servers, workload, ev, batch_size, records)
        if workload is sl:  # some transfers refused, some not
            assert len({ok for _, ok in expected.outputs["sl_results"]}) == 2
        else:  # the hot segment is congested: tolls
            assert sum(t > 0 for *_, t in expected.outputs["tp_tolls"]) > 20


@pytest.mark.slow
@pytest.mark.parametrize("workload", [sl, tp], ids=["sl", "tp"])
def test_default_sizes(servers, workload):
    """The paper's sizes (10k records for SL, 100 segments for TP, default skew), 3000 events in batches of 50."""
    records = 10_000 if workload is sl else tp.SEGMENTS
    check(
        servers, workload, workload.generate(3000, seed=7, records=records, partitions=servers.partitions), 50, records
    )
