"""The voter's final tables do not depend on how votes are cut into batches, nor on the partition count.

The oracle here is written from WORKLOADS.md section 1 alone (it shares no code
with procedures/voter): votes one at a time, in order; each accepted vote
counts, slides the trending window, rewrites the boards, and when the counter
reaches a multiple of `delete_every` the present contestant with the fewest
votes goes, with its votes, which return to their phones. Both ways of running
the voter (the SQL dataflow and the state procedures) must end in exactly its
tables, rejections and deletions, at P = 1 and 2, for random votes (invalid
contestants, repeat phones, unknown area codes, votes for a contestant just
deleted) cut into random batches.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from conftest import drop_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtx.client import Client
from streamtx.procedures.voter import state
from streamtx.procedures.voter.app import VoterConfig, deploy_script, setup_params
from streamtx.procedures.voter.reference import SERVER_QUERIES
from streamtx.server.embedded import EmbeddedServer

pytestmark = pytest.mark.timeout(600)

VARIANTS = {"dataflow": SERVER_QUERIES, "state": state.QUERIES}
KNOWN_AREAS = range(200, 500)  # area_code_state as the voter's setup fills it: 200 + i for i < 300


class Oracle:
    """WORKLOADS.md section 1, one vote at a time."""

    STATES = "AL AK AZ AR CA CO CT DE FL GA HI ID IL IN IA KS KY LA ME MD MA MI MN MS MO MT NE NV NH NJ NM NY " \
        "NC ND OH OK OR PA RI SC SD TN TX UT VT VA WA WV WI WY".split()  # fmt: skip

    def __init__(self, config: VoterConfig) -> None:
        self.cfg = config
        self.present = set(range(1, config.contestants + 1))
        self.votes: dict[int, tuple[int, str, int]] = {}
        self.counts: Counter[int] = Counter()  # accepted votes per contestant still present
        self.total = 0
        self.window: deque[int] = deque(maxlen=config.window)
        self.unslid: list[int] = []
        self.boards: dict[str, dict[int, tuple[int, int]]] = {"top": {}, "bottom": {}, "trending": {}}
        self.rejected: list[tuple[int, str]] = []
        self.deletions: list[tuple[int, int]] = []

    def used(self, phone: int) -> int:
        return sum(1 for p, _, _ in self.votes.values() if p == phone)

    def vote(self, vote_id: int, phone: int, contestant: int) -> None:
        if contestant not in self.present:
            self.rejected.append((vote_id, "no such contestant"))
            return
        if self.used(phone) >= self.cfg.max_votes:
            self.rejected.append((vote_id, "vote limit reached"))
            return
        area = phone // 10_000_000
        self.votes[vote_id] = (phone, self.STATES[(area - 200) % 50] if area in KNOWN_AREAS else "XX", contestant)
        self.unslid.append(contestant)
        if len(self.unslid) == self.cfg.slide:
            self.window.extend(self.unslid)
            self.unslid = []
            trend = Counter(c for c in self.window if c in self.present)
            self.boards["trending"] = ranked(trend.items(), most=True)
        self.counts[contestant] += 1
        self.total += 1
        standing = [(c, self.counts[c]) for c in self.present]
        self.boards["top"] = ranked(standing, most=True)
        self.boards["bottom"] = ranked(standing, most=False)
        if self.total % self.cfg.delete_every == 0 and len(self.present) > 1:
            self.delete(self.boards["bottom"][1][0])

    def delete(self, contestant: int) -> None:
        gone = [v for v, (_, _, c) in self.votes.items() if c == contestant]
        self.deletions.append((contestant, len(gone)))
        for v in gone:
            del self.votes[v]
        self.present.discard(contestant)
        self.counts.pop(contestant, None)
        for name, board in self.boards.items():  # the other rows keep their ranks until the board is rewritten
            self.boards[name] = {r: (c, n) for r, (c, n) in board.items() if c != contestant}

    def tables(self) -> dict[str, list[tuple[Any, ...]]]:
        phones = Counter(p for p, _, _ in self.votes.values())
        return {
            "contestants": [(c, f"Contestant {c}") for c in sorted(self.present)],
            "votes": sorted((v, p, s, c) for v, (p, s, c) in self.votes.items()),
            "phone_votes": sorted(phones.items()),
            "contestant_votes": sorted((c, n) for c, n in self.counts.items() if n),
            "leaderboard": sorted((b, r, c, n) for b, rows in self.boards.items() for r, (c, n) in rows.items()),
            "vote_counter": [(1, self.total)],
        }


def ranked(counts: Any, most: bool) -> dict[int, tuple[int, int]]:
    """Ranks 1..3 of (contestant, votes): most (or fewest) votes first, ties by contestant number."""
    order = sorted(counts, key=lambda cn: (-cn[1] if most else cn[1], cn[0]))
    return {rank: cn for rank, cn in enumerate(order[:3], start=1)}


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
        futures = [
            c.push(
                "votes_in",
                pa.table(
                    {
                        "vote_id": pa.array([v[0] for v in b], pa.int64()),
                        "phone_number": pa.array([v[1] for v in b], pa.int64()),
                        "contestant_number": pa.array([v[2] for v in b], pa.int32()),
                    }
                ),
            )
            for b in batches
        ]
        acks = [f.result() for f in futures]
        assert all(a.outcome == "committed" and not a.reason for a in acks), [(a.outcome, a.reason) for a in acks]
        expected = oracle.tables()
        for name, sql in VARIANTS[variant].items():
            assert c.query(sql).fetchall() == expected[name], name
        rejected = c.query("SELECT vote_id, reason FROM rejected_votes ORDER BY vote_id").fetchall()
        deletions = c.query("SELECT contestant_number, removed_votes FROM deletions ORDER BY __ts").fetchall()
    assert rejected == sorted(oracle.rejected)
    assert deletions == oracle.deletions
    return oracle


def phone(i: int, area: int = 201) -> int:
    return area * 10_000_000 + i


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


def votes_strategy(contestants: int) -> st.SearchStrategy[list[tuple[int, int, int]]]:
    phones = st.sampled_from([phone(i, area) for i in range(6) for area in (201, 350, 650)])
    choice = st.integers(1, contestants + 1)  # contestants + 1 never exists
    return st.lists(st.tuples(phones, choice), min_size=25, max_size=70).map(
        lambda vs: [(i, p, c) for i, (p, c) in enumerate(vs, start=1)]
    )


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("variant", VARIANTS)
def test_any_cut_into_batches_matches_the_oracle(voter_server, variant, data):
    config = data.draw(
        st.builds(
            VoterConfig,
            contestants=st.integers(2, 5),
            max_votes=st.integers(1, 3),
            delete_every=st.integers(2, 9),
            window=st.integers(2, 12),
            slide=st.integers(1, 3),
        ).filter(lambda c: c.slide <= c.window),  # a window slides by at most its size
        label="config",
    )
    votes = data.draw(votes_strategy(config.contestants), label="votes")
    cuts = data.draw(st.lists(st.integers(1, len(votes) - 1), min_size=1, max_size=12), label="cuts")
    run(voter_server.target, config, variant, votes, cuts)
