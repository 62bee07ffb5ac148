"""The streaming scheduler of a partition: border TEs, then PE-triggered TEs.

For one atomic batch, the border TE of the batch's stream runs first, then
every TE its outputs trigger, choosing each time among the ready TEs by the
graph's topological rank, before the partition takes its next command. Hence,
per batch, the TEs run in a topological order of the graph; across batches,
batch order holds (commands arrive in timestamp order); OLTP calls interleave
between batches. Emitted tuples pass from TE to TE in memory (Arrow); only a
stream nothing consumes stores its batches, for subscribers.

Commit boundaries. Each TE is atomic and isolated; the partition's single
thread means no other work can observe a TE before it ends, so the engine is
free to commit several at once. The fast path runs a group of queued batches
(and all the TEs they trigger) in one DuckDB transaction. If any TE in it
aborts, the transaction is rolled back and each batch is run again alone,
in the isolated path (`Dataflow._execute`): the batch's TEs in one
transaction again, and each time a TE aborts, everything is rolled back and
the batch run anew without that TE (or its whole transaction group, S-Store's
nested transactions) and so without what it would have triggered; the abort
is reported and the dataflow goes on. Execution is deterministic, so both
paths reach exactly the state of running every TE alone, in order.

A FOR EACH ROW procedure takes its input one tuple at a time: each tuple's TE
and every TE it triggers run before the next tuple's (`_Run.execute`), so a
batch ends where its tuples pushed one by one would, and stays atomic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from streamtx.errors import Aborted, Internal, NotFound, StreamTxError
from streamtx.procedure import Event, Row, StateProcedure
from streamtx.server.partition.engine import Engine
from streamtx.server.partition.exchange import Exchange, keep_owned
from streamtx.server.partition.ownership import Unspannable

if TYPE_CHECKING:
    from streamtx.server.partition.journal import Journal
from streamtx.server.partition.state import Values, run_values, table_rows
from streamtx.server.partition.transaction import Transaction


@dataclass
class Outcome:
    """What a command did, sent back to the front."""

    outcome: str  # committed | duplicate | rejected
    ts: int
    code: int = 0
    reason: str = ""
    original: str = ""
    emitted: set[str] = field(default_factory=set)
    tes: int = 0
    aborted_tes: list[str] = field(default_factory=list)

    def header(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "ts": self.ts,
            "code": self.code,
            "reason": self.reason,
            "original": self.original,
            "emitted": sorted(self.emitted),
            "tes": self.tes,
            "aborted_tes": self.aborted_tes,
        }


@dataclass(frozen=True)
class Push:
    """One atomic batch to take: the `push` command of the front."""

    stream: str
    producer: str
    batch_id: int
    ts: int
    batch: pa.Table


@dataclass
class _Span:
    """A span (`run_span`): its batches, the partitions each involves, the merged rows, and what it did."""

    pushes: list[Push]
    involved: list[list[int]]
    exchange: Exchange
    wire: tuple[dict[str, Any], list[pa.Table]]  # as the front sent it: what the command log keeps
    values: list[list[Values]]  # each batch's rows, converted once for the span
    outcomes: list[Outcome] = field(default_factory=list)
    taken: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    keep: dict[str, list[int]] = field(default_factory=dict)
    rejected: int = 0

    @classmethod
    def from_wire(cls, h: dict[str, Any], tables: list[pa.Table]) -> _Span:
        runs = h["runs"]
        batches, values = run_values(runs, tables[: len(runs)])
        pushes = [Push(s, producer, b, ts, t) for (s, producer, b, ts, _), t in zip(h["pushes"], batches, strict=True)]
        exchange = Exchange.from_wire(h["exchange"], tables[len(runs) :])
        assert exchange is not None
        exchange.span = True
        head = {"pushes": h["pushes"], "runs": runs, "exchange": h["exchange"]}
        return cls(pushes, [list(i) for *_, i in h["pushes"]], exchange, (head, tables), values)


BORDER_UNIT = "(entry TEs of the batch)"


@dataclass
class _TE:
    """A ready TE: `procedure` (None: no consumer, a plain append) over `stream`'s batch."""

    procedure: str | None
    stream: str | None
    group: str | None
    border: bool = False  # the first entry TE: appends the batch, fires the stream's EE triggers
    entry: bool = False  # consumes the pushed batch: if it aborts, the batch is rejected


class Dataflow:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.journal: Journal | None = None  # the command log's writer; None while replaying it
        self._open = False  # a coordinated command's transaction is open, awaiting `decide`
        self._open_windows: Any = None
        self._open_stored: set[str] = set()
        self._open_specs: list[tuple[dict[str, Any], pa.Table]] = []
        self._open_params: dict[str, Any] | None = None
        self._open_exchange: Exchange | None = None  # the open fragment's merged state rows, logged with it
        self._open_span: _Span | None = None  # the open span, if the open transaction is one

    # ------------------------------------------------------------- commands
    def run_pushes(self, pushes: list[Push]) -> list[Outcome | StreamTxError]:
        """Takes queued batches, in order, in one DuckDB transaction when none aborts."""
        eng = self.engine
        results: list[Outcome | StreamTxError | None] = [None] * len(pushes)
        runs: list[tuple[int, _Run]] = []
        taken: dict[tuple[str, str], tuple[int, int]] = {}
        eng.counters["intervals"] += 1
        saved = eng.windows.snapshot()
        eng.begin()
        try:
            if eng.executor == "opchain":
                self._prepare(pushes)
            for i, p in enumerate(pushes):
                if p.stream not in eng.catalog.streams:
                    results[i] = NotFound(f"unknown stream {p.stream!r}")
                    continue
                key = (p.producer, p.stream)
                if p.batch_id <= max(eng.marks.get(key, 0), taken.get(key, (0, 0))[0]):
                    results[i] = self._duplicate(p.producer, p.stream, p.batch_id)
                    continue
                run = _Run(self, p.ts, {p.stream: p.batch})
                run.start_push(p)
                run.execute()
                taken[key] = (p.batch_id, p.ts)
                runs.append((i, run))
            eng.state.add_marks(taken)
            eng.commit(hold_back=eng.executor == "opchain")  # what certainly fits waits (partition/state.py)
        except (StreamTxError, duckdb.Error):  # an abort, or rows a constraint refuses at the write-back
            self._rollback(saved)
            if len(pushes) == 1:
                return [self._push_isolated(pushes[0])]
            return [r for p in pushes for r in self.run_pushes([p])]
        except BaseException:
            self._rollback(saved)
            raise
        finally:
            eng.prepared.clear()
        keep: dict[str, list[int]] = {}
        for i, run in runs:
            results[i] = run.finish(keep)
            eng.counters["committed"] += 1
            eng.counters["rows"] += pushes[i].batch.num_rows
        if self.journal is not None and runs:
            self.journal.interval([(pushes[i], run) for i, run in runs])
        for key, (batch_id, ts) in taken.items():
            eng.marks[key] = batch_id
            eng.last_ts = max(eng.last_ts, ts)
        self._keep(keep)
        return results  # type: ignore[return-value]

    def run_reject(self, stream: str, producer: str, batch_id: int, ts: int, code: int, reason: str) -> Outcome:
        """Records a batch the front found bad as rejected (or answers DUPLICATE)."""
        eng = self.engine
        duplicate = self._duplicate(producer, stream, batch_id)
        if duplicate is not None:
            return duplicate
        eng.last_ts = max(eng.last_ts, ts)
        eng.record_rejection(producer, stream, batch_id, ts, code, reason)
        if self.journal is not None:
            self.journal.reject(producer, stream, batch_id, ts, code, reason)
        eng.counters["rejected"] += 1
        return Outcome("rejected", ts, code, reason)

    def run_call(self, procedure: str, params: dict[str, Any], ts: int) -> tuple[Outcome, list[pa.Table]]:
        eng = self.engine
        if procedure not in eng.catalog.procedures:
            raise NotFound(f"unknown procedure {procedure!r}")
        eng.last_ts = max(eng.last_ts, ts)

        def start(run: _Run) -> None:
            run.start_call(procedure, params)

        run = self._execute(ts, {}, start)
        if run.call_error is not None:
            eng.counters["calls_aborted"] += 1
            raise run.call_error
        eng.counters["calls"] += 1
        keep: dict[str, list[int]] = {}
        out = run.finish(keep)
        self._keep(keep)
        if self.journal is not None:
            self.journal.call(procedure, params, ts, run)
        return out, run.results

    # ------------------------------------------------- coordinated commands
    def run_fragment(self, h: dict[str, Any], tables: list[pa.Table]) -> tuple[dict[str, Any], list[pa.Table]]:
        """This partition's TEs of one step of a coordinated command, left uncommitted for `decide`.

        The front sends nothing else to this partition until it decides, so the
        DuckDB transaction stays open across the front's round trip (other
        partitions' fragments of the same TE run meanwhile); the global
        timestamp order makes that wait deadlock-free. Several steps (the TEs of
        a transaction group) may share the open transaction. An abort rolls it
        back here at once; the front then undoes the other partitions' parts.
        Outputs go back to the front, which routes them: no PE trigger fires here.
        """
        eng = self.engine
        push = h.get("push")
        if push is not None and not self._open:
            dup = self._duplicate(push["producer"], push["stream"], push["batch_id"])
            if dup is not None:
                return {"duplicate": dup.header()}, []
        if not self._open:
            eng.begin()
            self._open_windows = eng.windows.snapshot()
            self._open_stored = set()
            self._open_specs = []
            self._open_exchange = None
            self._open = True
        eng.coordinated = True
        inputs, extra = tables[: len(h["tes"])], tables[len(h["tes"]) :]
        exchange = Exchange.from_wire(h.get("exchange"), extra)
        try:
            emitted, stored, results, result_ids = self.run_specs(h["ts"], h["tes"], inputs, h.get("params"), exchange)
        except StreamTxError as e:
            self._rollback(self._open_windows)
            self._open = False
            self._open_specs = []
            self._open_exchange = None
            return {"aborted": True, "code": e.code.value[0], "reason": e.message}, []
        finally:
            eng.coordinated = False
            eng.prepared.clear()
        self._open_specs += list(zip(h["tes"], inputs, strict=True))
        self._open_params = h.get("params")
        self._open_exchange = exchange or self._open_exchange
        self._open_stored |= stored
        eng.counters["fragments"] += 1
        streams = sorted(emitted)
        out = [pa.concat_tables(emitted[s]) for s in streams]
        reply = {"aborted": False, "emitted": streams, "stored": sorted(stored), "result_ids": result_ids}
        if "autocommit" in h:
            self.decide({"commit": True, "ts": h["ts"], "mark": h["autocommit"]["mark"]})
        return reply, out + results

    def run_specs(
        self,
        ts: int,
        specs: list[dict[str, Any]],
        tables: list[pa.Table],
        params: dict[str, Any] | None,
        exchange: Exchange | None = None,
    ) -> tuple[dict[str, list[pa.Table]], set[str], list[pa.Table], list[int]]:
        """Runs TEs given one by one (a fragment, or replayed TEs): no PE trigger fires.

        With `exchange`, the fragment's state TE runs over the merged rows of a batch spanning partitions.
        """
        self.engine.exchange = exchange
        try:
            return self._run_specs(ts, specs, tables, params)
        finally:
            self.engine.exchange = None

    def _run_specs(
        self, ts: int, specs: list[dict[str, Any]], tables: list[pa.Table], params: dict[str, Any] | None
    ) -> tuple[dict[str, list[pa.Table]], set[str], list[pa.Table], list[int]]:
        run = _Run(self, ts, {})
        run.call_params = params
        emitted: dict[str, list[pa.Table]] = {}
        results: list[pa.Table] = []
        result_ids: list[int] = []
        stored: set[str] = set()
        for spec, table in zip(specs, tables, strict=True):
            stream = spec["stream"]
            if stream is not None:
                run.inputs[stream] = table
            te = _TE(spec["procedure"], stream, None, border=spec["border"], entry=spec["entry"])
            tx = run._transaction(te)
            run._run_te(te, tx)
            for s, parts in tx.emitted.items():
                emitted.setdefault(s, []).extend(parts)
            stored |= tx.stored
            if stream is None:
                results += tx.results
                result_ids += tx.result_ids
        return emitted, stored, results, result_ids

    def replay_tes(
        self,
        ts: int,
        specs: list[dict[str, Any]],
        tables: list[pa.Table],
        params: dict[str, Any] | None,
        mark: Any,
        exchange: Exchange | None = None,
    ) -> None:
        """Re-executes logged TEs as one transaction, PE triggers off (strong recovery)."""
        eng = self.engine
        saved = eng.windows.snapshot()
        eng.begin()
        try:
            _, stored, _, _ = self.run_specs(ts, specs, tables, params, exchange)
            self._commit_with_mark(ts, mark, stored)
        except BaseException:
            self._rollback(saved)
            raise
        eng.last_ts = max(eng.last_ts, ts)

    def _commit_with_mark(self, ts: int, mark: Any, stored: set[str]) -> None:
        """Commits the open DuckDB transaction with the batch's dedup mark (if any) and stored outputs."""
        eng = self.engine
        if mark is not None:
            eng.record_mark(mark[0], mark[1], mark[2], ts)
        eng.commit()
        if mark is not None:
            eng.marks[(mark[0], mark[1])] = mark[2]
        self._keep({s: [ts] for s in stored})

    def decide(self, h: dict[str, Any]) -> dict[str, Any]:
        """Commits or undoes the open coordinated transaction; records the batch's mark or rejection."""
        eng = self.engine
        ts = h["ts"]
        span, self._open_span = self._open_span, None
        if h["commit"] and self._open and span is not None:
            eng.commit()
            self._commit_span(span)
            if self.journal is not None:
                self.journal.span(span.pushes[-1].ts, *span.wire)
        elif h["commit"] and self._open:
            self._commit_with_mark(ts, h.get("mark"), self._open_stored)
            if self.journal is not None:
                self.journal.fragments(ts, self._open_specs, self._open_params, h.get("mark"), self._open_exchange)
        elif self._open:
            self._rollback(self._open_windows)
        self._open = False
        self._open_stored = set()
        self._open_specs = []
        self._open_exchange = None
        eng.last_ts = max(eng.last_ts, ts)
        rejection = h.get("rejection")
        if rejection is not None:
            producer, stream, batch_id, code, reason = rejection
            if batch_id > eng.marks.get((producer, stream), 0):
                eng.record_rejection(producer, stream, batch_id, ts, code, reason)
                if self.journal is not None:
                    self.journal.reject(producer, stream, batch_id, ts, code, reason)
        return {}

    # ------------------------------------------------------------------ spans
    def run_span(self, h: dict[str, Any], tables: list[pa.Table]) -> tuple[dict[str, Any], list[pa.Table]]:
        """A punctuation interval of state batches over several partitions, left uncommitted for `decide`.

        Every involved partition runs every batch of the span (front/spans.py),
        in timestamp order, over the rows the partitions merged for all of them
        (partition/exchange.py), in one DuckDB transaction; a batch that aborts
        is undone alone and rejected, as it would be alone. The outcomes go
        back to the front, which commits everywhere if the partitions agree on
        them; else (a write-back failed on one partition) it undoes the span
        and runs its batches one at a time.
        """
        if self._open:
            raise Internal(f"span at ts {h['pushes'][-1][3]}: a coordinated transaction is still open")
        span = _Span.from_wire(h, tables)
        saved = self.engine.windows.snapshot()
        self.engine.begin()
        try:
            self._span(span)
            self.engine.state.flush()
        except duckdb.Error as e:  # rows a constraint refuses: the front undoes the span, runs it one by one
            self._rollback(saved)
            raise Aborted(f"span: {type(e).__name__}: {e}") from None
        except BaseException:
            self._rollback(saved)
            raise
        self._open, self._open_windows, self._open_span = True, saved, span
        return {"outcomes": [o.header() for o in span.outcomes]}, []

    def replay_span(self, head: dict[str, Any], tables: list[pa.Table]) -> None:
        """Re-runs a logged span as it committed (recovery)."""
        span = _Span.from_wire(head, tables)
        saved = self.engine.windows.snapshot()
        self.engine.begin()
        try:
            self._span(span)
            self.engine.commit()
        except BaseException:
            self._rollback(saved)
            raise
        self._commit_span(span)

    def _span(self, span: _Span) -> None:
        """The span's batches in order, inside the open DuckDB transaction; outcomes and marks on `span`."""
        eng = self.engine
        exchange = span.exchange
        taken: dict[tuple[str, str], tuple[int, int]] = {}
        eng.exchange = exchange
        try:
            for p, involved, values in zip(span.pushes, span.involved, span.values, strict=True):
                key = (p.producer, p.stream)
                if p.batch_id <= max(eng.marks.get(key, 0), taken.get(key, (0, 0))[0]):
                    dup = self._duplicate(p.producer, p.stream, p.batch_id)
                    span.outcomes.append(dup or Outcome("duplicate", p.ts, original="committed"))
                    continue
                exchange.involved = frozenset(involved)
                run = _Run(self, p.ts, {p.stream: p.batch})
                run.values[p.stream] = (p.batch, values)
                run.start_push(p)
                try:
                    run.execute()
                except Unspannable:
                    raise
                except StreamTxError as e:
                    code, reason = e.code.value[0], e.message
                    eng.write_rejection(p.producer, p.stream, p.batch_id, p.ts, code, reason)
                    span.outcomes.append(Outcome("rejected", p.ts, code, reason))
                    span.rejected += 1
                else:
                    span.outcomes.append(run.finish(span.keep))
                taken[key] = (p.batch_id, p.ts)
        finally:
            eng.exchange = None
        span.taken = taken
        eng.state.add_marks(taken)
        keep_owned(eng, exchange.ws)

    def _commit_span(self, span: _Span) -> None:
        """After the span's commit: marks, timestamps, counters and retained output, as the batches left them."""
        eng = self.engine
        for key, (batch_id, ts) in span.taken.items():
            eng.marks[key] = batch_id
            eng.last_ts = max(eng.last_ts, ts)
        eng.last_ts = max(eng.last_ts, span.pushes[-1].ts)
        self._keep(span.keep)
        committed = [p for p, o in zip(span.pushes, span.outcomes, strict=True) if o.outcome == "committed"]
        eng.counters["committed"] += len(committed)
        eng.counters["rows"] += sum(p.batch.num_rows for p in committed)
        eng.counters["rejected"] += span.rejected
        eng.counters["spans"] += 1

    # ------------------------------------------------------------- internals
    def _push_isolated(self, p: Push) -> Outcome:
        eng = self.engine

        def start(run: _Run) -> None:
            run.start_push(p)

        run = self._execute(p.ts, {p.stream: p.batch}, start)
        keep: dict[str, list[int]] = {}
        out = run.finish(keep)
        self._keep(keep)
        eng.last_ts = max(eng.last_ts, p.ts)
        if self.journal is not None:
            self.journal.push(p, run, rejected=out.outcome == "rejected", outcome=out)
        if out.outcome == "rejected":
            eng.counters["rejected"] += 1
            return out
        eng.marks[(p.producer, p.stream)] = p.batch_id
        eng.counters["committed"] += 1
        eng.counters["rows"] += p.batch.num_rows
        return out

    def _execute(self, ts: int, inputs: dict[str, pa.Table], start: Callable[[_Run], None]) -> _Run:
        """The isolated path: a command's TEs in one transaction, each aborted TE left out, as if undone alone.

        DuckDB has no savepoints, so an aborted TE cannot be undone by itself:
        the transaction is rolled back and the command run again from the
        start without it (and without the rest of its transaction group).
        Execution is deterministic, so every TE before it does exactly what it
        did, and leaving out an aborted TE is undoing it. An entry TE that
        aborts rejects the batch; a call's own TE that aborts fails the call.
        """
        eng = self.engine
        skip: dict[_Key, str | None] = {}
        while True:
            run = _Run(self, ts, dict(inputs), skip=skip, isolated=True)
            start(run)
            saved = eng.windows.snapshot()
            eng.begin()
            try:
                run.execute()
                if run.push is not None:
                    eng.record_mark(run.push.producer, run.push.stream, run.push.batch_id, ts)
                eng.commit()
                return run
            except StreamTxError as e:
                self._rollback(saved)
                failure = run.failure
                if failure is None:
                    raise
                if not run.undone(failure, e):
                    return run
                skip = {**skip, **failure.skips(e)}
            except BaseException:
                self._rollback(saved)
                raise

    def _rollback(self, saved_windows: Any) -> None:
        eng = self.engine
        eng.rollback()
        eng.windows.restore(saved_windows)

    def _prepare(self, pushes: list[Push]) -> None:
        """opchain: pre-processes the events of the interval's state procedures and loads their keys.

        One query per table for the whole punctuation interval (TStream steps
        1 and 2); the TEs then find their events ready in `engine.prepared`.
        A pre_process that fails is left for its TE, which aborts properly.
        """
        eng = self.engine
        consumers: dict[str, tuple[str, StateProcedure] | None] = {}
        taken: list[tuple[Push, str, StateProcedure]] = []
        by_stream: dict[str, list[pa.Table]] = {}
        for p in pushes:
            if p.stream not in consumers:
                consumers[p.stream] = self._state_consumer(p.stream)
            consumer = consumers[p.stream]
            if consumer is not None and (p.batch.num_rows < 2 or not eng.catalog.procedures[consumer[0]].each_row):
                taken.append((p, *consumer))
                by_stream.setdefault(p.stream, []).append(p.batch)
        rows = {stream: iter(_rows_per_batch(batches)) for stream, batches in by_stream.items()}
        events: list[Event] = []
        for p, name, fn in taken:
            ts = p.ts
            prepared = [Event(row, ts) for row in next(rows[p.stream])]
            try:
                for ev in prepared:
                    fn.pre_process(ev)
            except Exception:
                continue
            eng.prepared[(ts, name)] = prepared
            events += prepared
        eng.state.load_for(events)
        eng.prepared_epoch = eng.state.ws.epoch

    def _state_consumer(self, stream: str) -> tuple[str, StateProcedure] | None:
        """The state procedure consuming `stream`, if it is the stream's only consumer."""
        cat = self.engine.catalog
        consumers = cat.consumers.get(stream, [])
        proc = cat.procedures.get(consumers[0]) if len(consumers) == 1 else None
        if proc is None or proc.python is None:
            return None
        fn = self.engine.python_code(proc.python)
        return (proc.name, fn) if isinstance(fn, StateProcedure) else None

    def _keep(self, keep: dict[str, list[int]]) -> None:
        for stream, batch_ids in keep.items():
            self.engine.retain(stream, batch_ids)

    def _duplicate(self, producer: str, stream: str, batch_id: int) -> Outcome | None:
        eng = self.engine
        if batch_id > eng.marks.get((producer, stream), 0):
            return None
        eng.counters["duplicates"] += 1
        orig = eng.original_outcome(producer, stream, batch_id)
        return Outcome("duplicate", orig["ts"], orig["code"], orig["reason"], orig["original"])

    def run_body(self, tx: Transaction, procedure: str) -> None:
        """Feeds the procedure's windows with its input, then runs its code."""
        cat = self.engine.catalog
        proc = cat.procedures[procedure]
        if tx.input_stream is not None and tx.batch is not None and not tx.away:
            for window in self.engine.owned_windows(procedure):
                tx.register_input()
                self.engine.windows.feed(tx, window, tx.input_stream, tx.batch)
        if proc.python is not None:  # registers the batch only if it runs SQL (Transaction.sql)
            tx.run_python(self.engine.python_code(proc.python))
        else:
            tx.register_input()
            tx.run_plan(tx.statements_of(procedure))


_Key = tuple[tuple[int, ...], str | None, bool]
"""A TE of a command: (its FOR EACH ROW tuple positions, procedure, border); a procedure runs once per tuple."""


@dataclass
class _Failure:
    """Where a TE aborted: what to leave out when the command runs again (`Dataflow._execute`)."""

    te: _TE
    undone: list[tuple[_Key, _TE]]  # the TE and the earlier members of its open transaction group
    group: str | None

    def reason(self, error: StreamTxError) -> str:
        return error.message if self.group is None else f"transaction group {self.group} undone: {error.message}"

    def skips(self, error: StreamTxError) -> dict[_Key, str | None]:
        """TEs to leave out, the first (the one an attempt reaches for sure) carrying the report of the abort."""
        out: dict[_Key, str | None] = {key: None for key, _ in self.undone}
        out[self.undone[0][0]] = f"{self.te.procedure}: {self.reason(error)}"
        return out


class _Run:
    """The TEs one command causes, executed in a topological order of the graph.

    A FOR EACH ROW procedure's TE runs once per tuple of its input batch, in
    batch order, and every TE that tuple's TE triggers runs before the next
    tuple's (depth first), so the outcome is that of the tuples arriving one
    at a time; they all stay in the command's one transaction.
    """

    def __init__(
        self,
        flow: Dataflow,
        ts: int,
        inputs: dict[str, pa.Table],
        skip: dict[_Key, str | None] | None = None,
        isolated: bool = False,
    ) -> None:
        self.flow = flow
        self.eng = flow.engine
        self.ts = ts
        self.inputs = inputs
        self.pending: list[_TE] = []
        self.out = Outcome("committed", ts)
        self.push: Push | None = None
        self.call_params: dict[str, Any] | None = None
        self.call_error: StreamTxError | None = None
        self.results: list[pa.Table] = []
        self.stored: set[str] = set()
        self.skip = skip or {}
        """TEs left out: aborted on an earlier attempt, with their reason (None: undone with their group)."""
        self.isolated = isolated
        self.failure: _Failure | None = None
        self._rows: tuple[int, ...] = ()  # the tuple positions of the FOR EACH ROW TEs running
        self._group: str | None = None  # the transaction group of the TEs running back to back
        self._instance: list[tuple[_Key, _TE]] = []  # the open group's TEs so far
        self.logged: list[tuple[dict[str, Any], pa.Table | None]] = []  # committed TEs, for strong logging
        self.values: dict[str, tuple[pa.Table, list[Values]]] = {}  # an input's rows, as a state TE emitted it

    def start_push(self, p: Push) -> None:
        """The batch's entry TEs: every consumer of its stream, taken or refused together.

        They form one unit (one transaction group on the isolated path): the
        batch is committed only if all of them commit, whichever of them aborts.
        """
        cat = self.eng.catalog
        self.push = p
        consumers = cat.consumers.get(p.stream, [])
        groups = {g for g in map(self.eng.group_of, consumers) if g is not None}
        unit = groups.pop() if groups else (BORDER_UNIT if len(consumers) > 1 else None)
        first = consumers[0] if consumers else None
        self.pending.append(_TE(first, p.stream, unit, border=True, entry=True))
        self.pending += [_TE(proc, p.stream, unit, entry=True) for proc in consumers[1:]]

    def start_call(self, procedure: str, params: dict[str, Any]) -> None:
        self.call_params = params
        self.pending.append(_TE(procedure, None, self.eng.group_of(procedure)))

    def finish(self, keep: dict[str, list[int]]) -> Outcome:
        """After the commit: notes the output batches to keep for subscribers in `keep`."""
        for stream in sorted(self.stored):
            keep.setdefault(stream, []).append(self.ts)
            self.out.emitted.add(stream)
        return self.out

    # -------------------------------------------------------------- execution
    def execute(self) -> None:
        """Every TE inside the caller's transaction; an abort propagates to the caller (with `failure` set).

        The members of a transaction group run back to back (`_next`), so the
        order is the one the isolated path takes.
        """
        while self.pending:
            te = self._next()
            rows = self._each_row(te)
            if rows is None:
                self._step(te)
                continue
            outer = self.pending, self.inputs, self.values, self._rows
            for i, row in enumerate(rows):
                self.pending, self.inputs, self.values = [te], {te.stream: row}, {}  # type: ignore[dict-item]
                self._rows = (*outer[3], i)
                self.execute()
            self.pending, self.inputs, self.values, self._rows = outer
        self._group = None

    def undone(self, failure: _Failure, error: StreamTxError) -> bool:
        """After a rollback: False when the abort ends the command (batch rejected, call failed), else True."""
        eng = self.eng
        undone = [te for _, te in failure.undone]
        if any(t.entry for t in undone):
            assert self.push is not None
            reason = failure.reason(error)
            code = error.code.value[0]
            self.out = Outcome("rejected", self.ts, code, reason)
            self.stored = set()
            self.logged = []
            eng.record_rejection(self.push.producer, self.push.stream, self.push.batch_id, self.ts, code, reason)
            return False
        if self.call_params is not None and any(t.stream is None for t in undone):
            self.call_error = error
            return False
        return True

    # -------------------------------------------------------------- helpers
    def _each_row(self, te: _TE) -> list[pa.Table] | None:
        """The tuples a FOR EACH ROW TE takes one at a time (None: it takes its batch at once)."""
        if te.procedure is None or te.stream is None:
            return None
        batch = self.inputs.get(te.stream)
        if batch is None or batch.num_rows < 2 or not self.eng.catalog.procedures[te.procedure].each_row:
            return None
        return [batch.slice(i, 1) for i in range(batch.num_rows)]

    def _step(self, te: _TE) -> None:
        """Runs one TE (or leaves it out, if an earlier attempt saw it abort)."""
        key = (self._rows, te.procedure, te.border)
        if te.group is None or te.group != self._group:
            self._instance = []
        self._group = te.group
        if key in self.skip:
            report = self.skip[key]
            if report is not None:
                self.eng.counters["tes_aborted"] += 1
                self.out.aborted_tes.append(report)
            return
        self._instance.append((key, te))
        tx = self._transaction(te)
        try:
            self._run_te(te, tx)
            if self.isolated:  # rows a constraint refuses abort this TE, not the command
                self.eng.state.write_back_in(te.procedure)
        except StreamTxError:
            self.failure = _Failure(te, list(self._instance), te.group)
            raise
        self._log(te)
        self._done(te, tx)

    def _transaction(self, te: _TE) -> Transaction:
        batch = self.inputs.get(te.stream) if te.stream else None
        known = self.values.get(te.stream) if batch is not None else None
        return Transaction(
            self.eng,
            te.procedure,
            self.ts,
            te.stream,
            batch,
            self.call_params if te.stream is None else None,
            known[1] if known is not None and known[0] is batch else None,
        )

    def _next(self) -> _TE:
        """The ready TE to run next: a member of the open group first, else by topological rank."""
        if len(self.pending) == 1:
            return self.pending.pop()
        rank = self.eng.catalog.topo_rank
        candidates = [t for t in self.pending if self._group is not None and t.group == self._group]
        pool = candidates or self.pending
        best = min(pool, key=lambda t: (not t.border, not t.entry, rank.get(t.procedure or "", -1), t.procedure or ""))
        self.pending.remove(best)
        return best

    def _log(self, te: _TE) -> None:
        spec = {"procedure": te.procedure, "stream": te.stream, "border": te.border, "entry": te.entry}
        self.logged.append((spec, self.inputs.get(te.stream) if te.stream else None))

    def _run_te(self, te: _TE, tx: Transaction) -> None:
        cat = self.eng.catalog
        if te.border:
            assert te.stream is not None
            if te.stream in cat.retained:  # stored with the interval's other output, at the commit
                self.eng.state.pending.out.setdefault(te.stream, []).append((self.ts, self.inputs[te.stream]))
                tx.stored.add(te.stream)
            elif self.eng.stream_triggers(te.stream):
                tx.register_input()
                tx.fire_stream_triggers(te.stream, self.inputs[te.stream])
        if te.procedure is not None:
            self.flow.run_body(tx, te.procedure)

    def _done(self, te: _TE, tx: Transaction) -> None:
        """A TE finished: its results, stored streams, and the TEs its output triggers (PE triggers)."""
        self.out.tes += 1
        if te.procedure is not None and te.stream is None:
            self.results = tx.results
        self.stored |= tx.stored
        cat = self.eng.catalog
        for stream, parts in tx.emitted.items():
            rows = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            prior = self.inputs.get(stream)
            self.inputs[stream] = rows if prior is None else pa.concat_tables([prior, rows])
            if prior is not None:
                continue  # its consumers are scheduled already and will read the grown batch
            known = tx.emitted_values.get(stream)
            if known is not None and known[0] is rows:
                self.values[stream] = known
            for proc in cat.consumers.get(stream, []):
                self.pending.append(_TE(proc, stream, self.eng.group_of(proc)))


def _rows_per_batch(batches: list[pa.Table]) -> list[list[Row]]:
    """Each batch's rows (`to_pylist`), converted together: one conversion per interval, not per batch."""
    if len(batches) == 1:
        return [table_rows(batches[0])]
    try:
        rows = pa.concat_tables(batches).combine_chunks().to_pylist()
    except pa.ArrowInvalid:  # schemas differ: one by one
        return [table_rows(b) for b in batches]
    out = []
    at = 0
    for b in batches:
        out.append(rows[at : at + b.num_rows])
        at += b.num_rows
    return out
