"""Migrations do not change what the voter computes: random bin moves while votes flow, checked by oracle.

The voter at P = 2 (state procedures on the opchain executor, whose rows live
in the working set between intervals, and the SQL dataflow) takes random votes
cut into random batches, pipelined, while random migrations (random bin
ranges, either partition, every strategy) are issued between them: the sequencer
orders each step among the batches in flight. Every table, rejection and
deletion must equal the oracle's, which knows nothing of partitions, and every
vote id must be stored once, on the partition its phone's bin names.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pytest
from conftest import drop_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.voter_oracle import Oracle, assert_matches, phone, vote_batch, voter_configs, votes_strategy

from streamtx.client import Client
from streamtx.procedures.voter import state
from streamtx.procedures.voter.app import VoterConfig, deploy_script, setup_params
from streamtx.procedures.voter.reference import SERVER_QUERIES
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.partitioning import PartitionMap, key_hashes

pytestmark = pytest.mark.timeout(900)

VARIANTS = {"dataflow": SERVER_QUERIES, "state": state.QUERIES}
BINS = 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("moving"), partitions=2) as srv:
        yield srv


def migrations(n_batches: int) -> st.SearchStrategy[list[tuple[int, list[tuple[int, int, int]], str, int]]]:
    """(after batch i, moves, strategy, bins per step): each a few bin ranges to either partition."""
    move = st.tuples(st.integers(0, BINS - 1), st.integers(0, 80), st.integers(0, 1)).map(
        lambda m: (m[0], min(m[0] + m[1], BINS - 1), m[2])
    )
    one = st.tuples(
        st.integers(0, n_batches),
        st.lists(move, min_size=1, max_size=3),
        st.sampled_from(["all-at-once", "fluid", "batched"]),
        st.integers(1, 40),
    )
    return st.lists(one, min_size=1, max_size=3)


def run(target: str, config: VoterConfig, variant: str, batches: list, planned: list) -> None:
    """Pushes the batches (pipelined) with the planned migrations between them; checks the oracle's tables."""
    oracle = Oracle(config)
    for batch in batches:
        for v in batch:
            oracle.vote(*v)
    with Client(target, max_in_flight=64) as c:
        drop_all(c)
        c.deploy(deploy_script(config, variant))
        c.call("setup", **setup_params(config))
        futures = []
        for i, batch in enumerate([*batches, None]):
            for _, moves, strategy, per_step in [m for m in planned if m[0] == i]:
                steps = list(c.rebalance(moves, strategy=strategy, bins_per_step=per_step))
                assert steps[-1]["step"] == steps[-1]["steps"]
            if batch is not None:
                futures.append(c.push("votes_in", vote_batch(batch)))
        assert_matches(c, oracle, VARIANTS[variant], futures)
        status = c.status()
        stored = [status["counters"].get(f"partition{p}.rows.votes", 0) for p in (0, 1)]
    placed = Counter(PartitionMap(BINS, tuple(status["bin_owner"])).owners_of([p for p, _, _ in oracle.votes.values()]))
    assert stored == [placed[0], placed[1]]  # each vote once, where its phone's bin lives


def resizes(n_batches: int) -> st.SearchStrategy[list[tuple[int, int, str, int]]]:
    """(after batch i, partitions, strategy, bins per step): grow or shrink among 1-3 partitions (fluid steps
    are batched ones of one bin: hundreds of them here, for nothing the other tests do not cover)."""
    one = st.tuples(
        st.integers(0, n_batches),
        st.integers(1, 3),
        st.sampled_from(["all-at-once", "batched"]),
        st.integers(64, 512),
    )
    return st.lists(one, min_size=1, max_size=3)


def run_resizing(target: str, config: VoterConfig, variant: str, batches: list, planned: list) -> None:
    """`run` with partitions added and retired between the batches; then every batch sent again is a re-send,
    whichever partition took it (retired ones included); the server ends with 2 partitions again."""
    oracle = Oracle(config)
    for batch in batches:
        for v in batch:
            oracle.vote(*v)
    producer = f"resizing-{next(_producers)}"
    with Client(target, max_in_flight=64, producer_id=producer) as c:
        drop_all(c)
        c.deploy(deploy_script(config, variant))
        c.call("setup", **setup_params(config))
        futures = []
        for i, batch in enumerate([*batches, None]):
            for _, partitions, strategy, per_step in [m for m in planned if m[0] == i]:
                steps = list(c.rebalance(partitions=partitions, strategy=strategy, bins_per_step=per_step))
                assert steps[-1]["step"] == steps[-1]["steps"]
                assert len(c.status()["bins_per_partition"]) == partitions
            if batch is not None:
                futures.append(c.push("votes_in", vote_batch(batch), batch_id=i + 1))
        assert_matches(c, oracle, VARIANTS[variant], futures)
        status = c.status()
        partitions = len(status["bins_per_partition"])
        stored = [status["counters"].get(f"partition{p}.rows.votes", 0) for p in range(partitions)]
        again = [c.push("votes_in", vote_batch(b), batch_id=i + 1) for i, b in enumerate(batches)]
        assert [f.result().outcome for f in again] == ["duplicate"] * len(batches)
        list(c.rebalance(partitions=2))
    placed = Counter(PartitionMap(BINS, tuple(status["bin_owner"])).owners_of([p for p, _, _ in oracle.votes.values()]))
    assert stored == [placed[p] for p in range(partitions)]  # each vote once, where its phone's bin lives


_producers = itertools.count()


def drawn_batches(data: st.DataObject) -> tuple[VoterConfig, list[list[tuple[int, int, int]]]]:
    """A random voter and its random votes, cut into random batches."""
    config = data.draw(voter_configs(), label="config")
    votes = data.draw(votes_strategy(config.contestants), label="votes")
    cuts = data.draw(st.lists(st.integers(1, len(votes) - 1), max_size=20), label="cuts")
    bounds = [0, *sorted(set(cuts)), len(votes)]
    return config, [votes[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_phone_whose_bin_moves_away_and_back_is_counted_as_it_is_now(server, variant):
    """Its count of votes was cached where it lived first: when it returns, the count it came back with holds."""
    config = VoterConfig(contestants=3, max_votes=3, delete_every=1000, window=4)
    voter = phone(1)
    at = int(key_hashes(pa.array([voter], pa.int64()))[0] % BINS)
    with Client(server.target) as c:
        home = c.status()["bin_owner"][at]
    votes = [[(i, voter, 1 + i % 3)] for i in range(1, 6)]  # the 4th and 5th are over the limit
    planned = [(i, [(at, at, 1 - home if i % 2 else home)], "all-at-once", 1) for i in range(1, 5)]
    run(server.target, config, variant, votes, planned)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("variant", VARIANTS)
def test_votes_during_random_migrations_end_as_the_oracle(server, variant, data):
    config, batches = drawn_batches(data)
    planned = data.draw(migrations(len(batches)), label="migrations")
    run(server.target, config, variant, batches, planned)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("variant", VARIANTS)
def test_votes_while_partitions_are_added_and_retired_end_as_the_oracle(server, variant, data):
    config, batches = drawn_batches(data)
    planned = data.draw(resizes(len(batches)), label="resizes")
    run_resizing(server.target, config, variant, batches, planned)
