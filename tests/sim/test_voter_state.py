"""The voter as state procedures (`deploy_script(mode="state")`) equals the sequential reference.

Under `--executor serial` and `--executor opchain` with punctuation intervals
of 1, 7 and 500 batches: 1-vote and larger batches pushed pipelined, invalid
contestants, phones over their vote limit, trending windows sliding by more
than one vote, and deletions (SQL barriers inside an opchain interval) down to
the last contestant. The final tables, the rejected votes and the deletions
must be exactly `VoterReference`'s for the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from conftest import drop_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.voter_oracle import assert_matches

from streamtx.client import Client
from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params
from streamtx.procedures.voter.reference import VoterReference
from streamtx.procedures.voter.state import QUERIES
from streamtx.server.embedded import EmbeddedServer

pytestmark = pytest.mark.timeout(300)

EXECUTORS = [("serial", None), ("opchain", 1), ("opchain", 7), ("opchain", 500)]


@pytest.fixture(scope="module", params=EXECUTORS, ids=[e if n is None else f"{e}-{n}" for e, n in EXECUTORS])
def state_server(request, tmp_path_factory) -> Iterator[EmbeddedServer]:
    executor, interval = request.param
    with EmbeddedServer(tmp_path_factory.mktemp("voter-state"), executor=executor, interval_size=interval) as srv:
        yield srv


def fresh_app(c: Client, config: VoterConfig) -> None:
    """Drops whatever the server holds, then deploys the state mode and sets it up."""
    drop_all(c)
    c.deploy(deploy_script(config, "state"))
    c.call("setup", **setup_params(config))


def rows_of(table: pa.Table) -> list[tuple[int, int, int]]:
    return list(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


def run_and_compare(target: str, config: VoterConfig, batches: list[pa.Table]) -> VoterReference:
    """Pushes the batches pipelined (one producer), then compares everything with the reference."""
    ref = VoterReference(config)
    for batch in batches:
        ref.process_batch(rows_of(batch))
    with Client(target, max_in_flight=256) as c:
        fresh_app(c, config)
        # an aborted downstream TE (leaderboard, delete_contestant) would show in an ack's `reason`
        assert_matches(c, ref, QUERIES, [c.push("votes_in", b) for b in batches])
    return ref


configs = st.builds(
    VoterConfig,
    contestants=st.integers(2, 7),
    max_votes=st.integers(1, 3),
    delete_every=st.integers(10, 80),
    window=st.integers(3, 25),
    slide=st.integers(1, 4),
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    config=configs,
    votes=st.integers(1, 120),
    batch_size=st.one_of(st.just(1), st.integers(1, 30)),
    phones=st.integers(3, 150),
    invalid_share=st.sampled_from([0.0, 0.1, 0.4]),
    seed=st.integers(0, 2**16),
)
def test_state_mode_matches_reference(state_server, config, votes, batch_size, phones, invalid_share, seed):
    table = generate_votes(votes, seed=seed, contestants=config.contestants, phones=phones, invalid_share=invalid_share)
    batches = [table.slice(i, batch_size) for i in range(0, votes, batch_size)]
    run_and_compare(state_server.target, config, batches)


def test_one_vote_batches_delete_down_to_the_last_contestant(state_server):
    """Deletions every 8 votes in 1-vote batches: barriers mid-interval, until one contestant is left."""
    config = VoterConfig(contestants=4, max_votes=2, delete_every=8, window=5, slide=2)
    table = generate_votes(70, seed=5, contestants=4, phones=20, invalid_share=0.1)
    ref = run_and_compare(state_server.target, config, [table.slice(i, 1) for i in range(70)])
    assert len(ref.deletions) == 3 and len(ref.contestants) == 1
    assert any(reason == "vote limit reached" for _, reason in ref.rejected)
    assert any(reason == "no such contestant" for _, reason in ref.rejected)
