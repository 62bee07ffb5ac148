"""A plain sequential voter: the test oracle. No server, no SQL, one vote at a time.

It applies exactly the voter's rules (S-Store, section 4.1; procedures/voter/schema.sql) to every vote in turn
(a batch's votes in the batch's order): the vote, then the leaderboard, then,
when the vote counter reaches a multiple of `delete_every`, the deletion. How
votes are cut into batches changes nothing.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from streamtx.procedures.voter.app import VoterConfig

STATES = [
    "AL", "AK", "AZ", "AR", "CA", "CO", "CT", "DE", "FL", "GA", "HI", "ID", "IL", "IN", "IA", "KS",
    "KY", "LA", "ME", "MD", "MA", "MI", "MN", "MS", "MO", "MT", "NE", "NV", "NH", "NJ", "NM", "NY",
    "NC", "ND", "OH", "OK", "OR", "PA", "RI", "SC", "SD", "TN", "TX", "UT", "VT", "VA", "WA", "WV",
    "WI", "WY",
]  # fmt: skip


class VoterReference:
    def __init__(self, config: VoterConfig = VoterConfig()) -> None:
        self.config = config
        self.contestants = {i: f"Contestant {i}" for i in range(1, config.contestants + 1)}
        self.area_state = {200 + i: STATES[i % 50] for i in range(300)}
        self.votes: dict[int, tuple[int, str, int]] = {}  # vote_id -> (phone, state, contestant)
        self.phone_votes: Counter[int] = Counter()
        self.contestant_votes: Counter[int] = Counter()
        self.window: deque[int] = deque(maxlen=config.window)  # contestant of each accepted vote
        self.staged: list[int] = []
        self.total = 0
        self.leaderboard: dict[tuple[str, int], tuple[int, int]] = {}
        self.rejected: list[tuple[int, str]] = []
        self.deletions: list[tuple[int, int]] = []

    def process_batch(self, votes: list[tuple[int, int, int]]) -> None:
        """One atomic batch of (vote_id, phone_number, contestant_number): its votes one at a time."""
        for vote in votes:
            self.process_vote(*vote)

    def process_vote(self, vote_id: int, phone: int, contestant: int) -> None:
        if contestant not in self.contestants:
            self.rejected.append((vote_id, "no such contestant"))
            return
        if self.phone_votes[phone] >= self.config.max_votes:
            self.rejected.append((vote_id, "vote limit reached"))
            return
        state = self.area_state.get(phone // 10_000_000, "XX")
        self.votes[vote_id] = (phone, state, contestant)
        self.phone_votes[phone] += 1
        self._leaderboard(contestant)

    def _leaderboard(self, contestant: int) -> None:
        self.staged.append(contestant)  # the window slides, its trigger recomputes trending
        if len(self.staged) >= self.config.slide:
            self.window.extend(self.staged)
            self.staged = []
            self._trending()
        self.contestant_votes[contestant] += 1
        self.total += 1
        ranked = sorted(self.contestants, key=lambda c: (-self.contestant_votes[c], c))
        bottom = sorted(self.contestants, key=lambda c: (self.contestant_votes[c], c))
        for board in ("top", "bottom"):
            for key in [k for k in self.leaderboard if k[0] == board]:
                del self.leaderboard[key]
        for board, order in (("top", ranked), ("bottom", bottom)):
            for rank, c in enumerate(order[:3], start=1):
                self.leaderboard[(board, rank)] = (c, self.contestant_votes[c])
        if len(self.contestants) > 1 and self.total % self.config.delete_every == 0:
            self._delete(bottom[0])

    def _trending(self) -> None:
        counts = Counter(c for c in self.window if c in self.contestants)
        order = sorted(counts, key=lambda c: (-counts[c], c))[:3]
        for key in [k for k in self.leaderboard if k[0] == "trending"]:
            del self.leaderboard[key]
        for rank, c in enumerate(order, start=1):
            self.leaderboard[("trending", rank)] = (c, counts[c])

    def _delete(self, contestant: int) -> None:
        gone = [vid for vid, (_, _, c) in self.votes.items() if c == contestant]
        self.deletions.append((contestant, len(gone)))
        for vid in gone:
            phone = self.votes.pop(vid)[0]
            self.phone_votes[phone] -= 1
            if self.phone_votes[phone] == 0:
                del self.phone_votes[phone]
        self.contestant_votes.pop(contestant, None)
        for key in [k for k, (c, _) in self.leaderboard.items() if c == contestant]:
            del self.leaderboard[key]
        del self.contestants[contestant]

    def tables(self) -> dict[str, list[tuple[Any, ...]]]:
        """Final state, shaped like the server's tables (sorted rows; votes without `created`)."""
        return {
            "contestants": sorted(self.contestants.items()),
            "votes": sorted((vid, p, s, c) for vid, (p, s, c) in self.votes.items()),
            "phone_votes": sorted((p, n) for p, n in self.phone_votes.items() if n),
            "contestant_votes": sorted((c, n) for c, n in self.contestant_votes.items()),
            "leaderboard": sorted((b, r, c, n) for (b, r), (c, n) in self.leaderboard.items()),
            "vote_counter": [(1, self.total)],
        }


SERVER_QUERIES = {
    "contestants": "SELECT contestant_number, contestant_name FROM contestants ORDER BY 1",
    "votes": "SELECT vote_id, phone_number, state, contestant_number FROM votes ORDER BY 1",
    "phone_votes": "SELECT phone_number, num_votes FROM phone_votes ORDER BY 1",
    "contestant_votes": "SELECT contestant_number, num_votes FROM contestant_votes ORDER BY 1",
    "leaderboard": "SELECT board, rank, contestant_number, num_votes FROM leaderboard ORDER BY 1, 2",
    "vote_counter": "SELECT id, total FROM vote_counter ORDER BY 1",
}
"""The queries that read the server's state in the shape of `VoterReference.tables()`."""
