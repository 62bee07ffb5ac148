"""The voter's final tables do not depend on how votes are cut into batches, nor on the partition count.

The oracle (tests/support/voter_oracle.py) is written from WORKLOADS.md section 1
alone (it shares no code with procedures/voter): votes one at a time, in order; each accepted vote
counts, slides the trending window, rewrites the boards, and when the counter
reaches a multiple of `delete_every` the present contestant with the fewest
votes goes, with its votes, which return to their phones. Both ways of running
the voter (the SQL dataflow and the state procedures) must end in exactly its
tables, rejections and deletions, at P = 1 and 2, for random votes (invalid
contestants, repeat phones, unknown area codes, votes for a contestant just
deleted) cut into random batches.
"""

from __future__ import annotations

from collections.abc import Iterator

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

pytestmark = pytest.mark.timeout(600)

VARIANTS = {"dataflow": SERVER_QUERIES, "state": state.QUERIES}


@pytest.fixture(scope="module", params=[1, 2], ids=["P1", "P2"])
def voter_server(request, tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("exact"), partitions=request.param) as srv:
        yield srv


def fresh(c: Client, config: VoterConfig, variant: str) -> None:
    drop_all(c)
    c.deploy(deploy_script(config, variant))
    c.call("setup", **setup_params(config))


def run(target: str, config: VoterConfig, variant: str, votes: list[tuple[int, int, int]], cuts: list[int]) -> Oracle:
    """Pushes `votes` cut at `cuts` (pipelined), and checks every table against the oracle."""
    oracle = Oracle(config)
    for v in votes:
        oracle.vote(*v)
    bounds = [0, *sorted(set(cuts)), len(votes)]
    batches = [votes[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    with Client(target, max_in_flight=64) as c:
        fresh(c, config, variant)
        futures = [c.push("votes_in", vote_batch(b)) for b in batches]
        assert_matches(c, oracle, VARIANTS[variant], futures)
    return oracle


@pytest.mark.parametrize("variant", VARIANTS)
def test_deletion_reaches_every_partition_as_decided(voter_server, variant):
    """3 contestants, delete_every 10: ten 1-vote batches, 5 for contestant 1 then 5 for 2; 3 goes, nobody else."""
    config = VoterConfig(contestants=3, max_votes=1, delete_every=10, window=100)
    votes = [(i, 2_000_000_000 + i, 1 if i <= 5 else 2) for i in range(1, 11)]
    oracle = run(voter_server.target, config, variant, votes, list(range(1, 10)))
    assert oracle.deletions == [(3, 0)] and len(oracle.votes) == 10


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_batch_crossing_a_deletion_takes_its_votes_one_at_a_time(voter_server, variant):
    """One batch of 8: the 4th vote triggers the deletion of contestant 2, the 5th is for 2, the 6th re-uses
    a phone whose vote the deletion returned, and an unknown area code votes too."""
    config = VoterConfig(contestants=3, max_votes=1, delete_every=4, window=10)
    votes = [
        (1, phone(1), 1),
        (2, phone(2), 2),
        (3, phone(3), 1),
        (4, phone(4), 3),  # counter 4: contestant 2 (1 vote, fewest) goes, phone 2 gets its vote back
        (5, phone(5), 2),  # rejected: no such contestant
        (6, phone(2), 3),  # accepted: phone 2 may vote again
        (7, phone(1), 3),  # rejected: vote limit reached
        (8, phone(8, area=777), 1),  # unknown area code: state XX
    ]
    oracle = run(voter_server.target, config, variant, votes, [])
    assert oracle.deletions == [(2, 1)]
    assert oracle.rejected == [(5, "no such contestant"), (7, "vote limit reached")]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("variant", VARIANTS)
def test_any_cut_into_batches_matches_the_oracle(voter_server, variant, data):
    config = data.draw(voter_configs(), label="config")
    votes = data.draw(votes_strategy(config.contestants), label="votes")
    cuts = data.draw(st.lists(st.integers(1, len(votes) - 1), min_size=1, max_size=12), label="cuts")
    run(voter_server.target, config, variant, votes, cuts)
