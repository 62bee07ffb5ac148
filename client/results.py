"""What the client hands back: query results, push outcomes, deploy summaries.

Kept free of gRPC calls so that the sync and async clients (and tests) share
one definition of each value.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa

from streamtx import errors
from streamtx.v1 import streamtx_pb2 as pb

if TYPE_CHECKING:
    import pandas as pd

_REPR_ROWS = 20
_REPR_WIDTH = 40

_STATUS_BY_VALUE: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}

_OUTCOMES: dict[int, str] = {
    pb.COMMITTED: "committed",
    pb.DUPLICATE: "duplicate",
    pb.REJECTED: "rejected",
}


class Result:
    """A relation returned by the server, with the DuckDB-style accessors people expect.

    The data stays a `pyarrow.Table` (zero-copy from the wire); conversions to
    pandas or Python objects happen only when asked for.
    """

    __slots__ = ("_table",)

    def __init__(self, table: pa.Table) -> None:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            raise TypeError(f"Result wraps a pyarrow.Table, not {type(table).__name__}")
        self._table = table

    def arrow(self) -> pa.Table:
        """The underlying Arrow table (no copy)."""
        return self._table

    def df(self) -> pd.DataFrame:
        """A pandas DataFrame (pandas is imported only when this is called)."""
        return self._table.to_pandas()

    def fetchall(self) -> list[tuple[Any, ...]]:
        """All rows as tuples, in column order."""
        return list(self)

    def to_pylist(self) -> list[dict[str, Any]]:
        """All rows as dicts keyed by column name."""
        return self._table.to_pylist()

    @property
    def num_rows(self) -> int:
        return self._table.num_rows

    @property
    def column_names(self) -> list[str]:
        return list(self._table.column_names)

    @property
    def schema(self) -> pa.Schema:
        return self._table.schema

    def __len__(self) -> int:
        return self._table.num_rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        columns = [col.to_pylist() for col in self._table.columns]
        return iter(zip(*columns, strict=True)) if columns else iter(())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Result):
            return self._table.equals(other._table)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking container; equality by value

    def __repr__(self) -> str:
        return format_table(self._table, max_rows=_REPR_ROWS)


def format_table(table: pa.Table, max_rows: int = _REPR_ROWS) -> str:
    """A plain-text box of the first `max_rows` rows, for reprs and logs."""
    names = list(table.column_names)
    shown = table.slice(0, max_rows)
    cells = [[_cell(v) for v in col.to_pylist()] for col in shown.columns]
    types = [str(f.type) for f in table.schema]
    widths = [max([len(n), len(t), *(len(c) for c in col)]) for n, t, col in zip(names, types, cells, strict=True)]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(values: list[str]) -> str:
        return "|" + "|".join(f" {v:<{w}} " for v, w in zip(values, widths, strict=True)) + "|"

    out = [sep, line(names), line(types), sep]
    for r in range(shown.num_rows):
        out.append(line([col[r] for col in cells]))
    out.append(sep)
    more = table.num_rows - shown.num_rows
    rows = f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}"
    out.append(f"({rows}, {more} not shown)" if more else f"({rows})")
    return "\n".join(out) if names else f"(no columns, {rows})"


def _cell(value: Any) -> str:
    text = "NULL" if value is None else str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= _REPR_WIDTH else text[: _REPR_WIDTH - 1] + "…"


@dataclass(frozen=True)
class PushResult:
    """The outcome of one pushed atomic batch, as acknowledged by the server.

    `outcome` is "committed", "duplicate" (seen before: nothing changed now,
    `original` says what happened the first time) or "rejected" (nothing
    changed; `code` and `reason` say why).
    """

    stream: str
    producer_id: str
    batch_id: int
    outcome: str
    timestamp: int = 0
    rows: int = 0
    reason: str = ""
    code: grpc.StatusCode | None = None
    original: str | None = None

    @property
    def ok(self) -> bool:
        """True unless the batch was rejected (a duplicate is fine: it is already applied)."""
        return self.outcome != "rejected"

    def raise_for_outcome(self) -> PushResult:
        """Raises the mapped StreamTxError for a rejected batch; returns self otherwise."""
        if self.outcome == "rejected":
            raise errors.error_for(self.code or grpc.StatusCode.UNKNOWN, self.reason)
        return self

    @classmethod
    def from_ack(cls, ack: pb.PushAck, rows: int = 0, index: int = 0) -> PushResult:
        """Converts the wire ack; an ack without an outcome counts as rejected (UNKNOWN).

        `rows` is what the client sent, used when the server leaves `ack.rows`
        unset or the ack covers several batches (`ack.count`); `index` picks
        the batch of such an ack.
        """
        outcome = _OUTCOMES.get(ack.outcome)
        code = _STATUS_BY_VALUE.get(ack.code, grpc.StatusCode.UNKNOWN) if ack.code else None
        reason = ack.reason
        if outcome is None:
            outcome = "rejected"
            code = code or grpc.StatusCode.UNKNOWN
            reason = reason or f"server acknowledged batch {ack.batch_id} without an outcome"
        elif outcome == "rejected" and code is None:
            code = grpc.StatusCode.UNKNOWN
        original = _OUTCOMES.get(ack.original) if outcome == "duplicate" else None
        return cls(
            stream=ack.stream,
            producer_id=ack.producer_id,
            batch_id=ack.batch_id + index,
            outcome=outcome,
            timestamp=ack.timestamp + index if ack.timestamp else 0,
            rows=rows if ack.count > 1 else ack.rows or rows,
            reason=reason,
            code=code,
            original=original,
        )


@dataclass(frozen=True)
class DeployResult:
    """What a deployed script changed in the catalog: (kind, name) pairs, and how the new SQL runs."""

    created: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    plans: list[StatementPlan] = field(default_factory=list)

    @classmethod
    def from_proto(cls, resp: pb.DeployResponse) -> DeployResult:
        return cls(
            created=[(o.kind, o.name) for o in resp.created],
            dropped=[(o.kind, o.name) for o in resp.dropped],
            plans=[StatementPlan.from_proto(p) for p in resp.plans],
        )


@dataclass(frozen=True)
class StatementPlan:
    """How one SQL statement of a procedure or trigger runs: `compiled` (how: `plan`) or in DuckDB (why: `reason`)."""

    unit: str
    index: int
    sql: str
    compiled: bool
    plan: str
    reason: str

    @classmethod
    def from_proto(cls, p: pb.StatementPlan) -> StatementPlan:
        return cls(p.unit, p.index, p.sql, p.compiled, p.plan, p.reason)
