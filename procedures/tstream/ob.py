"""OB — online bidding (TStream, dual-mode scheduling paper, section VI-A).

A table of `records` items (price, quantity); item i starts at price
100 + i % 50 and quantity 100. Events are bid : alter : top = 6 : 1 : 1:

- bid (1 item, price p, quantity q): succeeds if p >= the asking price and the
  item has at least q left, which it then loses; otherwise the bid is rejected
  (its `cond` fails: the event's state transaction is aborted, the batch is not);
- alter: sets the prices of 20 distinct items;
- top: adds quantity to 20 distinct items.

Keys are zipf(θ)-distributed; with fewer than 20 records alter and top touch
every item. Input `ob_events(event_id, kind, keys, prices, quantities)`: a bid
has one key, one price and one quantity; an alter has `prices` (aligned with
`keys`) and empty `quantities`; a top has `quantities` and empty `prices`.
Output `ob_out(event_id, kind, ok)` for every event (stored: nothing consumes it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from streamtx.procedure import Event, StateProcedure
from streamtx.procedures.tstream.common import DEFAULT_MP_LENGTH, DEFAULT_MP_RATIO, KeySpace, distinct_keys

NAME = "ob"
INPUT_STREAM = "ob_events"
OUTPUT_STREAMS = ("ob_out",)
TABLE = "ob_items"
ACCESSES = 20  # items per alter / top (their transaction length)
INITIAL_QUANTITY = 100
KINDS = ("bid", "alter", "top")
KIND_WEIGHTS = (6 / 8, 1 / 8, 1 / 8)
# Bid and altered prices are drawn from [PRICE_LOW, PRICE_HIGH): about half the
# bids fail on the price; bid quantities [1, 31) against tops of [1, 21) make
# hot items run out now and then, so bids also fail on the quantity.
PRICE_LOW, PRICE_HIGH = 80, 200
BID_QUANTITY_HIGH = 31
TOP_QUANTITY_HIGH = 21

SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("kind", pa.string()),
        ("keys", pa.list_(pa.int64())),
        ("prices", pa.list_(pa.int64())),
        ("quantities", pa.list_(pa.int64())),
    ]
)

STATE_QUERIES = {TABLE: f"SELECT id, price, quantity FROM {TABLE} ORDER BY id"}
OUTPUT_QUERIES = {"ob_out": "SELECT event_id, kind, ok FROM ob_out ORDER BY event_id"}


def deploy_script() -> str:
    return f"""
CREATE TABLE {TABLE} (id BIGINT PRIMARY KEY, price BIGINT, quantity BIGINT) PARTITION BY (id);
CREATE STREAM ob_events (event_id BIGINT, kind VARCHAR, keys BIGINT[], prices BIGINT[], quantities BIGINT[]);
CREATE STREAM ob_out (event_id BIGINT, kind VARCHAR, ok BOOLEAN);
CREATE PROCEDURE trade ON STREAM ob_events PARTITION ON (keys) AS PYTHON 'tstream.ob:trade';
CREATE PROCEDURE setup_ob (n INTEGER) AS BEGIN
    INSERT INTO {TABLE} SELECT range, 100 + range % 50, {INITIAL_QUANTITY} FROM range($n);
END;
"""


def setup_params(records: int) -> dict[str, Any]:
    return {"n": records}


def initial_item(key: int) -> tuple[int, int]:
    """(price, quantity) that `setup_ob` gives item `key`."""
    return 100 + key % 50, INITIAL_QUANTITY


# Small closure factories: one call per operation in pre_process, nothing else.
def _can_buy(price: int, quantity: int) -> Callable[[dict | None], bool]:
    return lambda r: r is not None and price >= r["price"] and r["quantity"] >= quantity


def _take(quantity: int) -> Callable[[dict], dict]:
    return lambda r: {"id": r["id"], "price": r["price"], "quantity": r["quantity"] - quantity}


def _set_price(price: int) -> Callable[[dict], dict]:
    return lambda r: {"id": r["id"], "price": price, "quantity": r["quantity"]}


def _add(quantity: int) -> Callable[[dict], dict]:
    return lambda r: {"id": r["id"], "price": r["price"], "quantity": r["quantity"] + quantity}


class Trade(StateProcedure):
    """Bid, alter and top as state transactions; post_process reports each event's success."""

    emits = OUTPUT_STREAMS

    def pre_process(self, ev: Event) -> None:
        kind = ev["kind"]
        keys = ev["keys"]
        if kind == "bid":
            price, quantity = ev["prices"][0], ev["quantities"][0]
            ev.read_modify(TABLE, keys[0], _take(quantity), cond=_can_buy(price, quantity))
        elif kind == "alter":
            for k, p in zip(keys, ev["prices"], strict=True):
                ev.read_modify(TABLE, k, _set_price(p))
        elif kind == "top":
            for k, q in zip(keys, ev["quantities"], strict=True):
                ev.read_modify(TABLE, k, _add(q))
        else:
            ev.reject(f"unknown kind {kind!r}")

    def post_process(self, ev: Event) -> None:
        ev.emit("ob_out", {"event_id": ev["event_id"], "kind": ev["kind"], "ok": not ev.rejected})


trade = Trade()


def generate(
    events: int,
    *,
    seed: int = 0,
    records: int = 10_000,
    theta: float = 0.6,
    partitions: int = 1,
    mp_ratio: float = DEFAULT_MP_RATIO,
    mp_length: int = DEFAULT_MP_LENGTH,
) -> pa.Table:
    """`events` OB events, bid : alter : top = 6 : 1 : 1, keys zipf(θ).

    With `partitions` > 1 an alter or top takes its items from one partition's keys, or from
    `mp_length` partitions' for an `mp_ratio` share (common.KeySpace); a bid has one item.
    """
    rng = np.random.default_rng(seed)
    count = min(ACCESSES, records)
    kinds = [KINDS[i] for i in rng.choice(3, size=events, p=KIND_WEIGHTS).tolist()]
    space = KeySpace(records, theta, partitions, mp_ratio, mp_length) if partitions > 1 else None

    def draw(n: int) -> list[int]:
        return distinct_keys(rng, records, theta, n) if space is None else space.event(rng, n, distinct=True)

    keys: list[list[int]] = []
    prices: list[list[int]] = []
    quantities: list[list[int]] = []
    for kind in kinds:
        if kind == "bid":
            keys.append(draw(1))
            prices.append([int(rng.integers(PRICE_LOW, PRICE_HIGH))])
            quantities.append([int(rng.integers(1, BID_QUANTITY_HIGH))])
        elif kind == "alter":
            keys.append(draw(count))
            prices.append(rng.integers(PRICE_LOW, PRICE_HIGH, len(keys[-1])).tolist())
            quantities.append([])
        else:
            keys.append(draw(count))
            prices.append([])
            quantities.append(rng.integers(1, TOP_QUANTITY_HIGH, len(keys[-1])).tolist())
    return pa.table(
        {"event_id": list(range(events)), "kind": kinds, "keys": keys, "prices": prices, "quantities": quantities},
        schema=SCHEMA,
    )


class Reference:
    """OB, one event at a time, over two dicts."""

    def __init__(self, records: int) -> None:
        self.price: dict[int, int] = {}
        self.quantity: dict[int, int] = {}
        for k in range(records):
            self.price[k], self.quantity[k] = initial_item(k)
        self.out: list[tuple[int, str, bool]] = []

    def process(self, rows: list[dict[str, Any]]) -> None:
        price, quantity = self.price, self.quantity
        for row in rows:
            kind, keys = row["kind"], row["keys"]
            ok = True
            if kind == "bid":
                k, p, q = keys[0], row["prices"][0], row["quantities"][0]
                ok = k in price and p >= price[k] and quantity[k] >= q
                if ok:
                    quantity[k] -= q
            elif kind == "alter":
                for k, p in zip(keys, row["prices"], strict=True):
                    price[k] = p
            elif kind == "top":
                for k, q in zip(keys, row["quantities"], strict=True):
                    quantity[k] += q
            else:
                ok = False
            self.out.append((row["event_id"], kind, ok))

    def tables(self) -> dict[str, list[tuple[Any, ...]]]:
        return {TABLE: [(k, self.price[k], self.quantity[k]) for k in sorted(self.price)]}

    def outputs(self) -> dict[str, list[tuple[Any, ...]]]:
        return {"ob_out": sorted(self.out)}
