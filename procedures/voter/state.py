"""The voter's vote and leaderboard steps as state procedures (bound by procedures/voter/state.sql).

Why state procedures: the SQL dataflow runs about twenty set-based statements
per batch, whatever its size, so 1-vote batches cost ≈ 18 ms each. Here every
vote is one event that declares keyed accesses in `pre_process`; the executor
performs them (under `opchain`, with one load and one write-back per table for
a whole punctuation interval of queued batches) and `post_process` emits.

State (tables of state.sql, each with a one-column primary key):

- `vote` reads `contestants[c]` (rejects "no such contestant"), updates
  `phone_votes[phone]` under the condition that the phone has votes left
  (`voter_config[1].max_votes`; rejects "vote limit reached"), and writes
  `votes[vote_id]` with the state of `area_code_state[phone // 10^7]` ('XX'
  when unknown). An accepted vote goes on `validated`, a rejected one on
  `rejected_votes`, in the batch's row order (votes_in batches are in vote_id
  order, as the reference takes them).
- `leaderboard` adds the vote to `contestant_votes[c]` and
  `vote_counter[1]`, and to the one-row `tally[1]`, which holds everything a
  board needs of all contestants at once: `counts` (votes per contestant
  number), `gone` (deleted contestants, appended by the SQL deletion), and the
  trending window as lists: `staged` collects votes until `slide` of them are
  there, then they join `recent`, which keeps the last `window_size`. Then it
  rewrites the three rows of `boards` (slots 1..3 of top, bottom, trending)
  from that tally row, which it reads as a dependency (`reads=`): top and
  bottom on every vote, trending only when the vote completed a slide (the
  window's EE trigger in the SQL dataflow). A board keeps slots the deletion
  emptied until it is next rewritten, like the reference.
- When the counter reaches a multiple of `voter_config[1].delete_every`,
  `leaderboard` picks the present contestant with the fewest votes (ties: the
  smallest number; none if only one is left) from the tally and emits it on
  `to_delete`; the SQL procedure `delete_contestant` removes that contestant
  on every partition. Being SQL, it is a barrier that ends the opchain
  interval's working set. `vote` is FOR EACH ROW, so in a batch of several
  votes the deletion comes right after the vote that reached the multiple.

Every result equals `VoterReference` (tests/sim/test_voter_state.py); `QUERIES`
reads the server's state in the shape of `VoterReference.tables()`.
"""

from __future__ import annotations

from collections import Counter

from streamtx.errors import Aborted
from streamtx.procedure import Event, Ref, Row, StateProcedure
from streamtx.procedures.voter.reference import SERVER_QUERIES

BOARD_SLOTS = 3
REJECTIONS = ("no such contestant", "vote limit reached")  # the reasons a vote is rejected for, as in the SQL
# the operations post_process reads, by their place in pre_process's declarations
VOTE_ROW = Ref(1)  # Vote: the votes row written
CONFIG_ROW, COUNTER_ROW, TALLY_ROW = Ref(0), Ref(2), Ref(3)  # Leaderboard: voter_config, vote_counter, tally

QUERIES: dict[str, str] = {
    **SERVER_QUERIES,
    "leaderboard": (
        "SELECT board, rank, contestant_number, num_votes FROM ("
        " SELECT board, 1 AS rank, c1 AS contestant_number, n1 AS num_votes FROM boards"
        " UNION ALL SELECT board, 2, c2, n2 FROM boards"
        " UNION ALL SELECT board, 3, c3, n3 FROM boards"
        ") WHERE contestant_number IS NOT NULL ORDER BY 1, 2"
    ),
}
"""SERVER_QUERIES for the state mode: the leaderboard is unpivoted from `boards`."""


def _may_vote(row: Row | None, config: Row, contestant: Row | None) -> bool:
    """The vote's condition on `phone_votes[phone]`, in the reference's order of checks."""
    if contestant is None:
        raise Aborted("no such contestant")  # the event's reason, worded as the SQL vote procedure does
    if row is not None and row["num_votes"] >= config["max_votes"]:
        raise Aborted("vote limit reached")
    return True


class Vote(StateProcedure):
    """Validates one vote (contestant exists, phone has votes left) and records it with its state."""

    emits = ("validated", "rejected_votes")

    def pre_process(self, ev: Event) -> None:
        vote_id, phone, contestant = ev["vote_id"], ev["phone_number"], ev["contestant_number"]
        ts = ev.ts  # the functions must not hold `ev`: a cycle through its ops would outlive it
        ev.read_modify(
            "phone_votes",
            phone,
            lambda row, config, known: {"phone_number": phone, "num_votes": (row["num_votes"] if row else 0) + 1},
            cond=_may_vote,
            reads=(("voter_config", 1), ("contestants", contestant)),
        )
        ev.read_modify(
            "votes",
            vote_id,
            lambda row, area: {
                "vote_id": vote_id,
                "phone_number": phone,
                "state": area["state"] if area is not None else "XX",
                "contestant_number": contestant,
                "created": ts,
            },
            reads=(("area_code_state", phone // 10_000_000),),
        )

    def post_process(self, ev: Event) -> None:
        if ev.rejected:
            if ev.reason not in REJECTIONS:  # a failing function, not a rule: reject the batch, loudly
                raise Aborted(f"vote: vote {ev['vote_id']}: {ev.reason}")
            ev.emit("rejected_votes", {"vote_id": ev["vote_id"], "reason": ev.reason})
            return
        row = ev.value(VOTE_ROW)
        assert row is not None
        ev.emit(
            "validated",
            {
                "vote_id": row["vote_id"],
                "phone_number": row["phone_number"],
                "state": row["state"],
                "contestant_number": row["contestant_number"],
            },
        )


def _counted(tally: Row) -> list[tuple[int, int]]:
    """(votes, contestant) of each present contestant."""
    gone = tally["gone"]
    counts = tally["counts"]
    pairs = zip(counts, range(1, len(counts) + 1), strict=True)
    return [p for p in pairs if p[1] not in gone] if gone else list(pairs)


_SLOTS = tuple((f"c{slot}", f"n{slot}") for slot in range(1, BOARD_SLOTS + 1))
_EMPTY_SLOTS = {name: None for slot in _SLOTS for name in slot}


def _board(name: str, ranked: list[tuple[int, int]]) -> Row:
    """A `boards` row: the first three (contestant, votes) of `ranked` in slots 1..3, the rest empty."""
    row: Row = {"board": name, **_EMPTY_SLOTS}
    for (c_slot, n_slot), (c, n) in zip(_SLOTS, ranked, strict=False):  # ranked may fill fewer slots
        row[c_slot] = c
        row[n_slot] = n
    return row


def _top(row: Row | None, tally: Row) -> Row:
    """Most votes first, ties by contestant number."""
    ranked = sorted([(-n, c) for n, c in _counted(tally)])[:BOARD_SLOTS]
    return _board("top", [(c, -m) for m, c in ranked])


def _bottom(row: Row | None, tally: Row) -> Row:
    """Fewest votes first, ties by contestant number."""
    return _board("bottom", [(c, n) for n, c in sorted(_counted(tally))[:BOARD_SLOTS]])


def _trending(row: Row | None, tally: Row) -> Row:
    """Recomputed when this vote completed a slide (then `staged` is empty), else left as it is."""
    if tally["staged"]:
        return row if row is not None else _board("trending", [])
    gone = tally["gone"]
    recent = tally["recent"]
    counts = Counter([c for c in recent if c not in gone] if gone else recent)
    ranked = sorted([(-n, c) for c, n in counts.items()])[:BOARD_SLOTS]
    return _board("trending", [(c, -m) for m, c in ranked])


class Leaderboard(StateProcedure):
    """Counts one accepted vote, slides the trending window, rewrites the boards, signals deletions."""

    emits = ("to_delete",)

    def pre_process(self, ev: Event) -> None:
        contestant = ev["contestant_number"]

        def tally(row: Row) -> Row:
            """Counts the vote, stages it for the window, and slides the window when `slide` are staged."""
            counts = list(row["counts"])
            counts[contestant - 1] += 1
            staged = [*row["staged"], contestant]
            recent = row["recent"]
            if len(staged) >= row["slide"]:
                recent = [*recent, *staged][-row["window_size"] :]
                staged = []
            return {**row, "counts": counts, "recent": recent, "staged": staged}

        ev.read("voter_config", 1)
        ev.read_modify(
            "contestant_votes",
            contestant,
            lambda row: {"contestant_number": contestant, "num_votes": (row["num_votes"] if row else 0) + 1},
        )
        ev.read_modify("vote_counter", 1, lambda row: {"id": 1, "total": row["total"] + 1})
        ev.read_modify("tally", 1, tally)
        for name, fn in (("top", _top), ("bottom", _bottom), ("trending", _trending)):
            ev.read_modify("boards", name, fn, reads=(("tally", 1),))

    def post_process(self, ev: Event) -> None:
        if ev.rejected:  # only if one of the functions above failed: undo the TE rather than lose the vote
            raise Aborted(f"leaderboard: vote {ev['vote_id']}: {ev.reason}")
        config, counter, tally = ev.value(CONFIG_ROW), ev.value(COUNTER_ROW), ev.value(TALLY_ROW)
        assert config is not None and counter is not None and tally is not None
        if counter["total"] % config["delete_every"] == 0:
            present = _counted(tally)
            if len(present) > 1:
                ev.emit("to_delete", {"contestant_number": min(present)[1]})


vote = Vote()
leaderboard = Leaderboard()
