"""Keys to bins to partitions: the one hash both the front and the workers use.

A partitioned table or stream names one partition column. A row's bin is
`hash(key) mod B`; the partition map says which partition owns each bin.
The hash is defined here, in NumPy over Arrow buffers, so that it is the
same in every process and every library version (DuckDB's `hash()` is only
stable within one DuckDB release), and costs microseconds per batch, not
per row: integer-like keys (integers, dates, timestamps) are mixed with the
SplitMix64 finalizer; strings hash as the FNV-1a of their UTF-8 bytes,
computed once per distinct value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamtx.errors import InvalidArgument
from streamtx.files import atomic_write
from streamtx.server.config import MAP_FILE

INTEGER_LIKE_TYPES = ("INTEGER", "BIGINT", "SMALLINT", "TINYINT", "UINTEGER", "UBIGINT", "USMALLINT", "UTINYINT")
KEY_TYPES = (*INTEGER_LIKE_TYPES, "VARCHAR", "DATE", "TIMESTAMP")
"""Column types a table or stream may be partitioned by (as DuckDB spells them)."""

HOME = 0
"""The home partition: single tables, windows of single procedures, and the DONE log live there; it is
never retired."""

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: every input bit affects every output bit.

    In place on a copy, with one scratch array: a migration step hashes a
    partition's every key, and fresh temporaries of that size cost more in
    page faults than the arithmetic.
    """
    x = x.astype(np.uint64, copy=True)
    shifted = np.empty_like(x)
    with np.errstate(over="ignore"):
        for shift, multiplier in ((30, _M1), (27, _M2)):
            np.right_shift(x, np.uint64(shift), out=shifted)
            x ^= shifted
            x *= multiplier
        np.right_shift(x, np.uint64(31), out=shifted)
        x ^= shifted
    return x


def _fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


_MASK = (1 << 64) - 1
SMALL = 64
"""Keys few enough to hash in plain Python: NumPy's and Arrow's cost per call dwarfs theirs per key."""


def _py_hash(value: int | str | None) -> int:
    """`key_hashes` of one integer or string key, in Python (NULL hashes like 0)."""
    x = 0 if value is None else _fnv1a(value.encode()) if type(value) is str else value & _MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _py_hashable(t: pa.DataType) -> bool:
    """Keys of type `t` read as Python ints (in int64) or strs, which `_py_hash` takes."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_signed_integer(t):
        return True
    return t in (pa.uint8(), pa.uint16(), pa.uint32())


def _plain_keys(keys: list[object]) -> bool:
    """Python keys `pa.array` would type as int64 or as string (so `_py_hash` hashes them alike)."""
    kinds = {type(k) for k in keys}
    if kinds == {str}:
        return True
    return kinds == {int} and all(-(1 << 63) <= k < (1 << 63) for k in keys)  # type: ignore[operator]


def key_hashes(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A uint64 hash per key; NULL keys hash like 0 (they go to one fixed bin)."""
    if isinstance(values, pa.ChunkedArray):
        if values.num_chunks != 1:  # chunk by chunk: no copy of the whole column first
            hashes = [_chunk_hashes(c) for c in values.chunks]
            return np.concatenate(hashes) if hashes else np.empty(0, dtype=np.uint64)
        values = values.chunk(0)
    return _chunk_hashes(values)


def _chunk_hashes(values: pa.Array) -> np.ndarray:
    t = values.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        encoded = pc.dictionary_encode(values)
        uniques = encoded.dictionary.to_pylist()
        table = np.array([_fnv1a(u.encode()) for u in uniques] + [0], dtype=np.uint64)
        idx = encoded.indices.fill_null(len(uniques)).to_numpy(zero_copy_only=False)
        return _mix64(table[idx])
    if pa.types.is_integer(t) or pa.types.is_date(t) or pa.types.is_timestamp(t):
        as_int = values.cast(pa.int64()) if not pa.types.is_int64(t) else values
        if as_int.null_count:
            as_int = as_int.fill_null(0)
        ints = as_int.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return _mix64(ints.view(np.uint64))
    raise InvalidArgument(f"cannot partition by a column of type {t}; partition keys are integers, strings or dates")


def bins_of(values: pa.Array | pa.ChunkedArray, bins: int) -> np.ndarray:
    """The bin of each key (int64), of `bins` bins."""
    hashed = key_hashes(values)
    np.remainder(hashed, np.uint64(bins), out=hashed)
    return hashed.view(np.int64)


def scalar_hash(value: object, arrow_type: pa.DataType) -> int:
    """The hash of one key (a call's partitioning parameter), equal to `key_hashes` of it."""
    return int(key_hashes(pa.array([value], type=arrow_type))[0])


@dataclass(frozen=True)
class PartitionMap:
    """Which partition owns each bin. Part of the durable state of the server (MAP_FILE).

    Bins are assigned round-robin at creation; rebalancing (moving bins,
    front/rebalance.py) is the only thing that changes `owner` later, and
    `born` (adding or retiring partitions).
    """

    bins: int
    owner: tuple[int, ...]
    born: tuple[int, ...] = ()
    """Per partition, the timestamp a live grow added it at (0: the server was created with it). A
    partition may own no bin (just added, or all its bins moved away), so this, not `owner`, counts
    them; left out, it is one 0 per partition up to the highest owner."""

    def __post_init__(self) -> None:
        if not self.born:
            object.__setattr__(self, "born", (0,) * (max(self.owner) + 1 if self.owner else 1))

    @property
    def partitions(self) -> int:
        return len(self.born)

    def resized(self, partitions: int, ts: int = 0) -> PartitionMap:
        """The same owners over `partitions` partitions, those added born at `ts` (a live grow or shrink)."""
        born = self.born[:partitions]
        return PartitionMap(self.bins, self.owner, born + (ts,) * (partitions - len(born)))

    def moved(self, owner: tuple[int, ...]) -> PartitionMap:
        """This map's partitions with bins owned by `owner`."""
        return PartitionMap(self.bins, owner, self.born)

    @classmethod
    def round_robin(cls, partitions: int, bins: int) -> PartitionMap:
        if partitions < 1:
            raise ValueError("partitions must be at least 1")
        if bins < partitions:
            raise ValueError(f"bins ({bins}) must be at least the number of partitions ({partitions})")
        return cls(bins, tuple(b % partitions for b in range(bins)))

    def owners(self, values: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The owning partition of each key."""
        if len(values) <= SMALL and _py_hashable(values.type):
            return np.array([self.owner[_py_hash(v) % self.bins] for v in values.to_pylist()], dtype=np.int32)
        return np.asarray(self.owner, dtype=np.int32)[bins_of(values, self.bins)]

    def bins_for(self, values: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The bin of each key (`bins_of`), in plain Python for a few."""
        if len(values) <= SMALL and _py_hashable(values.type):
            return np.array([_py_hash(v) % self.bins for v in values.to_pylist()], dtype=np.int64)
        return bins_of(values, self.bins)

    def sole_owner(self, values: pa.Array | pa.ChunkedArray) -> int | None:
        """The one partition owning every key (as `owners` places them, NULL included), or None if several do."""
        if len(values) <= SMALL and _py_hashable(values.type):
            found = {self.owner[_py_hash(v) % self.bins] for v in values.to_pylist()}
        else:
            found = set(np.unique(self.owners(values)).tolist())
        return found.pop() if len(found) == 1 else None

    def partitions_of(self, table: pa.Table, columns: tuple[str, ...] | list[str]) -> list[int]:
        """The partitions owning any key in `columns` of `table`, sorted.

        A list column counts with every element; a NULL names no key, so no partition.
        """
        if table.num_rows <= SMALL:
            small = self._small_partitions_of(table, columns)
            if small is not None:
                return small
        found: set[int] = set()
        for col in columns:
            values = table.column(col)
            if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
                values = pc.list_flatten(values)
            if values.null_count:
                values = pc.drop_null(values)
            if len(values):
                found.update(np.unique(self.owners(values)).tolist())
        return sorted(found)

    def _small_partitions_of(self, table: pa.Table, columns: tuple[str, ...] | list[str]) -> list[int] | None:
        """`partitions_of` a few rows, in Python; None if a column's keys are not ints or strings."""
        found: set[int] = set()
        for col in columns:
            values = table.column(col)
            t = values.type
            nested = pa.types.is_list(t) or pa.types.is_large_list(t)
            if not _py_hashable(t.value_type if nested else t):
                return None
            keys = values.to_pylist()
            if nested:
                keys = [k for row in keys if row is not None for k in row]
            found.update(self.owner[_py_hash(k) % self.bins] for k in keys if k is not None)
        return sorted(found)

    def owners_of(self, keys: list[object]) -> np.ndarray:
        """`owners(pa.array(keys))` of Python keys, without building the array for a few plain ones."""
        if len(keys) <= SMALL and _plain_keys(keys):
            return np.array([self.owner[_py_hash(k) % self.bins] for k in keys], dtype=np.int32)  # type: ignore[arg-type]
        return self.owners(pa.array(keys))

    def owner_of(self, value: object, arrow_type: pa.DataType) -> int:
        return self.owner[scalar_hash(value, arrow_type) % self.bins]

    def split(self, table: pa.Table, column: str) -> dict[int, pa.Table]:
        """The rows of `table` per owning partition, each slice in the table's row order."""
        owners = self.owners(table.column(column))
        present = np.unique(owners)
        if len(present) == 1:
            return {int(present[0]): table}
        return {int(p): table.filter(pa.array(owners == p)) for p in present}

    def to_json(self) -> str:
        return json.dumps(self._record())

    def _record(self) -> dict[str, object]:
        return {"bins": self.bins, "owner": list(self.owner), "born": list(self.born)}

    @classmethod
    def from_json(cls, text: str) -> PartitionMap:
        return cls._of(json.loads(text))

    @classmethod
    def _of(cls, data: dict, bins: int | None = None) -> PartitionMap:
        return cls(
            int(data["bins"]) if bins is None else bins,
            tuple(int(o) for o in data["owner"]),
            tuple(int(t) for t in data.get("born", ())),
        )

    def save(self, data_dir: Path, pending: tuple[int, PartitionMap] | None = None) -> None:
        """Writes the map to the data directory, with the map a migration step at `pending[0]` moves to.

        A step writes its new map as pending before it starts and as the map
        once it is DONE; recovery keeps the pending one only if the step's
        DONE record made it (`settled`).
        """
        data = self._record()
        if pending is not None:
            data["pending"] = {"ts": pending[0], **pending[1]._record()}
        atomic_write(data_dir / MAP_FILE, json.dumps(data))

    @classmethod
    def settled(cls, data_dir: Path, done: set[int]) -> PartitionMap:
        """The data directory's map after recovery: a pending step's map if the step finished, else the
        map before it (either way the file then says so, with nothing pending)."""
        data = json.loads((data_dir / MAP_FILE).read_text())
        found = cls._of(data)
        pending = data.get("pending")
        if pending is None:
            return found
        if pending["ts"] in done:
            found = cls._of(pending, found.bins)
        found.save(data_dir)
        return found

    @classmethod
    def load_or_create(cls, data_dir: Path, partitions: int, bins: int) -> PartitionMap:
        """The map in the data directory, else a new one, saved.

        A map for another partition count or bin count is never replaced: the
        rows are placed by it (`ServerConfig.layout_mismatch` refuses such a
        server before it starts).
        """
        path = data_dir / MAP_FILE
        if path.exists():
            found = cls._of(json.loads(path.read_text()))
            if (found.partitions, found.bins) != (partitions, bins):
                raise ValueError(f"{path}: {found.partitions} partitions over {found.bins} bins, not {partitions}")
            return found
        made = cls.round_robin(partitions, bins)
        made.save(data_dir)
        return made
