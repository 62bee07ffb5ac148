"""What the TStream workloads (GS, SL, OB, TP) share: keys, the workload contract, a runner.

A workload is a module of this package with:

- `NAME`, `INPUT_STREAM`, `OUTPUT_STREAMS`;
- `deploy_script() -> str`: tables, streams, the state procedure binding
  (`AS PYTHON 'tstream.<module>:<object>'`), and an OLTP `setup_<name>`
  procedure that pre-populates the state;
- `setup_params(records) -> dict` for that call;
- `generate(events, *, seed, records, theta, ...) -> pa.Table`: the input
  stream's rows, `event_id` 0, 1, 2, ... in processing order;
- `Reference(records)`: a plain sequential implementation with
  `process(rows: list[dict])`, `tables() -> dict[str, list[tuple]]` and
  `outputs() -> dict[str, list[tuple]]`;
- `STATE_QUERIES` / `OUTPUT_QUERIES`: SQL that reads the server's state and
  output streams in the shape of `tables()` / `outputs()`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa


@functools.lru_cache(maxsize=64)
def _zipf(records: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    weights = 1.0 / np.power(np.arange(1, records + 1, dtype=np.float64), theta)
    weights /= weights.sum()
    return weights, np.random.default_rng(records).permutation(records)


def zipf_keys(rng: np.random.Generator, records: int, theta: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Keys 0..records-1 drawn with probability proportional to 1/(rank+1)^theta (theta=0: uniform).

    The hottest keys are scattered over the key space (a fixed permutation), so
    skew does not mean "small keys" — it matters once keys map to partitions.
    """
    weights, perm = _zipf(records, theta)
    return perm[rng.choice(records, size=size, p=weights)]


def distinct_keys(rng: np.random.Generator, records: int, theta: float, count: int) -> list[int]:
    """`count` distinct zipf-distributed keys (an event touching 10 records touches 10 different ones)."""
    keys: list[int] = []
    while len(keys) < count:
        for k in zipf_keys(rng, records, theta, count * 2).tolist():
            if k not in keys:
                keys.append(k)
                if len(keys) == count:
                    break
    return keys


DEFAULT_BINS = 1024  # the server's --bins default: a generator places keys with the map such a server makes
DEFAULT_MP_RATIO = 0.25  # a quarter of the transactions touch several partitions ...
DEFAULT_MP_LENGTH = 4  # ... four of them (at most as many as there are)


class KeySpace:
    """Keys 0..records-1 by owning partition (the server's round-robin map), for partition-aware events.

    An event is single-partition (all its keys owned by one partition, chosen
    with the zipf weight of its keys) or, with probability `mp_ratio`,
    touches `mp_length` partitions (capped by P, by the partitions holding keys
    and by the event's key count): its key slots go to them in contiguous
    blocks (SL: sources on one, destinations on another). Within a
    partition keys keep their zipf(θ) weights.
    """

    def __init__(
        self,
        records: int,
        theta: float,
        partitions: int,
        mp_ratio: float = DEFAULT_MP_RATIO,
        mp_length: int = DEFAULT_MP_LENGTH,
        bins: int = DEFAULT_BINS,
    ) -> None:
        from streamtx.server.partitioning import PartitionMap

        weights, perm = _zipf(records, theta)
        weight = np.empty(records)
        weight[perm] = weights
        owner = PartitionMap.round_robin(partitions, max(bins, partitions)).owners(pa.array(np.arange(records)))
        self.keys = [k for k in (np.flatnonzero(owner == p) for p in range(partitions)) if len(k)]
        self.cdfs = [np.cumsum(weight[k]) / weight[k].sum() for k in self.keys]
        self.part_cdf = np.cumsum([weight[k].sum() for k in self.keys])
        self.part_cdf /= self.part_cdf[-1]
        self.mp_ratio = mp_ratio
        self.mp_length = mp_length

    def event(self, rng: np.random.Generator, count: int, distinct: bool) -> list[int]:
        """The `count` keys of one event (fewer if `distinct` and its partitions hold fewer)."""
        first = min(int(np.searchsorted(self.part_cdf, rng.random())), len(self.keys) - 1)
        spread = 1
        if rng.random() < self.mp_ratio:
            spread = max(1, min(self.mp_length, len(self.keys), count))
        chosen = [first]
        if spread > 1:
            others = [p for p in range(len(self.keys)) if p != first]
            chosen += rng.choice(others, spread - 1, replace=False).tolist()
        keys: list[int] = []
        for i, part in enumerate(chosen):
            slots = (i + 1) * count // spread - i * count // spread
            keys += self._draw(rng, part, slots, distinct)
        return keys

    def _draw(self, rng: np.random.Generator, part: int, n: int, distinct: bool) -> list[int]:
        pool, cdf = self.keys[part], self.cdfs[part]

        def sample(size: int) -> list[int]:
            return pool[np.minimum(np.searchsorted(cdf, rng.random(size)), len(pool) - 1)].tolist()

        if not distinct:
            return sample(n)
        n = min(n, len(pool))
        out: list[int] = []
        while len(out) < n:
            for k in sample(2 * n):
                if k not in out:
                    out.append(k)
                    if len(out) == n:
                        break
        return out


@dataclass
class RunResult:
    tables: dict[str, list[tuple[Any, ...]]]
    outputs: dict[str, list[tuple[Any, ...]]]
    acks: list[Any]


def run_on_server(workload: ModuleType, target: str, events: pa.Table, batch_size: int, records: int) -> RunResult:
    """Deploys the workload on a fresh server, pushes `events` pipelined in batches, reads the result."""
    from streamtx.client import Client

    with Client(target, max_in_flight=512) as c:
        c.deploy(workload.deploy_script())
        c.call(f"setup_{workload.NAME}", **workload.setup_params(records))
        batches = [events.slice(i, batch_size) for i in range(0, events.num_rows, batch_size)]
        acks = [f.result() for f in [c.push(workload.INPUT_STREAM, b) for b in batches]]
        tables = {name: c.query(sql).fetchall() for name, sql in workload.STATE_QUERIES.items()}
        outputs = {name: c.query(sql).fetchall() for name, sql in workload.OUTPUT_QUERIES.items()}
    return RunResult(tables, outputs, acks)


def run_reference(workload: ModuleType, events: pa.Table, records: int) -> RunResult:
    ref = workload.Reference(records)
    ref.process(events.to_pylist())
    return RunResult(ref.tables(), ref.outputs(), [])
