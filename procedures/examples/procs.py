"""Example Python procedures (used by the README and its test)."""

from __future__ import annotations

from streamtx.procedure import Tx, procedure


@procedure
def enrich(tx: Tx) -> None:
    """Labels each counted contestant: one set-based statement over the batch."""
    if tx.batch is None or tx.batch.num_rows == 0:
        return
    tx.sql(
        "INSERT INTO enriched SELECT c, n, CASE WHEN n >= $hot THEN 'popular' ELSE 'rising' END FROM counted",
        {"hot": 10},
    )
