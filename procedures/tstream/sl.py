"""SL — streaming ledger (TStream, dual-mode scheduling paper, section VI-A).

Tables `accounts` and `assets`, each key a balance. Half the events deposit
(add to one account and one asset); half transfer an amount from one
account+asset pair to another, rejected if either source would go negative:
the destination writes depend on the source reads (a cross-chain dependency).

Exact rules (the state procedure and `Reference` agree to the row):

- every account and asset `0 .. records-1` starts with `INITIAL_BALANCE`;
- a deposit adds `amount` to `accounts[src_account]` and `assets[src_asset]`
  (the `dst_*` columns are ignored) and always succeeds;
- a transfer succeeds iff, before the event, `accounts[src_account] >= amount`
  and `assets[src_asset] >= amount`; it then subtracts `amount` from both
  sources and adds it to `accounts[dst_account]` and `assets[dst_asset]`, in
  that order. A source equal to its destination therefore nets to zero, but
  still needs the balance. A failed transfer changes nothing;
- every event emits `(event_id, ok)` on `sl_results`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from streamtx.procedure import Event, StateProcedure
from streamtx.procedures.tstream.common import DEFAULT_MP_LENGTH, DEFAULT_MP_RATIO, KeySpace, zipf_keys

NAME = "sl"
INPUT_STREAM = "sl_events"
OUTPUT_STREAMS = ("sl_results",)
INITIAL_BALANCE = 1_000

DEPLOY_SCRIPT = f"""
CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT) PARTITION BY (id);
CREATE TABLE assets (id BIGINT PRIMARY KEY, balance BIGINT) PARTITION BY (id);
CREATE STREAM sl_events (event_id BIGINT, kind VARCHAR, src_account BIGINT, src_asset BIGINT,
                         dst_account BIGINT, dst_asset BIGINT, amount BIGINT);
CREATE STREAM sl_results (event_id BIGINT, ok BOOLEAN);
CREATE PROCEDURE ledger ON STREAM sl_events PARTITION ON (src_account, src_asset, dst_account, dst_asset)
    AS PYTHON 'tstream.sl:ledger';
CREATE PROCEDURE setup_sl (n INTEGER) AS BEGIN
    INSERT INTO accounts SELECT i, {INITIAL_BALANCE} FROM range($n) t(i);
    INSERT INTO assets SELECT i, {INITIAL_BALANCE} FROM range($n) t(i);
END;
"""

STATE_QUERIES = {
    "accounts": "SELECT id, balance FROM accounts ORDER BY id",
    "assets": "SELECT id, balance FROM assets ORDER BY id",
}
OUTPUT_QUERIES = {"sl_results": "SELECT event_id, ok FROM sl_results ORDER BY event_id"}


class Ledger(StateProcedure):
    emits = ("sl_results",)

    def pre_process(self, ev: Event) -> None:
        amount = ev["amount"]
        if ev["kind"] == "deposit":
            ev.read_modify("accounts", ev["src_account"], lambda r: {**r, "balance": r["balance"] + amount})
            ev.read_modify("assets", ev["src_asset"], lambda r: {**r, "balance": r["balance"] + amount})
            return
        enough = lambda r: r is not None and r["balance"] >= amount  # noqa: E731
        ev.read_modify("accounts", ev["src_account"], lambda r: {**r, "balance": r["balance"] - amount}, cond=enough)
        ev.read_modify("assets", ev["src_asset"], lambda r: {**r, "balance": r["balance"] - amount}, cond=enough)
        ev.read_modify("accounts", ev["dst_account"], lambda r: {**r, "balance": r["balance"] + amount})
        ev.read_modify("assets", ev["dst_asset"], lambda r: {**r, "balance": r["balance"] + amount})

    def post_process(self, ev: Event) -> None:
        ev.emit("sl_results", {"event_id": ev["event_id"], "ok": not ev.rejected})


ledger = Ledger()


def deploy_script() -> str:
    return DEPLOY_SCRIPT


def setup_params(records: int) -> dict[str, int]:
    return {"n": records}


def generate(
    events: int,
    *,
    seed: int = 0,
    records: int = 10_000,
    theta: float = 0.6,
    transfer_ratio: float = 0.5,
    deposit_max: int = 100,
    transfer_max: int = 100,
    partitions: int = 1,
    mp_ratio: float = DEFAULT_MP_RATIO,
    mp_length: int = DEFAULT_MP_LENGTH,
) -> pa.Table:
    """`events` ledger events: a `transfer_ratio` share of transfers, the rest deposits.

    The four keys of an event are drawn independently (zipf, skew `theta`), so a
    source may equal its destination. Amounts are uniform in 1..deposit_max
    (deposits) and 1..transfer_max (transfers); a `transfer_max` well above
    `INITIAL_BALANCE` makes many transfers fail, in the middle of key chains.
    With `partitions` > 1 the four keys come from one partition's keys, or for
    an `mp_ratio` share of the events from `mp_length` partitions' (at P = 2:
    sources on one, destinations on the other; common.KeySpace).
    """
    rng = np.random.default_rng(seed)
    if partitions == 1:
        keys = zipf_keys(rng, records, theta, (4, events))
    else:
        space = KeySpace(records, theta, partitions, mp_ratio, mp_length)
        keys = np.array([space.event(rng, 4, distinct=False) for _ in range(events)], dtype=np.int64).T
    transfer = rng.random(events) < transfer_ratio
    amount = np.where(transfer, rng.integers(1, transfer_max + 1, events), rng.integers(1, deposit_max + 1, events))
    return pa.table(
        {
            "event_id": pa.array(np.arange(events), pa.int64()),
            "kind": pa.array(np.where(transfer, "transfer", "deposit").tolist(), pa.string()),
            "src_account": pa.array(keys[0], pa.int64()),
            "src_asset": pa.array(keys[1], pa.int64()),
            "dst_account": pa.array(keys[2], pa.int64()),
            "dst_asset": pa.array(keys[3], pa.int64()),
            "amount": pa.array(amount, pa.int64()),
        }
    )


class Reference:
    """The same rules, one event at a time, in plain Python."""

    def __init__(self, records: int) -> None:
        self.accounts = dict.fromkeys(range(records), INITIAL_BALANCE)
        self.assets = dict.fromkeys(range(records), INITIAL_BALANCE)
        self.results: list[tuple[int, bool]] = []

    def process(self, rows: list[dict[str, Any]]) -> None:
        accounts, assets = self.accounts, self.assets
        for r in rows:
            amount = r["amount"]
            if r["kind"] == "deposit":
                accounts[r["src_account"]] += amount
                assets[r["src_asset"]] += amount
                ok = True
            else:
                ok = accounts[r["src_account"]] >= amount and assets[r["src_asset"]] >= amount
                if ok:
                    accounts[r["src_account"]] -= amount
                    assets[r["src_asset"]] -= amount
                    accounts[r["dst_account"]] += amount
                    assets[r["dst_asset"]] += amount
            self.results.append((r["event_id"], ok))

    def tables(self) -> dict[str, list[tuple[Any, ...]]]:
        return {"accounts": sorted(self.accounts.items()), "assets": sorted(self.assets.items())}

    def outputs(self) -> dict[str, list[tuple[Any, ...]]]:
        return {"sl_results": sorted(self.results)}
