"""The voter's oracle, written from WORKLOADS.md section 1 alone (it shares no code with procedures/voter).

Votes one at a time, in order; each accepted vote counts, slides the trending
window, rewrites the boards, and when the counter reaches a multiple of
`delete_every` the present contestant with the fewest votes goes, with its
votes, which return to their phones.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from streamtx.procedures.voter.app import VoterConfig
from streamtx.procedures.voter.reference import VoterReference

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


def phone(i: int, area: int = 201) -> int:
    return area * 10_000_000 + i


def votes_strategy(contestants: int) -> st.SearchStrategy[list[tuple[int, int, int]]]:
    phones = st.sampled_from([phone(i, area) for i in range(6) for area in (201, 350, 650)])
    choice = st.integers(1, contestants + 1)  # contestants + 1 never exists
    return st.lists(st.tuples(phones, choice), min_size=25, max_size=70).map(
        lambda vs: [(i, p, c) for i, (p, c) in enumerate(vs, start=1)]
    )


def vote_batch(votes: list[tuple[int, int, int]]) -> pa.Table:
    """(vote id, phone, contestant) votes as a batch of the voter's `votes_in` stream."""
    return pa.table(
        {
            "vote_id": pa.array([v[0] for v in votes], pa.int64()),
            "phone_number": pa.array([v[1] for v in votes], pa.int64()),
            "contestant_number": pa.array([v[2] for v in votes], pa.int32()),
        }
    )


def voter_configs() -> st.SearchStrategy[VoterConfig]:
    """Small voters: few contestants and votes per phone, frequent deletions, short windows."""
    return st.builds(
        VoterConfig,
        contestants=st.integers(2, 5),
        max_votes=st.integers(1, 3),
        delete_every=st.integers(2, 9),
        window=st.integers(2, 12),
        slide=st.integers(1, 3),
    ).filter(lambda c: c.slide <= c.window)  # a window slides by at most its size


def assert_matches(
    client: Any, oracle: Oracle | VoterReference, queries: Mapping[str, str], futures: Sequence[Any]
) -> None:
    """Every pushed batch committed cleanly, and the server's tables, rejections and deletions are the oracle's
    (this module's `Oracle`, or the product's `VoterReference`)."""
    acks = [f.result() for f in futures]
    assert all(a.outcome == "committed" and not a.reason for a in acks), [(a.outcome, a.reason) for a in acks]
    expected = oracle.tables()
    for name, sql in queries.items():
        assert client.query(sql).fetchall() == expected[name], name
    rejected = client.query("SELECT vote_id, reason FROM rejected_votes ORDER BY vote_id").fetchall()
    deletions = client.query("SELECT contestant_number, removed_votes FROM deletions ORDER BY __ts").fetchall()
    assert rejected == sorted(oracle.rejected)
    assert deletions == oracle.deletions
