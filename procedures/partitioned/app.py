"""Sensor readings: the deploy script, the set-up call, and batches aimed at chosen partitions.

The workload exists to show what partitioning buys when it fits: `readings` and
every table its procedure writes are partitioned by `sensor`, so a batch whose
sensors all live on one partition runs there alone (a local command) and P
partitions work in parallel. `sensor_batches` builds such batches for a given
partition count, and, for the multi-partition cost, batches whose sensors
deliberately span partitions (those the front must coordinate).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from streamtx.server.partitioning import PartitionMap

HERE = Path(__file__).resolve().parent
BINS = 1024
"""The server's default bin count (ServerConfig.bins); keys are aimed at partitions through it."""

SCHEMA = pa.schema([("sensor", pa.int64()), ("ts", pa.int64()), ("value", pa.float64())])


def deploy_script() -> str:
    """The tables, the stream, `setup` and the `ingest` procedure (sensors.sql)."""
    return (HERE / "sensors.sql").read_text()


def setup_params(sensors: int) -> dict[str, int]:
    """The `setup` call that fills the replicated `sensors` table with ids 0..sensors-1."""
    return {"num_sensors": sensors}


def sensors_by_partition(sensors: int, partitions: int, bins: int = BINS) -> list[np.ndarray]:
    """Sensor ids 0..sensors-1 grouped by the partition that owns them under a round-robin map."""
    ids = np.arange(sensors, dtype=np.int64)
    owners = PartitionMap.round_robin(partitions, bins).owners(pa.array(ids))
    return [ids[owners == p] for p in range(partitions)]


def sensor_batches(
    count: int,
    rows: int,
    *,
    sensors: int,
    partitions: int,
    spanning_share: float = 0.0,
    seed: int = 0,
    bins: int = BINS,
) -> list[pa.Table]:
    """`count` batches of `rows` readings, dealt round-robin over the partitions.

    A *local* batch takes all its sensors from one partition (batch i from
    partition i mod P), so the front sends it to that partition alone. A share
    `spanning_share` of the batches (spread evenly through the sequence) is
    *spanning* instead: half its rows from each of two partitions, so the
    front coordinates it over both. Timestamps increase across batches, so the
    expected aggregates are easy to recompute (`expected_totals`).
    """
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    if spanning_share and partitions < 2:
        raise ValueError("spanning batches need at least 2 partitions")
    rng = np.random.default_rng(seed)
    owned = sensors_by_partition(sensors, partitions, bins)
    if any(len(o) == 0 for o in owned):
        raise ValueError(f"{sensors} sensors leave a partition of {partitions} without sensors")
    spanning = np.zeros(count, dtype=bool)
    n_span = round(count * spanning_share)
    if n_span:
        spanning[np.linspace(0, count - 1, n_span).round().astype(int)] = True
    out = []
    for i in range(count):
        if spanning[i]:
            first = i % partitions
            second = (first + 1) % partitions
            half = rows // 2
            keys = np.concatenate([rng.choice(owned[first], size=half), rng.choice(owned[second], size=rows - half)])
        else:
            keys = rng.choice(owned[i % partitions], size=rows)
        ts = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        values = rng.random(rows)
        out.append(pa.Table.from_arrays([pa.array(keys), pa.array(ts), pa.array(values)], schema=SCHEMA))
    return out


def expected_totals(batches: list[pa.Table]) -> dict[str, float]:
    """What the server's tables must hold after taking every batch once: rows and sums.

    `readings` is the row count of `reading_log` and the sum of
    `sensor_stats.n`; `value_sum` is the sum of raw values in the log.
    """
    rows = sum(b.num_rows for b in batches)
    value_sum = float(sum(float(np.sum(b.column("value").to_numpy())) for b in batches))
    sensors = len(np.unique(np.concatenate([b.column("sensor").to_numpy() for b in batches]))) if batches else 0
    return {"readings": rows, "value_sum": value_sum, "sensors": sensors}


CHECK_QUERY = (
    "SELECT (SELECT count(*) FROM reading_log) AS readings, "
    "(SELECT coalesce(sum(value), 0) FROM reading_log) AS value_sum, "
    "(SELECT coalesce(sum(n), 0) FROM sensor_stats) AS stats_readings, "
    "(SELECT count(*) FROM sensor_stats) AS sensors"
)
"""One row read from every partition: what `expected_totals` predicts."""
