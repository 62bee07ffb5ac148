"""The voter application: its deploy script, its set-up call, and a vote generator."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class VoterConfig:
    """The knobs of the voter workload (the defaults are S-Store's: 25 contestants, a 100-vote trending window)."""

    contestants: int = 25
    max_votes: int = 1
    delete_every: int = 20_000
    window: int = 100
    slide: int = 1


MODES = ("dataflow", "client_ordered", "state")


def deploy_script(config: VoterConfig = VoterConfig(), mode: str = "dataflow") -> str:
    """The deploy script of one mode, with the window's size and slide filled in.

    `dataflow` is the S-Store way (streams, PE/EE triggers, a window);
    `client_ordered` the H-Store way (OLTP procedures the client calls in order);
    both are schema.sql plus their procedures. `state` (state.sql, self-contained
    because its leaderboard and window are keyed differently) runs vote and
    leaderboard as state procedures, so `--executor opchain` can coalesce
    1-vote batches into intervals; read its state with `state.QUERIES`.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if mode == "state":
        text = (HERE / "state.sql").read_text()
    else:
        text = (HERE / "schema.sql").read_text() + "\n" + (HERE / f"{mode}.sql").read_text()
    return text.replace("{window}", str(config.window)).replace("{slide}", str(config.slide))


def setup_params(config: VoterConfig = VoterConfig()) -> dict[str, int]:
    return {
        "num_contestants": config.contestants,
        "max_votes": config.max_votes,
        "delete_every": config.delete_every,
        "trending_window": config.window,
    }


def generate_votes(
    count: int,
    *,
    seed: int = 0,
    contestants: int = 25,
    phones: int = 50_000,
    invalid_share: float = 0.01,
    first_id: int = 1,
) -> pa.Table:
    """`count` votes with increasing vote ids, as the votes_in stream expects.

    Phones come from area codes 200..599 (200..499 are known, the rest map to
    state 'XX'); contestant popularity is skewed; a share of votes names a
    contestant that does not exist; some phones vote again.
    """
    rng = np.random.default_rng(seed)
    phone_ids = rng.integers(0, phones, count)
    area = 200 + (phone_ids % 400)
    phone_number = area * 10_000_000 + phone_ids
    weights = 1.0 / np.arange(1, contestants + 1) ** 0.5
    choice = rng.choice(contestants, size=count, p=weights / weights.sum()) + 1
    invalid = rng.random(count) < invalid_share
    choice = np.where(invalid, contestants + 1 + rng.integers(0, 5, count), choice)
    return pa.table(
        {
            "vote_id": pa.array(np.arange(first_id, first_id + count), pa.int64()),
            "phone_number": pa.array(phone_number, pa.int64()),
            "contestant_number": pa.array(choice, pa.int32()),
        }
    )
