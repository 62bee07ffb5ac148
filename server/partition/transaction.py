"""One transaction execution (TE): a procedure's statements over one batch or call.

A `Transaction` runs inside a DuckDB transaction opened by the caller. It
registers the input batch under the name the compiled SQL reads, runs each
statement with bound parameters, and collects the tuples emitted on streams
(the result rows of the compiled emit statements), firing a stream's EE
triggers each time tuples enter it, inside the same TE. Tuples emitted on a
retained stream (one nothing consumes) are stored instead, for subscribers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import duckdb
import pyarrow as pa

from streamtx.errors import Aborted, InvalidArgument, StreamTxError
from streamtx.procedure import Event, Row, StateProcedure, Tx
from streamtx.server import log, sqltree
from streamtx.server.catalog.compile import (
    TS_PARAMS,
    Compiled,
    batch_relation,
    compile_statement,
)
from streamtx.server.catalog.placement import EVERYWHERE
from streamtx.server.partition import exchange
from streamtx.server.partition.exchange import run_replicated
from streamtx.server.partition.ownership import check_local
from streamtx.server.partition.state import table_rows
from streamtx.server.sqlc.ctx import Ctx, Fallback
from streamtx.server.sqlc.errors import SqlError
from streamtx.server.sqlc.statement import Result, Statement
from streamtx.server.tuples import Batch, RowShape, Tuples, Values, arrow
from streamtx.wire import conform

if TYPE_CHECKING:
    from streamtx.server.catalog.catalog import Catalog
    from streamtx.server.partition.exchange import Exchange
    from streamtx.server.partition.relations import Relations
    from streamtx.server.partition.sqlplans import SqlPlans


class Host(exchange.Host, Protocol):
    """The partition as a TE sees it (`Engine`)."""

    relations: Relations
    sql_plans: SqlPlans
    exchange: Exchange | None
    prepared: dict[tuple[int, str], list[Event]]
    prepared_epoch: int

    def check_local(self, procedure: str | None, stream: str, rows: Batch) -> None: ...
    def compile_for(self, procedure: str | None, sql: str) -> Compiled: ...
    def python_emits(self, procedure: str | None) -> frozenset[str]: ...
    def stream_triggers(self, stream: str) -> tuple[str, ...]: ...


warnings.filterwarnings("ignore", message="Arrow output on a DB-API result")

MAX_TRIGGER_DEPTH = 32
NO_PARAMS: dict[str, Any] = {}  # an EE trigger's: one object, so its statements share one `Ctx` (never written)


class Transaction(Tx):
    """The context of one TE; also the `Tx` a Python procedure receives (`batch_id` comes from `Tx`)."""

    def __init__(
        self,
        engine: Host,
        procedure: str | None,
        ts: int,
        input_stream: str | None = None,
        batch: Batch | None = None,
        params: dict[str, Any] | None = None,
        batch_values: list[Values] | None = None,
    ) -> None:
        self.engine = engine
        self.con = engine.con
        self.procedure = procedure
        self.ts = ts
        self.input_stream = input_stream
        self.input = batch
        """The batch this TE takes (`batch` is it as Arrow, for Python procedures)."""
        self.batch_values = batch.values if isinstance(batch, Tuples) else batch_values
        """The input's rows in column order, when known (Tuples, or a push's converted rows): no Arrow round trip."""
        self.params = params or {}
        self.emitted: dict[str, list[Batch]] = {}
        self.stored: set[str] = set()  # retained streams this TE stored tuples on
        self.results: list[pa.Table] = []
        self.statements = 0
        self._input_registered = False
        self.input_rows: list[Row] | None = None
        """`batch`'s rows as dicts, when the partition converted them already (its prefetch did)."""
        self._depth = 0
        self._ctx: tuple[dict[str, Any], Batch | None, Ctx] | None = None
        everywhere = engine.catalog.placement.procedures.get(procedure or "") == EVERYWHERE
        self.away = everywhere and engine.partition != 0
        """An everywhere TE away from the home partition: runs only its statements that span partitions."""
        self.spread = everywhere and engine.map.partitions > 1
        """An everywhere TE on a partitioned server: INSERTs into partitioned tables keep only owned keys."""
        self.result_ids: list[int] = []  # the statement each result table came from

    # ------------------------------------------------------------ public (Tx)
    def sql(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        """Runs one statement for a Python procedure (compiled once, then cached)."""
        compiled = self.engine.compile_for(self.procedure, sql)
        self.register_input()
        bound = dict(params or {})
        reserved = sorted(TS_PARAMS & set(bound))
        if reserved:
            raise InvalidArgument(
                f"procedure {self.procedure}: ${reserved[0]} is the running timestamp; pass no value for it"
            )
        missing = [p for p in compiled.params if p not in TS_PARAMS and p not in bound]
        if missing:
            raise InvalidArgument(f"procedure {self.procedure}: no value for ${missing[0]}")
        out = self._run(compiled, bound)
        return out if out is not None else pa.table({})

    def emit(self, stream: str, rows: pa.Table | dict | list) -> None:
        allowed = self.engine.python_emits(self.procedure)
        if stream not in allowed:
            raise InvalidArgument(
                f"procedure {self.procedure} emits on stream {stream!r}, which it does not "
                f"declare (emits={sorted(allowed)})"
            )
        table = _as_table(rows)
        table = conform(table, self.engine.catalog.stream_schemas[stream], f"emit on {stream}")
        if table.num_rows == 0:
            return
        if stream not in self.engine.catalog.retained:
            self._emitted(stream, table)
            return
        self._store(stream, table)

    def abort(self, reason: str) -> None:
        raise Aborted(reason)

    # --------------------------------------------------------------- engine
    def run_plan(self, statements: list[tuple[int, Compiled]]) -> None:
        for i, compiled in statements:
            out = self._run(compiled, self.params, (self.procedure, i), self.input)
            if out is not None and compiled.returns_rows:
                self.results.append(out)
                self.result_ids.append(i)

    def statements_of(self, unit: str) -> list[tuple[int, Compiled]]:
        """The statements of `unit` (a procedure, or "trigger t") as this partition runs them in this TE.

        One partition: all of them. An everywhere TE on several partitions:
        its INSERTs into partitioned tables keep the rows this partition owns,
        and away from home it skips the statements that only touch home state.
        """
        cat = self.engine.catalog
        plan = cat.trigger_plans[unit[8:]] if unit.startswith("trigger ") else cat.plans[unit]
        if not self.spread:
            return list(enumerate(plan.statements))
        skip = cat.placement.home_only.get(unit, frozenset()) if self.away else frozenset()
        return [(i, plan.owned.get(i, c)) for i, c in enumerate(plan.statements) if i not in skip]

    def run_python(self, fn: Callable[..., Any]) -> None:
        """Runs a Python procedure; an exception from its code aborts the TE (it is not a server bug)."""
        try:
            if isinstance(fn, StateProcedure):
                self.run_state(fn)
                return
            result = fn(self, **self.params) if self.params else fn(self)
        except StreamTxError:
            raise
        except Exception as e:
            raise Aborted(f"procedure {self.procedure}: {type(e).__name__}: {e}") from None
        if isinstance(result, pa.Table):
            self.results.append(result)
        elif isinstance(result, list | tuple):
            self.results.extend(_as_table(r) for r in result)
        elif result is not None:
            self.results.append(_as_table(result))

    @property
    def batch(self) -> pa.Table | None:  # type: ignore[override]
        return None if self.input is None else arrow(self.input)

    def batch_rows(self) -> list[Row]:
        """The input batch as rows (dicts), from `batch_values` when known: no Arrow round trip."""
        assert self.input is not None
        if self.batch_values is None:
            return table_rows(arrow(self.input))
        names = self.input.column_names
        return [dict(zip(names, values, strict=True)) for values in self.batch_values]

    def run_state(self, proc: StateProcedure) -> None:
        """A state procedure over the batch: pre-process, state access, post-process (TStream).

        Under `opchain` the events may have been pre-processed, and their keys
        loaded, for the whole punctuation interval already; under `serial` the
        working set is written back at the end of this TE.
        """
        if self.input is None:
            raise InvalidArgument(f"state procedure {self.procedure} needs an input stream (ON STREAM)")
        eng = self.engine
        if eng.exchange is not None:  # its batch spans partitions: the merged rows came with the fragment
            run_replicated(self, proc, eng.exchange)
            return
        state = eng.state
        ws = state.ws
        events = eng.prepared.pop((self.ts, self.procedure), None)
        loaded = events is not None and eng.prepared_epoch == ws.epoch  # no barrier since `_prepare` loaded them
        if events is None:
            ts = self.ts
            events = [Event(row, ts) for row in self.batch_rows()]
            for ev in events:
                proc.pre_process(ev)
        check_local(eng, self.procedure, events)
        if not loaded:
            state.load_for(events)
        rejected = 0
        out: dict[str, list[Row]] = {}
        state.apply_events(events, self.procedure)
        for ev in events:
            proc.post_process(ev)
            rejected += ev.rejected
            for stream, row in ev.out:
                rows_out = out.get(stream)
                if rows_out is None:
                    out[stream] = [row]
                else:
                    rows_out.append(row)
        counters = eng.counters
        counters["events"] += len(events)
        counters["events_rejected"] += rejected
        for stream, rows_out in out.items():
            self.emit_state_rows(stream, rows_out)
        if eng.executor == "serial":
            state.write_back_in(self.procedure)
            ws.clear()

    def emit_state_rows(self, stream: str, rows: list[Row]) -> None:
        """A state procedure's output: `emit`, built straight from the rows when they fit the stream's shape."""
        shape = self.engine.state.shape(stream)
        values = shape.values(rows) if shape is not None else None
        if values is None or stream not in self.engine.python_emits(self.procedure):
            self.emit(stream, rows)
            return
        self._emit_values(stream, shape, values)

    def _emit_values(self, stream: str, shape: RowShape, values: list[Values]) -> None:
        """Tuples that fit `shape` exactly, emitted as Python values (server/tuples.py).

        Tuples for a retained stream stay rows until the commit stores the
        interval's at once; tuples for consumers reach them as `Tuples`.
        """
        if stream in self.engine.catalog.retained:
            self._store(stream, values)
            return
        self._emitted(stream, Tuples(shape, values))

    def _emit_compiled(self, stream: str, result: Result) -> None:
        """A compiled statement's emitted tuples: as rows where they fit the stream's shape, else one table."""
        values = result.emitted
        assert values is not None
        shape = self.engine.state.shape(stream)
        if shape is not None and shape.fits(values):
            self._emit_values(stream, shape, values)
            return
        table = result.emitted_table()
        if stream in self.engine.catalog.retained:
            self._store(stream, table)
        else:
            self._emitted(stream, table)

    def _store(self, stream: str, part: pa.Table | list[Values]) -> None:
        """Tuples on a retained stream: read only after the commit, so stored once per interval, at the commit."""
        self.engine.state.pending.out.setdefault(stream, []).append((self.ts, part))
        self.stored.add(stream)

    def run_compiled(self, compiled: Compiled, plan: tuple[str, int] | None = None, rows: Batch | None = None) -> None:
        """Runs one statement of an EE trigger (no parameters but the timestamp) over the `rows` it fired for."""
        self._run(compiled, NO_PARAMS, plan, rows)

    def register_input(self) -> None:
        if self.input_stream is not None and self.input is not None and not self._input_registered:
            self._register(batch_relation(self.input_stream), arrow(self.input))
            self._input_registered = True

    def fire_stream_triggers(self, stream: str, rows: Batch) -> None:
        """Runs the EE triggers of `stream` over `rows`, just inserted into it."""
        names = self.engine.stream_triggers(stream)
        if not names:
            return
        self._depth += 1
        if self._depth > MAX_TRIGGER_DEPTH:
            raise Aborted(f"EE trigger chain on stream {stream!r} is deeper than {MAX_TRIGGER_DEPTH}")
        self._register(batch_relation(stream), arrow(rows))
        try:
            for name in names:
                unit = f"trigger {name}"
                for i, compiled in self.statements_of(unit):
                    self.run_compiled(compiled, (unit, i), rows)
        finally:
            self._depth -= 1

    # -------------------------------------------------------------- private
    def _run(
        self,
        compiled: Compiled,
        params: dict[str, Any],
        plan: tuple[str | None, int] | None = None,
        batch: Batch | None = None,
    ) -> pa.Table | None:
        """Runs one statement: compiled over the working set (server/sqlc) when it can, else in DuckDB.

        `plan` names the statement (its procedure or trigger, and index) for
        its compiled form; `batch` is the input it reads by the stream's name.
        """
        if compiled.copies is not None and self._copy(compiled.copies, compiled.emits):
            return None
        if plan is not None and plan[0] is not None and not self.spread:
            choice = self.engine.sql_plans.choice(plan[0], plan[1], compiled)
            if choice.compiled is not None:
                done, out = self._run_compiled(choice.compiled, compiled, params, batch)
                if done:
                    return out
        self.register_input()
        state = self.engine.state
        state.barrier(compiled.writes)
        bound = {p: self.ts if p in TS_PARAMS else params.get(p) for p in compiled.params}
        cursor = self.execute(compiled.sql, bound)
        if compiled.emits:
            if compiled.emits in self.engine.catalog.retained:
                if cursor.fetchone()[0]:
                    self.stored.add(compiled.emits)
                return None
            rows = cursor.to_arrow_table()
            if rows.num_rows:
                self._emitted(compiled.emits, rows)
            return None
        out = cursor.to_arrow_table() if compiled.returns_rows else None
        if compiled.writes is None or compiled.writes:
            state.refresh_views(compiled.writes)
        return out

    def _run_compiled(
        self, statement: Statement, compiled: Compiled, params: dict[str, Any], batch: Batch | None
    ) -> tuple[bool, pa.Table | None]:
        """(True, its result) once run over the working set; (False, None) if it must run in DuckDB this time."""
        eng = self.engine
        try:
            result = statement.run(self._context(params, batch))
        except Fallback:
            eng.counters["sql_fallbacks"] += 1
            return False, None
        except SqlError as e:  # worded as DuckDB words it: the same reason whichever way the statement ran
            raise Aborted(f"procedure {self.procedure or '?'}: {error_text(e)}") from None
        except Exception as e:  # a defect of the compiled code: DuckDB runs the statement, the partition serves on
            eng.counters["sql_defects"] += 1
            _warn_defect(compiled.source, e)
            return False, None
        self.statements += 1
        eng.counters["sql_compiled"] += 1
        if result.emitted and compiled.emits is not None:
            self._emit_compiled(compiled.emits, result)
        return True, result.rows

    def _context(self, params: dict[str, Any], batch: Batch | None) -> Ctx:
        """What a compiled statement runs against; one for the TE's statements over the same batch and parameters."""
        held = self._ctx
        if held is not None and held[0] is params and held[1] is batch:
            return held[2]
        rows = None if batch is None else self.rows_of(batch)
        ctx = Ctx(self.engine.state, rows, {**params, **dict.fromkeys(TS_PARAMS, self.ts)}, self.ts)
        self._ctx = (params, batch, ctx)
        return ctx

    def rows_of(self, batch: Batch) -> list[Row]:
        """A batch's rows as dicts, converted once per TE (its input batch from `batch_values` when known)."""
        if batch is self.input:
            if self.input_rows is None:
                self.input_rows = self.batch_rows()
            return self.input_rows
        return batch.rows() if isinstance(batch, Tuples) else table_rows(batch)

    def _copy(self, columns: tuple[str, ...], stream: str | None) -> bool:
        """An emit copying input columns, done on the Arrow table SQL would read; False: let DuckDB run it."""
        if stream is None or self.input_stream is None or self.input is None:
            return False
        self.register_input()
        batch = self.engine.relations.bound(batch_relation(self.input_stream))
        if batch is None:
            return False
        self.statements += 1
        if batch.num_rows:
            names = self.engine.catalog.stream_schemas[stream].names
            self._emitted(stream, batch.select(list(columns)).rename_columns(names))
        return True

    def execute(self, sql: str, params: dict[str, Any]) -> duckdb.DuckDBPyConnection:
        self.statements += 1
        try:
            return self.con.execute(sql, params)
        except duckdb.Error as e:
            raise Aborted(f"procedure {self.procedure or '?'}: {error_text(e)}") from None

    def _emitted(self, stream: str, rows: Batch) -> None:
        self.engine.check_local(self.procedure, stream, rows)
        self.emitted.setdefault(stream, []).append(rows)
        self.fire_stream_triggers(stream, rows)

    def _register(self, name: str, table: pa.Table) -> None:
        self.engine.relations.bind(name, table)


def _warn_defect(sql: str, e: Exception) -> None:
    log.event(
        "compiled_sql_failed",
        f"compiled SQL failed ({type(e).__name__}: {e}); ran in DuckDB instead: {sql}",
        level="warning",
        sql=sql,
    )


def error_text(e: Exception) -> str:
    """DuckDB's message without its class prefix, on one line when short."""
    text = str(e).strip()
    for prefix in ("Invalid Input Error: ", "Constraint Error: "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


def _as_table(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    if isinstance(rows, dict):
        return pa.table(rows)
    if isinstance(rows, list):
        return pa.Table.from_pylist(rows)
    if hasattr(rows, "to_arrow_table"):
        return rows.to_arrow_table()
    raise StreamTxError(f"cannot turn {type(rows).__name__} into rows")


def compile_python_sql(catalog: Catalog, procedure: str, sql: str) -> Compiled:
    proc = catalog.procedures[procedure]
    scope = catalog.scope(
        f"procedure {procedure}",
        proc.on_stream,
        set(catalog.owned_windows(procedure)),
        {p for p, _ in proc.params} | _free_params(sql),
    )
    return compile_statement(sql, scope)


def _free_params(sql: str) -> set[str]:
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqltree.parse(sql)
    except sqlglot.errors.ParseError:
        return set()
    return {p.name for p in tree.find_all(exp.Placeholder) if p.name}
