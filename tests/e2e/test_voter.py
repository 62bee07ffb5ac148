"""The voter application on a real server equals the plain sequential reference.

Randomized (hypothesis): vote streams with invalid contestants, repeat voters,
deletions mid-stream, re-sent batches, and batches pushed out of order by
several producers. The reference takes the committed batches in the order the
server took them (their timestamps) and must end in exactly the server's
tables, with exactly the server's rejections and deletions.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import pyarrow as pa
import pytest
from conftest import PARTITION_COUNTS, drop_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtx.client import AsyncClient, Client
from streamtx.procedures.voter import client_ordered
from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params
from streamtx.procedures.voter.reference import SERVER_QUERIES, VoterReference
from streamtx.server.embedded import EmbeddedServer

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", params=PARTITION_COUNTS, ids=[f"P{p}" for p in PARTITION_COUNTS])
def voter_server(request, tmp_path_factory):
    with EmbeddedServer(
        tmp_path_factory.mktemp("voter"), partitions=request.param, extra_args=["--order-timeout", "30"]
    ) as srv:
        yield srv


def fresh_app(target: str, config: VoterConfig, mode: str = "dataflow") -> None:
    """Drops whatever the server holds, then deploys and sets up the voter."""
    with Client(target) as c:
        drop_all(c)
        c.deploy(deploy_script(config, mode))
        c.call("setup", **setup_params(config))


def rows_of(table: pa.Table) -> list[tuple[int, int, int]]:
    return list(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


def assert_matches(target: str, ref: VoterReference, streams: bool = True) -> None:
    expected = ref.tables()
    with Client(target) as c:
        for name, sql in SERVER_QUERIES.items():
            assert c.query(sql).fetchall() == expected[name], name
        if not streams:
            return
        rejected = c.query("SELECT vote_id, reason FROM rejected_votes ORDER BY vote_id").fetchall()
        deletions = c.query("SELECT contestant_number, removed_votes FROM deletions ORDER BY __ts").fetchall()
    assert rejected == sorted(ref.rejected)
    assert deletions == ref.deletions


configs = st.builds(
    VoterConfig,
    contestants=st.integers(2, 7),
    max_votes=st.integers(1, 3),
    delete_every=st.integers(15, 120),
    window=st.integers(4, 25),
    slide=st.integers(1, 4),
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    config=configs,
    votes=st.integers(20, 160),
    batch_size=st.integers(2, 40),
    phones=st.integers(5, 200),
    seed=st.integers(0, 2**16),
)
def test_pipelined_votes_match_reference(voter_server, config, votes, batch_size, phones, seed):
    fresh_app(voter_server.target, config)
    table = generate_votes(votes, seed=seed, contestants=config.contestants, phones=phones, invalid_share=0.1)
    batches = [table.slice(i, batch_size) for i in range(0, votes, batch_size)]
    ref = VoterReference(config)
    with Client(voter_server.target, max_in_flight=16) as c:
        results = [f.result() for f in [c.push("votes_in", b) for b in batches]]
    assert all(r.outcome == "committed" for r in results), [r.reason for r in results if not r.ok]
    for batch in batches:
        ref.process_batch(rows_of(batch))
    assert_matches(voter_server.target, ref)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    config=configs,
    producers=st.integers(2, 4),
    batches_each=st.integers(1, 8),
    batch_size=st.integers(1, 20),
    resend_share=st.floats(0, 0.5),
    seed=st.integers(0, 2**16),
)
def test_producers_out_of_order_with_resends_match_reference(
    voter_server, config, producers, batches_each, batch_size, resend_share, seed
):
    """Each producer sends its batches in a shuffled order, concurrently, and re-sends some."""
    fresh_app(voter_server.target, config)
    rnd = random.Random(seed)
    plan: dict[str, list[pa.Table]] = {}
    for p in range(producers):
        votes = generate_votes(
            batches_each * batch_size,
            seed=seed + p,
            contestants=config.contestants,
            phones=40,
            invalid_share=0.1,
            first_id=1 + p * 1_000_000,
        )
        plan[f"producer-{p}-{seed}-{uuid.uuid4()}"] = [
            votes.slice(i * batch_size, batch_size) for i in range(batches_each)
        ]

    async def run_producer(name: str, batches: list[pa.Table]) -> list:
        order = list(range(1, len(batches) + 1))
        rnd.shuffle(order)
        resend = [b for b in order if rnd.random() < resend_share]
        async with AsyncClient(voter_server.target, producer_id=name) as c:
            first = await asyncio.gather(*(c.push_one("votes_in", batches[b - 1], batch_id=b) for b in order))
            again = await asyncio.gather(*(c.push_one("votes_in", batches[b - 1], batch_id=b) for b in resend))
        return [(name, r, batches[r.batch_id - 1]) for r in first] + [(name, r, None) for r in again]

    async def run_all() -> list:
        done = await asyncio.gather(*(run_producer(n, b) for n, b in plan.items()))
        return [x for xs in done for x in xs]

    outcomes = asyncio.run(run_all())
    committed = [(r.timestamp, rows) for _, r, rows in outcomes if rows is not None]
    assert all(r.outcome == "committed" for _, r, rows in outcomes if rows is not None)
    assert all(r.outcome == "duplicate" and r.original == "committed" for _, r, rows in outcomes if rows is None)
    ref = VoterReference(config)
    for _, rows in sorted(committed, key=lambda x: x[0]):
        ref.process_batch(rows_of(rows))
    assert_matches(voter_server.target, ref)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=configs, votes=st.integers(20, 120), batch_size=st.integers(1, 30), seed=st.integers(0, 2**16))
def test_client_ordered_mode_matches_reference(voter_server, config, votes, batch_size, seed):
    """The H-Store way (client calls the three steps in order) reaches the same state."""
    config = VoterConfig(config.contestants, config.max_votes, config.delete_every, config.window, slide=1)
    fresh_app(voter_server.target, config, mode="client_ordered")
    table = generate_votes(votes, seed=seed, contestants=config.contestants, phones=30, invalid_share=0.1)
    ref = VoterReference(config)
    with Client(voter_server.target) as c:
        for i in range(0, votes, batch_size):
            batch = table.slice(i, batch_size)
            client_ordered.process_batch(c, batch)
            ref.process_batch(rows_of(batch))
    assert_matches(voter_server.target, ref, streams=False)
