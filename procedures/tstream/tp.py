"""TP — toll processing (TStream, dual-mode scheduling paper, sections II and VI-A).

Position reports on road segments (100 by default, zipf skew 0.2). The paper's
three operators are fused into one state procedure (as TStream does, section
IV): each position report is one state transaction that, for its segment,

1. Road Speed: `tp_speed[segment]`: `reports += 1`, then the incremental mean
   `avg_speed = avg_speed + (speed - avg_speed) / reports` (Python floats,
   IEEE doubles, exactly this expression);
2. Vehicle Count: `tp_vehicles[segment]`: adds `vehicle` to `vehicles`, the
   segment's set of distinct vehicle ids stored as a sorted BIGINT[] list, and
   sets `cnt` to its length;
3. Toll Notification: reads both rows as this report left them and emits
   `(event_id, vehicle, segment, toll)` on `tp_tolls` with the Linear Road
   toll: `toll = 2 * (cnt - 50) ** 2` if `avg_speed < 40` and `cnt > 50`,
   else 0.

Every segment `0 .. records-1` starts at `avg_speed = 0.0, reports = 0,
vehicles = [], cnt = 0`. No report is ever rejected.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import pyarrow as pa

from streamtx.procedure import Event, Ref, StateProcedure
from streamtx.procedures.tstream.common import zipf_keys

NAME = "tp"
INPUT_STREAM = "tp_events"
OUTPUT_STREAMS = ("tp_tolls",)
SEGMENTS = 100
CONGESTED_SPEED = 40.0  # a segment is congested below this average speed ...
CONGESTED_CARS = 50  # ... with more than this many distinct vehicles

DEPLOY_SCRIPT = """
CREATE TABLE tp_speed (segment BIGINT PRIMARY KEY, avg_speed DOUBLE, reports BIGINT) PARTITION BY (segment);
CREATE TABLE tp_vehicles (segment BIGINT PRIMARY KEY, vehicles BIGINT[], cnt BIGINT) PARTITION BY (segment);
CREATE STREAM tp_events (event_id BIGINT, vehicle BIGINT, segment BIGINT, speed DOUBLE);
CREATE STREAM tp_tolls (event_id BIGINT, vehicle BIGINT, segment BIGINT, toll BIGINT);
CREATE PROCEDURE toll_processing ON STREAM tp_events PARTITION ON (segment) AS PYTHON 'tstream.tp:toll_processing';
CREATE PROCEDURE setup_tp (n INTEGER) AS BEGIN
    INSERT INTO tp_speed SELECT i, 0.0, 0 FROM range($n) t(i);
    INSERT INTO tp_vehicles SELECT i, []::BIGINT[], 0 FROM range($n) t(i);
END;
"""

STATE_QUERIES = {
    "tp_speed": "SELECT segment, avg_speed, reports FROM tp_speed ORDER BY segment",
    "tp_vehicles": "SELECT segment, vehicles, cnt FROM tp_vehicles ORDER BY segment",
}
OUTPUT_QUERIES = {"tp_tolls": "SELECT event_id, vehicle, segment, toll FROM tp_tolls ORDER BY event_id"}


def new_speed(avg_speed: float, reports: int, speed: float) -> tuple[float, int]:
    """Road Speed's update: the incremental mean (shared by procedure and reference, same floats)."""
    reports += 1
    return avg_speed + (speed - avg_speed) / reports, reports


def with_vehicle(vehicles: list[int], vehicle: int) -> list[int]:
    """Vehicle Count's update: a new sorted list holding `vehicle` (the old one is not touched)."""
    i = bisect.bisect_left(vehicles, vehicle)
    if i < len(vehicles) and vehicles[i] == vehicle:
        return vehicles
    return [*vehicles[:i], vehicle, *vehicles[i:]]


def toll(avg_speed: float, cnt: int) -> int:
    """Toll Notification's formula (Linear Road's)."""
    if avg_speed < CONGESTED_SPEED and cnt > CONGESTED_CARS:
        return 2 * (cnt - CONGESTED_CARS) ** 2
    return 0


_SPEED, _COUNT = Ref(2), Ref(3)  # the Toll Notification reads: the 3rd and 4th operations of a report


class TollProcessing(StateProcedure):
    """Road Speed, Vehicle Count and Toll Notification fused: one state transaction per report."""

    emits = ("tp_tolls",)

    def pre_process(self, ev: Event) -> None:
        segment, speed, vehicle = ev["segment"], ev["speed"], ev["vehicle"]

        def road_speed(r: dict[str, Any] | None) -> dict[str, Any]:
            avg, n = new_speed(r["avg_speed"], r["reports"], speed)
            return {"segment": segment, "avg_speed": avg, "reports": n}

        def vehicle_cnt(r: dict[str, Any] | None) -> dict[str, Any]:
            vehicles = with_vehicle(r["vehicles"], vehicle)
            return {"segment": segment, "vehicles": vehicles, "cnt": len(vehicles)}

        ev.read_modify("tp_speed", segment, road_speed)
        ev.read_modify("tp_vehicles", segment, vehicle_cnt)
        ev.read("tp_speed", segment)  # Toll Notification: _SPEED
        ev.read("tp_vehicles", segment)  # _COUNT

    def post_process(self, ev: Event) -> None:
        speed, count = ev.value(_SPEED), ev.value(_COUNT)
        if speed is None or count is None:  # rejected: cannot happen on a set-up table
            return
        row = {"event_id": ev["event_id"], "vehicle": ev["vehicle"], "segment": ev["segment"]}
        ev.emit("tp_tolls", {**row, "toll": toll(speed["avg_speed"], count["cnt"])})


toll_processing = TollProcessing()


def deploy_script() -> str:
    return DEPLOY_SCRIPT


def setup_params(records: int) -> dict[str, int]:
    return {"n": records}


def generate(
    events: int,
    *,
    seed: int = 0,
    records: int = SEGMENTS,
    theta: float = 0.2,
    vehicles: int = 1_000,
    partitions: int = 1,
    mp_ratio: float = 0.0,
    mp_length: int = 1,
) -> pa.Table:
    """`events` position reports over `records` segments (zipf, skew `theta`) from `vehicles` vehicles.

    Busy segments are slow: a segment's typical speed grows linearly from 25 for
    the most frequent one to 75 for the least (so the hot segments get tolls
    once they see more than 50 vehicles); a report's speed is that plus
    gaussian noise (sd 10), clipped to 0..120 — arbitrary doubles, to exercise
    exact float arithmetic. A report has one segment, so it always touches one
    partition: `partitions`, `mp_ratio` and `mp_length` change nothing (they
    are accepted like every workload's; a batch of several reports may still
    span partitions).
    """
    del partitions, mp_ratio, mp_length
    rng = np.random.default_rng(seed)
    rank = np.argsort(np.random.default_rng(records).permutation(records))  # zipf_keys' key -> popularity rank
    typical = 25.0 + 50.0 * rank / records
    segment = zipf_keys(rng, records, theta, events)
    vehicle = rng.integers(0, vehicles, events)
    speed = np.clip(typical[segment] + rng.normal(0.0, 10.0, events), 0.0, 120.0)
    return pa.table(
        {
            "event_id": pa.array(np.arange(events), pa.int64()),
            "vehicle": pa.array(vehicle, pa.int64()),
            "segment": pa.array(segment, pa.int64()),
            "speed": pa.array(speed, pa.float64()),
        }
    )


class Reference:
    """The same rules, one report at a time, in plain Python."""

    def __init__(self, records: int) -> None:
        self.speed: dict[int, tuple[float, int]] = dict.fromkeys(range(records), (0.0, 0))
        self.vehicles: dict[int, list[int]] = {s: [] for s in range(records)}
        self.tolls: list[tuple[int, int, int, int]] = []

    def process(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            segment, vehicle = r["segment"], r["vehicle"]
            avg, n = new_speed(*self.speed[segment], r["speed"])
            self.speed[segment] = (avg, n)
            vehicles = self.vehicles[segment] = with_vehicle(self.vehicles[segment], vehicle)
            self.tolls.append((r["event_id"], vehicle, segment, toll(avg, len(vehicles))))

    def tables(self) -> dict[str, list[tuple[Any, ...]]]:
        return {
            "tp_speed": [(s, avg, n) for s, (avg, n) in sorted(self.speed.items())],
            "tp_vehicles": [(s, v, len(v)) for s, v in sorted(self.vehicles.items())],
        }

    def outputs(self) -> dict[str, list[tuple[Any, ...]]]:
        return {"tp_tolls": sorted(self.tolls)}
