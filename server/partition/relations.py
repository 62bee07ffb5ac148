"""Arrow tables that SQL reads by name: each TE's input batch, as `__batch__<stream>`.

Registering an Arrow table with DuckDB costs more than the statement that
then reads a small batch (≈ 0.3 ms against ≈ 0.15 ms here), and a dataflow
of n procedures registers n batches per command. So each stream's name is
registered once per deploy, outside any transaction, with an object that
hands DuckDB whichever table was bound last, on every scan: binding is an
assignment. A table whose schema differs from the stream's is cast to it
(the stream's declared column types, as an INSERT into the stream table
would give); one that cannot be cast losslessly is registered the plain way,
for that name from then on.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from streamtx.server.catalog.catalog import Catalog
from streamtx.server.catalog.compile import batch_relation


class _Bound:
    """What DuckDB scans under one name: the Arrow PyCapsule stream of the table bound last."""

    __slots__ = ("schema", "table")

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.table = schema.empty_table()

    def __arrow_c_schema__(self) -> object:
        return self.schema.__arrow_c_schema__()

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        return self.table.__arrow_c_stream__(requested_schema)


class Relations:
    """The names SQL reads batches under, on one connection (used by the partition's executing thread)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self._bound: dict[str, _Bound] = {}

    def reset(self, catalog: Catalog) -> None:
        """After a deploy, outside a transaction: a registration made inside one is undone by its rollback."""
        self._bound = {}
        for stream, schema in catalog.stream_schemas.items():
            name = batch_relation(stream)
            bound = _Bound(schema)
            self.con.register(name, bound)
            self._bound[name] = bound

    def bound(self, name: str) -> pa.Table | None:
        """What SQL reads under `name` now, if bound here (None: a plain registration)."""
        bound = self._bound.get(name)
        return bound.table if bound is not None else None

    def bind(self, name: str, table: pa.Table) -> None:
        """From now on, SQL naming `name` reads `table`."""
        bound = self._bound.get(name)
        if bound is not None:
            if table.schema.equals(bound.schema):
                bound.table = table
                return
            try:
                bound.table = table.cast(bound.schema)
                return
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
                del self._bound[name]  # its values need DuckDB's own types: plain registrations from now on
        self.con.register(name, table)
