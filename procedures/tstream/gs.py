"""GS — grep and sum (TStream, dual-mode scheduling paper, section VI-A).

A table of `records` rows (default 10,000; `pad` makes a row about 128
bytes). Each event touches 10 distinct records, zipf(θ)-distributed. Half the
events read their 10 records and emit the sum of their `value` on `gs_out`; the
other half WRITE 10 given values. With fewer than 10 records an event touches
every record.

Input `gs_events(event_id, is_read, keys, vals)`: `vals` holds the values of a
write event (aligned with `keys`) and is empty for a read event. Output
`gs_out(event_id, total)`, read events only; nothing consumes it, so it is
stored (OUTPUT_QUERIES reads it back).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from streamtx.procedure import Event, Ref, StateProcedure
from streamtx.procedures.tstream.common import DEFAULT_MP_LENGTH, DEFAULT_MP_RATIO, KeySpace, distinct_keys

NAME = "gs"
INPUT_STREAM = "gs_events"
OUTPUT_STREAMS = ("gs_out",)
TABLE = "gs_records"
ACCESSES = 10  # records per event (the transaction length)
PAD_LENGTH = 112  # 8 (id) + 8 (value) + 112 (pad) = 128 bytes a row
PAD = "x" * PAD_LENGTH
MAX_VALUE = 1_000_000  # written values are drawn from [0, MAX_VALUE)

SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("is_read", pa.bool_()),
        ("keys", pa.list_(pa.int64())),
        ("vals", pa.list_(pa.int64())),
    ]
)

STATE_QUERIES = {TABLE: f"SELECT id, value, pad FROM {TABLE} ORDER BY id"}
OUTPUT_QUERIES = {"gs_out": "SELECT event_id, total FROM gs_out ORDER BY event_id"}


def deploy_script() -> str:
    return f"""
CREATE TABLE {TABLE} (id BIGINT PRIMARY KEY, value BIGINT, pad VARCHAR) PARTITION BY (id);
CREATE STREAM gs_events (event_id BIGINT, is_read BOOLEAN, keys BIGINT[], vals BIGINT[]);
CREATE STREAM gs_out (event_id BIGINT, total BIGINT);
CREATE PROCEDURE grep_sum ON STREAM gs_events PARTITION ON (keys) AS PYTHON 'tstream.gs:grep_sum';
CREATE PROCEDURE setup_gs (n INTEGER) AS BEGIN
    INSERT INTO {TABLE} SELECT range, range, repeat('x', {PAD_LENGTH}) FROM range($n);
END;
"""


def setup_params(records: int) -> dict[str, Any]:
    return {"n": records}


def initial_value(key: int) -> int:
    """The value `setup_gs` gives record `key`."""
    return key


class GrepSum(StateProcedure):
    """Grep (the state transaction: 10 READs or 10 WRITEs) and Sum (post_process) in one procedure."""

    emits = OUTPUT_STREAMS

    def pre_process(self, ev: Event) -> None:
        keys = ev["keys"]
        if ev["is_read"]:
            for k in keys:
                ev.read(TABLE, k)
            return
        for k, v in zip(keys, ev["vals"], strict=True):
            ev.write(TABLE, k, {"id": k, "value": v, "pad": PAD})

    def post_process(self, ev: Event) -> None:
        if not ev["is_read"]:
            return
        total = 0
        for i in range(len(ev.ops)):
            total += ev.value(Ref(i))["value"]
        ev.emit("gs_out", {"event_id": ev["event_id"], "total": total})


grep_sum = GrepSum()


def generate(
    events: int,
    *,
    seed: int = 0,
    records: int = 10_000,
    theta: float = 0.6,
    read_ratio: float = 0.5,
    partitions: int = 1,
    mp_ratio: float = DEFAULT_MP_RATIO,
    mp_length: int = DEFAULT_MP_LENGTH,
) -> pa.Table:
    """`events` GS events: each touches min(10, records) distinct zipf(θ) keys; a `read_ratio` share reads.

    With `partitions` > 1 the keys of an event come from one partition's keys, or from `mp_length`
    partitions' for an `mp_ratio` share of the events (common.KeySpace); a partition holding fewer
    than 10 keys makes an event touch fewer.
    """
    rng = np.random.default_rng(seed)
    count = min(ACCESSES, records)
    is_read = (rng.random(events) < read_ratio).tolist()
    if partitions == 1:
        keys = [distinct_keys(rng, records, theta, count) for _ in range(events)]
    else:
        space = KeySpace(records, theta, partitions, mp_ratio, mp_length)
        keys = [space.event(rng, count, distinct=True) for _ in range(events)]
    vals = [[] if r else rng.integers(0, MAX_VALUE, len(k)).tolist() for r, k in zip(is_read, keys, strict=True)]
    return pa.table(
        {"event_id": list(range(events)), "is_read": is_read, "keys": keys, "vals": vals},
        schema=SCHEMA,
    )


class Reference:
    """GS, one event at a time, over a dict."""

    def __init__(self, records: int) -> None:
        self.values = {k: initial_value(k) for k in range(records)}
        self.out: list[tuple[int, int]] = []

    def process(self, rows: list[dict[str, Any]]) -> None:
        values = self.values
        for row in rows:
            if row["is_read"]:
                self.out.append((row["event_id"], sum(values[k] for k in row["keys"])))
            else:
                for k, v in zip(row["keys"], row["vals"], strict=True):
                    values[k] = v

    def tables(self) -> dict[str, list[tuple[Any, ...]]]:
        return {TABLE: [(k, v, PAD) for k, v in sorted(self.values.items())]}

    def outputs(self) -> dict[str, list[tuple[Any, ...]]]:
        return {"gs_out": sorted(self.out)}
