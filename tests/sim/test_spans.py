"""Spans: queued state batches over several partitions run as one coordinated command (front/spans.py).

The gate's grouping is tested on its own (which requests join a span, which
are sent alone, who gets which answer); then real servers take pipelined
batches of `examples.counters:checked_add` whose keys fall on one partition
or several, with every way a batch can fail inside a span: an event over its
limit (that event rejected), a pre_process or post_process error (the batch
rejected), rows the table's CHECK refuses at the write-back (the span is
undone everywhere and its batches run one by one). Every server (opchain at
P = 2 and 3, intervals 7 and 500, and serial at P = 2) must give, batch for
batch, the outcomes and state of a plain sequential model, and agree on
every reason with the serial executor at P = 1.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtx.client import Client
from streamtx.procedures.examples.counters import EVENTS, reference_add
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.front.gate import Gate
from streamtx.server.partitioning import PartitionMap

pytestmark = pytest.mark.timeout(600)

# ------------------------------------------------------------------------------ the gate


class Recorder:
    """Requests to a gate, and what ran how: alone (`sent`) or in a span (`spans`)."""

    def __init__(self, limit: int) -> None:
        self.sent: list[str] = []
        self.spans: list[list[str]] = []
        self.gate = Gate(self.run_span, limit)
        self.release: asyncio.Event = asyncio.Event()

    async def run_span(self, items: list[str]) -> list[Any]:
        self.spans.append(items)
        await self.release.wait()
        return [ValueError(i) if i.startswith("bad") else f"span:{i}" for i in items]

    def local(self, name: str, item: bool = True) -> asyncio.Future:
        def start() -> asyncio.Future:
            self.sent.append(name)
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(f"local:{name}")
            return fut

        return self.gate.run(start, name if item else None)

    def coordinated(self, name: str, item: bool = True) -> asyncio.Future:
        async def start() -> str:
            self.sent.append(name)
            await self.release.wait()
            return f"alone:{name}"

        return self.gate.run_coordinated(start, name if item else None)


def answered(value: str) -> asyncio.Future:
    """A request that is answered at once with `value`."""
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


def test_a_span_takes_the_state_batches_queued_behind_a_spanning_one():
    async def scenario() -> tuple[Recorder, list[Any]]:
        r = Recorder(limit=3)
        futs = [r.coordinated("c0")]  # the gate is free: a span of one, at once
        futs += [r.local("l1"), r.coordinated("c2"), r.local("l3"), r.coordinated("c4"), r.local("l5")]
        futs += [r.coordinated("c6", item=False), r.coordinated("bad7"), r.local("l8"), r.local("x9", item=False)]
        await asyncio.sleep(0)
        r.release.set()
        results = await asyncio.gather(*futs, return_exceptions=True)
        return r, results

    r, results = asyncio.run(scenario())
    # l1 came first behind the span: sent alone; c2 starts a span of three (limit); l5 is sent alone
    # again; c6 has no item: it runs alone, and ends nothing else; bad7 and l8 form a span; x9 alone
    assert r.spans == [["c0"], ["c2", "l3", "c4"], ["bad7", "l8"]]
    assert r.sent == ["l1", "l5", "c6", "x9"]
    values = [str(v) if isinstance(v, Exception) else v for v in results]
    assert values == [
        "span:c0",
        "local:l1",
        "span:c2",
        "span:l3",
        "span:c4",
        "local:l5",
        "alone:c6",
        "bad7",  # each request gets its own answer, an exception included
        "span:l8",
        "local:x9",
    ]


def test_a_failed_span_fails_each_of_its_requests():
    async def scenario() -> list[Any]:
        async def broken(items: list[str]) -> list[Any]:
            raise RuntimeError("partition 1 died")

        gate = Gate(broken, 10)

        futs = [gate.run_coordinated(lambda: asyncio.sleep(0.01))]  # holds the gate while the rest queue
        futs.append(gate.run_coordinated(lambda: asyncio.sleep(0), "a"))
        futs.append(gate.run(lambda: answered("b"), "b"))
        futs.append(gate.run(lambda: answered("c"), None))
        return await asyncio.gather(*futs, return_exceptions=True)

    results = asyncio.run(scenario())
    assert [type(r).__name__ for r in results[1:3]] == ["RuntimeError", "RuntimeError"]
    assert results[3] == "c"  # not in the span: sent once the gate is free


def test_a_span_takes_in_the_items_that_came_to_the_head_of_the_line():
    """`Span.more` (flows, front/flows.py): items queued meanwhile join, up to the first request without one;
    `Span.answer` answers a request before the span ends."""

    async def scenario() -> tuple[list[Any], list[Any]]:
        seen: list[Any] = []

        async def runner(span: Any) -> list[Any]:
            await asyncio.sleep(0.01)  # b, c, d and e queue meanwhile
            more = span.more(10, str)
            seen.append((list(span), more))
            span.answer("a", "early:a")
            return [f"span:{i}" for i in span]

        gate = Gate(runner, 10)

        futs = [gate.run_coordinated(lambda: asyncio.sleep(0), "a")]
        futs += [gate.run(lambda: answered("local:b"), "b"), gate.run_coordinated(lambda: asyncio.sleep(0), "c")]
        futs += [gate.run(lambda: answered("local:d"), None), gate.run(lambda: answered("local:e"), "e")]
        return seen, await asyncio.gather(*futs)

    seen, results = asyncio.run(scenario())
    assert seen == [(["a", "b", "c"], ["b", "c"])]  # d has no item: it and e wait for the span to end
    assert results == ["early:a", "span:b", "span:c", "local:d", "local:e"]


# ------------------------------------------------------------------------- on servers

CEILING = 1_000  # counters.n must stay below it: the CHECK a write-back may break
SCRIPT = f"""
CREATE TABLE counters (key BIGINT PRIMARY KEY, n BIGINT NOT NULL CHECK (n < {CEILING})) PARTITION BY (key);
CREATE STREAM counter_events (event_id BIGINT, key BIGINT, delta BIGINT, "limit" BIGINT, mirror BIGINT);
CREATE STREAM counter_results (event_id BIGINT, ok BOOLEAN);
CREATE PROCEDURE checked_add ON STREAM counter_events PARTITION ON (key, mirror)
    AS PYTHON 'examples.counters:checked_add';
"""
KEYS = list(range(1, 13))  # spread over the partitions of every server
Row = tuple[int, int, int | None, int, int | None]  # event_id, key, delta, limit, mirror
CONFIGS = {
    "serial P=1": ("serial", 1, 500),
    "serial P=2": ("serial", 2, 500),
    "opchain P=2": ("opchain", 2, 500),
    "opchain P=2 interval 7": ("opchain", 2, 7),
    "opchain P=3": ("opchain", 3, 500),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    srvs = {
        name: EmbeddedServer(tmp_path_factory.mktemp("spans"), executor=ex, partitions=p, interval_size=n)
        for name, (ex, p, n) in CONFIGS.items()
    }
    with ThreadPoolExecutor(len(srvs)) as pool:
        try:
            list(pool.map(EmbeddedServer.start, srvs.values()))
            yield {name: s.target for name, s in srvs.items()}
        finally:
            list(pool.map(EmbeddedServer.close, srvs.values()))


def model(batches: list[list[Row]]) -> tuple[list[str], dict[int, int], list[tuple[int, bool]]]:
    """Each batch's outcome, the counters and the results, running the batches one at a time."""
    counters: dict[int, int] = {}
    results: list[tuple[int, bool]] = []
    outcomes = []
    for batch in batches:
        if any(delta is None or event_id < 0 for event_id, _, delta, _, _ in batch):
            outcomes.append("rejected")  # pre_process or post_process fails: the TE aborts
            continue
        after = dict(counters)
        out = []
        for event_id, key, delta, limit, mirror in batch:
            assert delta is not None
            out.append((event_id, reference_add(after, key, delta, limit, mirror)))
        if any(after[k] >= CEILING for k in after if after[k] != counters.get(k)):
            outcomes.append("rejected")  # the write-back breaks the CHECK: the TE aborts
            continue
        counters = after
        results += out
        outcomes.append("committed")
    return outcomes, counters, sorted(results)


def reset(c: Client) -> None:
    status = c.status()
    drops = [f"DROP {k.upper()} {n};" for k in ("procedure", "stream", "table") for n in status.get(k + "s", [])]
    c.deploy("\n".join(drops) + SCRIPT if drops else SCRIPT)


def run(target: str, batches: list[list[Row]]) -> tuple[list[tuple[str, str]], dict[int, int], list, dict]:
    """Pushes every batch pipelined (so spans form), then reads the state."""
    with Client(target) as c:
        reset(c)
        before = c.status()["counters"]
        tables = [pa.Table.from_pylist([dict(zip(EVENTS.names, r, strict=True)) for r in b], EVENTS) for b in batches]
        futs = [c.push("counter_events", t) for t in tables]
        acks = [(a.outcome, a.reason) for a in (f.result() for f in futs)]
        counters = dict(c.query("SELECT key, n FROM counters").fetchall())
        results = sorted(c.query("SELECT event_id, ok FROM counter_results").fetchall())
        after = c.status()["counters"]
    grew = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in ("spans", "spans_split")}
    return acks, counters, results, grew


def row(draw: Any, event_id: int) -> Row:
    key = draw(st.sampled_from(KEYS))
    mirror = draw(st.one_of(st.none(), st.sampled_from(KEYS).filter(lambda k: k != key)))
    delta = (
        draw(st.one_of(st.integers(1, 200), st.just(None)))
        if draw(st.integers(0, 30)) == 0
        else draw(st.integers(1, 200))
    )
    if draw(st.integers(0, 40)) == 0:
        event_id = -event_id - 1
    limit = draw(st.sampled_from([150, 400, 10**6]))
    return (event_id, key, delta, limit, mirror)


@st.composite
def workloads(draw: Any) -> list[list[Row]]:
    n = draw(st.integers(1, 60))
    batches: list[list[Row]] = []
    event_id = 0
    for _ in range(n):
        size = draw(st.integers(1, 3))
        batches.append([row(draw, event_id + i) for i in range(size)])
        event_id += size
    return batches


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=workloads())
def test_spans_give_what_batches_one_by_one_give(servers, batches):
    outcomes, counters, results = model(batches)
    with ThreadPoolExecutor(len(servers)) as pool:
        got = dict(zip(servers, pool.map(lambda t: run(t, batches), servers.values()), strict=True))
    oracle = got["serial P=1"][0]
    assert [o for o, _ in oracle] == outcomes
    for name, (acks, state, res, grew) in got.items():
        assert acks == oracle, name  # outcomes and reasons, batch for batch
        assert state == counters, name
        assert res == results, name
        executor, partitions, _ = CONFIGS[name]
        if executor == "opchain" and partitions > 1 and any(spanning(b, partitions) for b in batches):
            assert grew["spans"] + grew["spans_split"] >= 1, name


def spanning(batch: list[Row], partitions: int) -> bool:
    keys = [k for _, key, _, _, mirror in batch for k in (key, mirror) if k is not None]
    return len(set(PartitionMap.round_robin(partitions, 1024).owners(pa.array(keys, pa.int64())).tolist())) > 1


def keys_spread(partitions: int) -> tuple[list[int], list[int]]:
    owners = PartitionMap.round_robin(partitions, 1024).owners(pa.array(KEYS, pa.int64())).tolist()
    return [k for k, p in zip(KEYS, owners, strict=True) if p == 0], [
        k for k, p in zip(KEYS, owners, strict=True) if p == 1
    ]


FAILURES = {
    # (the bad batch, whether the span splits: the partitions disagree on it)
    "pre_process": ([(-1, 0, None, 10**6, None)], False),  # fails alike everywhere: rejected within the span
    "post_process": ([(-26, 0, 1, 10**6, None)], True),  # fails on home only (it alone post-processes)
    "check": ([(25, 1, CEILING, 10**6, None)], True),  # only partition 1 writes the row back
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_batch_failing_inside_a_span_is_rejected_alone(servers, failure):
    """Spanning batches queued behind each other; one in the middle fails (its keys local to partition 1).

    The first batch is long (500 events, adding 0), so the others are queued at
    the gate by the time it ends, whatever the machine's speed: batch 25 runs
    inside a span.
    """
    k0, k1 = keys_spread(2)
    batches: list[list[Row]] = [[(i, k0[0], 1, 10**6, k1[0])] for i in range(40)]
    batches[0] = [(1000 + i, k0[0], 0, 10**6, k1[0]) for i in range(500)]
    bad, splits = FAILURES[failure]
    batches[25] = [(e, k1[i], d, limit, m) for e, i, d, limit, m in bad]
    outcomes, counters, results = model(batches)
    assert outcomes.count("rejected") == 1 and outcomes[25] == "rejected"
    acks, state, res, grew = run(servers["opchain P=2"], batches)
    assert [o for o, _ in acks] == outcomes
    assert (state, res) == (counters, results)
    assert grew["spans"] >= 1 and grew["spans_split"] == int(splits), grew
    assert acks == run(servers["serial P=1"], batches)[0]
