"""The client side of the H-Store-style voter: it enforces the dataflow order itself.

For every vote it calls vote_call, waits, passes the vote, if accepted, to
leaderboard_call, waits, and calls delete_call if a contestant is to go:
three synchronous round trips where the server-side dataflow needs none.
Vote by vote, as the rules have it: a deletion falls right after the vote
that reached a multiple of `delete_every`, whatever the batches.
"""

from __future__ import annotations

import pyarrow as pa

from streamtx.client import Client


def process_batch(client: Client, votes: pa.Table) -> None:
    for i in range(votes.num_rows):
        _process(client, votes.slice(i, 1))


def _process(client: Client, votes: pa.Table) -> None:
    accepted = client.call(
        "vote_call",
        vote_ids=votes.column("vote_id").to_pylist(),
        phone_numbers=votes.column("phone_number").to_pylist(),
        contestant_numbers=votes.column("contestant_number").to_pylist(),
    )[-1]
    if accepted.num_rows == 0:
        return
    table = accepted.arrow()
    doomed = client.call(
        "leaderboard_call",
        vote_ids=table.column("vote_id").to_pylist(),
        contestant_numbers=table.column("contestant_number").to_pylist(),
    )[-1]
    for (contestant,) in doomed.fetchall():
        client.call("delete_call", contestant=contestant)
