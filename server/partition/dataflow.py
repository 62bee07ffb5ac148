"""A partition's dataflow: the commands it takes and the transactions they commit in.

For one atomic batch, the entry TEs of the batch's stream run first, then
every TE their outputs trigger, in the order of the command's `Schedule`
(server/schedule.py: topological, groups back to back, FOR EACH ROW depth
first), before the partition takes its next command. Across batches, batch
order holds (commands arrive in timestamp order); OLTP calls interleave
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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from streamtx.errors import Aborted, Internal, NotFound, StreamTxError
from streamtx.procedure import Event, Row, StateProcedure
from streamtx.server import protocol as pr
from streamtx.server.catalog.compile import TS_PARAMS
from streamtx.server.catalog.placement import SINGLE
from streamtx.server.ipc import join_grouped, split_grouped
from streamtx.server.partition.engine import Engine
from streamtx.server.partition.exchange import Exchange, keep_owned
from streamtx.server.partition.marks import Mark, Taken
from streamtx.server.partition.ownership import Unspannable
from streamtx.server.protocol import Outcome, TeSpec
from streamtx.server.schedule import Key, Schedule, Unit, reason, skips
from streamtx.server.tuples import Batch, Values, arrow, concat

if TYPE_CHECKING:
    from streamtx.server.partition.journal import Journal, Logged
from streamtx.server.partition.state import run_values, table_rows
from streamtx.server.partition.transaction import Transaction


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
    wire: tuple[pr.Span, list[pa.Table]]  # as the front sent it: what the command log keeps
    values: list[list[Values]]  # each batch's rows, converted once for the span
    outcomes: list[Outcome] = field(default_factory=list)
    taken: list[Taken] = field(default_factory=list)
    keep: dict[str, list[int]] = field(default_factory=dict)
    rejected: int = 0
    runs: list[_Run] = field(default_factory=list)  # the batches that committed, for the meter
    aborted: list[str] = field(default_factory=list)  # procedures whose TE aborted (their batch rejected)

    @classmethod
    def from_wire(cls, c: pr.Span, tables: list[pa.Table]) -> _Span:
        batches, values = run_values(c.runs, tables[: len(c.runs)])
        pushes = [Push(s, producer, b, ts, t) for (s, producer, b, ts, _), t in zip(c.pushes, batches, strict=True)]
        exchange = Exchange.from_wire(c.exchange, tables[len(c.runs) :])
        assert exchange is not None
        exchange.span = True
        return cls(pushes, [list(i) for *_, i in c.pushes], exchange, (c, tables), values)


@dataclass
class _FlowItem:
    """A batch of a flow: taken whole (`streams` None), or only the tuples its entry TEs emitted elsewhere."""

    push: Push  # a batch taken whole; else its address, with no rows
    streams: dict[str, pa.Table] | None


@dataclass
class _Flow:
    """One stage of a flow (`run_flow`) and what it did, until `decide`."""

    stage: str
    items: list[_FlowItem]
    wire: tuple[pr.Flow, list[pa.Table]]  # as the front sent it: what the command log keeps
    outcomes: list[Outcome] = field(default_factory=list)
    emitted: list[dict[str, Batch]] = field(default_factory=list)
    taken: list[Taken] = field(default_factory=list)
    keep: dict[str, list[int]] = field(default_factory=dict)
    runs: list[_Run] = field(default_factory=list)

    @classmethod
    def from_wire(cls, c: pr.Flow, tables: list[pa.Table]) -> _Flow:
        relations = split_grouped(c.order, c.runs, tables)
        items: list[_FlowItem] = []
        at = 0
        for stream, producer, batch_id, ts, streams in c.items:
            if streams is None:
                items.append(_FlowItem(Push(stream, producer, batch_id, ts, relations[at]), None))
                at += 1
            else:
                rows = dict(zip(streams, relations[at : at + len(streams)], strict=True))
                items.append(_FlowItem(Push(stream, producer, batch_id, ts, pa.table({})), rows))
                at += len(streams)
        return cls(c.stage, items, (c, tables))

    def prepared(self) -> list[Push]:
        """What `Dataflow._prepare` loads state for: the batches taken whole, and the emitted tuples."""
        out = []
        for item in self.items:
            p = item.push
            if item.streams is None:
                out.append(p)
            else:
                out += [Push(s, p.producer, p.batch_id, p.ts, rows) for s, rows in item.streams.items()]
        return out


class Dataflow:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.journal: Journal | None = None  # the command log's writer; None while replaying it
        self._open = False  # a coordinated command's transaction is open, awaiting `decide`
        self.push_rows: dict[int, list[Row]] = {}  # ts -> its batch's rows, converted once by `_prefetch_sql`
        self._open_windows: Any = None
        self._open_stored: set[str] = set()
        self._open_specs: list[tuple[TeSpec, pa.Table]] = []
        self._open_timed: list[tuple[str, float]] = []  # the open transaction's TEs and their run times
        self._open_params: dict[str, Any] | None = None
        self._open_exchange: Exchange | None = None  # the open fragment's merged state rows, logged with it
        self._open_span: _Span | None = None  # the open span, if the open transaction is one
        self._open_flows: list[_Flow] = []  # the open flow's steps, if the open transaction is one
        self._open_epoch: int | None = None  # the open flow's first timestamp
        self._open_within: dict[Mark, int] = {}  # the marks its steps took
        self._open_checked = 0  # the open flow's writes its steps' `end_interval` checked already

    # ------------------------------------------------------------- commands
    def run_pushes(self, pushes: list[Push]) -> list[Outcome | StreamTxError]:
        """Takes queued batches, in order, in one DuckDB transaction when none aborts."""
        eng = self.engine
        results: list[Outcome | StreamTxError | None] = [None] * len(pushes)
        runs: list[tuple[int, _Run]] = []
        taken: list[Taken] = []
        within: dict[Mark, int] = {}  # marks taken in this interval, not committed yet
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
                dup = self._duplicate(p.producer, p.stream, p.batch_id, within.get((p.producer, p.stream), 0))
                if dup is not None:
                    results[i] = dup
                    continue
                run = _Run(self, p.ts)
                run.start_push(p)
                run.execute()
                taken.append((p.producer, p.stream, p.batch_id, p.ts))
                within[(p.producer, p.stream)] = p.batch_id
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
            self._metered(run)
        if self.journal is not None and runs:
            self.journal.interval([(pushes[i], run.logged) for i, run in runs])
            eng.meter.interval_tes.observe(sum(len(run.timed) for _, run in runs))
        eng.marks.took(taken)
        self._keep(keep)
        return results  # type: ignore[return-value]

    def run_reject(self, stream: str, producer: str, batch_id: int, ts: int, code: int, reason: str) -> Outcome:
        """Records a batch the front found bad as rejected (or answers DUPLICATE)."""
        eng = self.engine
        duplicate = self._duplicate(producer, stream, batch_id)
        if duplicate is not None:
            return duplicate
        eng.record_rejection(producer, stream, batch_id, ts, code, reason)
        if self.journal is not None:
            self.journal.reject(producer, stream, batch_id, ts, code, reason)
        eng.counters["rejected"] += 1
        return Outcome("rejected", ts, code, reason)

    def run_call(self, procedure: str, params: dict[str, Any], ts: int) -> tuple[Outcome, list[pa.Table]]:
        eng = self.engine
        if procedure not in eng.catalog.procedures:
            raise NotFound(f"unknown procedure {procedure!r}")
        eng.marks.ran(ts)

        def start(run: _Run) -> None:
            run.start_call(procedure, params)

        run = self._execute(ts, start)
        self._metered(run)
        if run.call_error is not None:
            eng.counters["calls_aborted"] += 1
            raise run.call_error
        eng.counters["calls"] += 1
        keep: dict[str, list[int]] = {}
        out = run.finish(keep)
        self._keep(keep)
        if self.journal is not None:
            self.journal.call(procedure, params, ts, run.logged)
        return out, run.results

    # ------------------------------------------------- coordinated commands
    def run_fragment(
        self, c: pr.Fragment, tables: list[pa.Table]
    ) -> tuple[pr.FragmentRan | pr.FragmentAborted | Outcome, list[pa.Table]]:
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
        if c.push is not None and not self._open:
            dup = self._duplicate(*c.push)
            if dup is not None:
                return dup, []
        if not self._open:
            eng.begin()
            self._open_windows = eng.windows.snapshot()
            self._open_stored = set()
            self._open_specs = []
            self._open_exchange = None
            self._open = True
        eng.coordinated = True
        inputs, extra = tables[: len(c.tes)], tables[len(c.tes) :]
        exchange = Exchange.from_wire(c.exchange, extra)
        run = _Run(self, c.ts)
        try:
            emitted, stored, results, result_ids = self.run_specs(c.ts, c.tes, inputs, c.params, exchange, run)
        except StreamTxError as e:
            self._rollback(self._open_windows)
            self._open = False
            self._open_specs = []
            self._open_timed = []
            self._open_exchange = None
            run.timed = []  # undone
            self._metered(run)  # counts the TE that aborted
            return pr.FragmentAborted(e.code.value[0], e.message), []
        finally:
            eng.coordinated = False
            eng.prepared.clear()
        self._open_specs += list(zip(c.tes, inputs, strict=True))
        self._open_timed += run.timed
        self._open_params = c.params
        self._open_exchange = exchange or self._open_exchange
        self._open_stored |= stored
        eng.counters["fragments"] += 1
        streams = sorted(emitted)
        out = [pa.concat_tables(emitted[s]) for s in streams]
        if c.autocommit:
            self.decide(pr.Decide(True, c.ts, c.mark))
        return pr.FragmentRan(streams, sorted(stored), result_ids), out + results

    def run_specs(
        self,
        ts: int,
        specs: Sequence[TeSpec],
        tables: list[pa.Table],
        params: dict[str, Any] | None,
        exchange: Exchange | None = None,
        run: _Run | None = None,
    ) -> tuple[dict[str, list[pa.Table]], set[str], list[pa.Table], list[int]]:
        """Runs TEs given one by one (a fragment, or replayed TEs): no PE trigger fires.

        With `exchange`, the fragment's state TE runs over the merged rows of a batch spanning partitions.
        `run` (a fragment's) gets the TEs' run times, and the procedure whose TE aborted.
        """
        self.engine.exchange = exchange
        try:
            return self._run_specs(ts, specs, tables, params, run or _Run(self, ts))
        finally:
            self.engine.exchange = None

    def _run_specs(
        self, ts: int, specs: Sequence[TeSpec], tables: list[pa.Table], params: dict[str, Any] | None, run: _Run
    ) -> tuple[dict[str, list[pa.Table]], set[str], list[pa.Table], list[int]]:
        run.call_params = params
        emitted: dict[str, list[pa.Table]] = {}
        results: list[pa.Table] = []
        result_ids: list[int] = []
        stored: set[str] = set()
        for spec, table in zip(specs, tables, strict=True):
            batch = table if spec.stream is not None else None
            tx = run._transaction(spec, batch)
            started = perf_counter()
            try:
                run._run_te(spec, tx, batch)
            except StreamTxError:
                if spec.procedure is not None:
                    run.aborted.append(spec.procedure)
                raise
            if spec.procedure is not None:
                run.timed.append((spec.procedure, perf_counter() - started))
            for s, parts in tx.emitted.items():
                emitted.setdefault(s, []).extend(map(arrow, parts))
            stored |= tx.stored
            if spec.stream is None:
                results += tx.results
                result_ids += tx.result_ids
        return emitted, stored, results, result_ids

    def replay_tes(
        self,
        ts: int,
        specs: Sequence[TeSpec],
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

    def _commit_with_mark(self, ts: int, mark: Any, stored: set[str], hold_back: bool = False) -> None:
        """Commits the open DuckDB transaction with the batch's dedup mark (if any) and stored outputs."""
        eng = self.engine
        if mark is not None:
            eng.record_mark(mark[0], mark[1], mark[2], ts)
        eng.commit(hold_back)
        if mark is not None:
            eng.marks.took([(mark[0], mark[1], mark[2], ts)])
        else:
            eng.marks.ran(ts)
        self._keep({s: [ts] for s in stored})

    def decide(self, c: pr.Decide) -> None:
        """Commits or undoes the open coordinated transaction; records the batch's mark or rejection."""
        eng = self.engine
        ts = c.ts
        span, self._open_span = self._open_span, None
        flows, self._open_flows, self._open_epoch, self._open_within = self._open_flows, [], None, {}
        hold_back = eng.executor == "opchain"  # as an interval's commit: what certainly fits waits
        if c.commit and self._open and flows:
            eng.commit(hold_back)
            self._commit_flow(flows, ts)
            if self.journal is not None:
                for flow in flows:
                    self.journal.flow(ts, *flow.wire)
        elif c.commit and self._open and span is not None:
            eng.commit(hold_back)
            self._commit_span(span)
            if self.journal is not None:
                self.journal.span(span.pushes[-1].ts, *span.wire)
        elif c.commit and self._open:
            self._commit_with_mark(ts, c.mark, self._open_stored, hold_back)
            if self.journal is not None:
                self.journal.fragments(ts, self._open_specs, self._open_params, c.mark, self._open_exchange)
                eng.meter.committed(self._open_timed, ts, None if c.mark is None else tuple(c.mark))
        elif self._open:
            self._rollback(self._open_windows)
        self._open = False
        self._open_stored = set()
        self._open_specs = []
        self._open_timed = []
        self._open_exchange = None
        if c.rejection is not None:
            producer, stream, batch_id, code, reason = c.rejection
            if not eng.marks.taken(producer, stream, batch_id):
                eng.record_rejection(producer, stream, batch_id, ts, code, reason)
                if self.journal is not None:
                    self.journal.reject(producer, stream, batch_id, ts, code, reason)

    # ------------------------------------------------------------------ spans
    def run_span(self, c: pr.Span, tables: list[pa.Table]) -> tuple[pr.SpanRan, list[pa.Table]]:
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
            raise Internal(f"span at ts {c.pushes[-1][3]}: a coordinated transaction is still open")
        span = _Span.from_wire(c, tables)
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
        return pr.SpanRan(span.outcomes), []

    def replay_span(self, c: pr.Span, tables: list[pa.Table]) -> None:
        """Re-runs a logged span as it committed (recovery)."""
        span = _Span.from_wire(c, tables)
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
        taken: list[Taken] = []
        within: dict[Mark, int] = {}
        eng.exchange = exchange
        try:
            for p, involved, values in zip(span.pushes, span.involved, span.values, strict=True):
                dup = self._duplicate(p.producer, p.stream, p.batch_id, within.get((p.producer, p.stream), 0))
                if dup is not None:
                    span.outcomes.append(dup)
                    continue
                exchange.involved = frozenset(involved)
                run = _Run(self, p.ts)
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
                    if run.failure is not None and run.failure.procedure is not None:
                        span.aborted.append(run.failure.procedure)
                else:
                    span.outcomes.append(run.finish(span.keep))
                    span.runs.append(run)
                taken.append((p.producer, p.stream, p.batch_id, p.ts))
                within[(p.producer, p.stream)] = p.batch_id
        finally:
            eng.exchange = None
        span.taken = taken
        eng.state.add_marks(taken)
        keep_owned(eng, exchange.ws)

    def _commit_span(self, span: _Span) -> None:
        """After the span's commit: marks, timestamps, counters and retained output, as the batches left them."""
        eng = self.engine
        eng.marks.took(span.taken)
        eng.marks.ran(span.pushes[-1].ts)
        self._keep(span.keep)
        committed = [p for p, o in zip(span.pushes, span.outcomes, strict=True) if o.outcome == "committed"]
        eng.counters["committed"] += len(committed)
        eng.counters["rows"] += sum(p.batch.num_rows for p in committed)
        eng.counters["rejected"] += span.rejected
        eng.counters["spans"] += 1
        for run in span.runs:
            self._metered(run)
        if span.aborted and self.journal is not None:
            eng.meter.aborted(span.aborted)

    # ------------------------------------------------------------------ flows
    def run_flow(self, c: pr.Flow, tables: list[pa.Table]) -> tuple[pr.FlowRan, list[pa.Table]]:
        """One step of a flow (front/flows.py), its batches in timestamp order, left open for `decide`.

        Stage "entry" runs each batch's entry TEs here, where its keys live, and
        returns what they emitted. Stage "rest" (home) runs, in timestamp
        order, the batches it owns whole and the other batches' remaining TEs
        from what their entry emitted: on this partition, every TE runs in the
        order it would on one partition. A flow's steps share one transaction.
        A TE that aborts, or a batch whose dataflow reaches a procedure placed
        beyond home, cuts the flow there: all of it is rolled back, and the
        front runs the batches before that one as a flow again, that one
        alone, then the rest.
        """
        eng = self.engine
        if c.first and self._open:
            raise Internal(f"flow at ts {c.epoch}: a coordinated transaction is still open")
        if not c.first and (self._open_epoch != c.epoch or not self._open):
            return pr.FlowRan([], cut=0), []  # this flow was cut here already
        flow = _Flow.from_wire(c, tables)
        if c.first:
            self._open_windows = eng.windows.snapshot()
            eng.begin()
            self._open, self._open_epoch, self._open_flows, self._open_within = True, c.epoch, [], {}
            self._open_checked = 0
        try:
            cut = self._flow(flow, self._open_within)
            if cut is None:  # what might not fit is written now, so that the commit cannot fail
                eng.state.end_interval(self._open_checked)
                self._open_checked = len(eng.state.ws.undo or ())
        except duckdb.Error:  # rows a constraint refuses at the write-back: the first batch runs alone
            cut = 0
        except BaseException:
            self._undo_flow()
            raise
        if cut is not None:
            self._undo_flow()
            return pr.FlowRan([], cut=cut), []
        self._open_flows.append(flow)
        names = [sorted(e) for e in flow.emitted]
        rows = [e[s] for e, streams in zip(flow.emitted, names, strict=True) for s in streams]
        order, runs, joined = join_grouped(rows, [s for streams in names for s in streams])
        return pr.FlowRan(flow.outcomes, names, order, runs), joined

    def _undo_flow(self) -> None:
        self._rollback(self._open_windows)
        self._open, self._open_epoch, self._open_flows, self._open_within = False, None, [], {}

    def replay_flow(self, c: pr.Flow, tables: list[pa.Table], ts: int) -> None:
        """Re-runs a logged flow stage as it committed (recovery)."""
        eng = self.engine
        flow = _Flow.from_wire(c, tables)
        saved = eng.windows.snapshot()
        eng.begin()
        try:
            cut = self._flow(flow, {})
            if cut is not None:
                raise Internal(f"flow at ts {ts}: its batch at ts {flow.items[cut].push.ts} does not run again")
            eng.commit()
        except BaseException:
            self._rollback(saved)
            raise
        # its clock goes to its own last batch: a flow's later steps have records of their own
        self._commit_flow([flow], max(i.push.ts for i in flow.items))

    def _flow(self, flow: _Flow, within: dict[Mark, int]) -> int | None:
        """The step's batches in order, inside the open transaction; the index of the batch that cuts it, if one.

        `within`: the marks the flow's earlier steps took, not committed yet.
        """
        eng = self.engine
        taken: list[Taken] = []
        dups: dict[int, Outcome | None] = {}  # by ts: a FOR EACH ROW batch's rows come as items of one step
        try:
            if eng.executor == "opchain":
                self._prepare(flow.prepared())
            for i, item in enumerate(flow.items):
                p = item.push
                run = _Run(self, p.ts)
                run.stage = flow.stage
                if item.streams is None:
                    if p.ts not in dups:
                        last = within.get((p.producer, p.stream), 0)
                        dups[p.ts] = self._duplicate(p.producer, p.stream, p.batch_id, last)
                    dup = dups[p.ts]
                    if dup is not None:
                        flow.outcomes.append(dup)
                        flow.emitted.append({})
                        continue
                    run.start_push(p)
                else:
                    run.schedule.resume(item.streams)
                try:
                    run.execute()
                except (StreamTxError, _Cascade):
                    return i
                flow.outcomes.append(run.finish(flow.keep))
                flow.emitted.append(run.outputs)
                flow.runs.append(run)
                if item.streams is None and (not taken or taken[-1][3] != p.ts):
                    taken.append((p.producer, p.stream, p.batch_id, p.ts))
                    within[(p.producer, p.stream)] = p.batch_id
        finally:
            eng.prepared.clear()
        flow.taken = taken
        eng.state.add_marks(taken)
        return None

    def _commit_flow(self, flows: list[_Flow], ts: int) -> None:
        """After a flow's commit: marks, clock, counters and retained output, as its steps left them."""
        eng = self.engine
        for flow in flows:
            eng.marks.took(flow.taken)
            self._keep(flow.keep)
            whole = {t[3] for t in flow.taken}
            eng.counters["committed"] += len(whole)
            eng.counters["rows"] += sum(i.push.batch.num_rows for i in flow.items if i.push.ts in whole)
            for run in flow.runs:
                self._metered(run)
        eng.marks.ran(ts)

    # ------------------------------------------------------------- internals
    def _push_isolated(self, p: Push) -> Outcome:
        eng = self.engine

        def start(run: _Run) -> None:
            run.start_push(p)

        run = self._execute(p.ts, start)
        self._metered(run)
        keep: dict[str, list[int]] = {}
        out = run.finish(keep)
        self._keep(keep)
        if out.outcome != "rejected":  # a rejection took its mark with its record (`_Run.undone`)
            eng.marks.took([(p.producer, p.stream, p.batch_id, p.ts)])
        if self.journal is not None:
            self.journal.push(p, run.logged, rejected=out.outcome == "rejected", outcome=out)
        if out.outcome == "rejected":
            eng.counters["rejected"] += 1
            return out
        eng.counters["committed"] += 1
        eng.counters["rows"] += p.batch.num_rows
        return out

    def _execute(self, ts: int, start: Callable[[_Run], None]) -> _Run:
        """The isolated path: a command's TEs in one transaction, each aborted TE left out, as if undone alone.

        DuckDB has no savepoints, so an aborted TE cannot be undone by itself:
        the transaction is rolled back and the command run again from the
        start without it (and without the rest of its transaction group).
        Execution is deterministic, so every TE before it does exactly what it
        did, and leaving out an aborted TE is undoing it. An entry TE that
        aborts rejects the batch; a call's own TE that aborts fails the call.
        """
        eng = self.engine
        skip: dict[Key, str | None] = {}
        aborted: list[str] = []  # the procedures whose TE aborted, attempt after attempt
        while True:
            run = _Run(self, ts, skip=skip, isolated=True)
            run.aborted = aborted
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
                if failure.procedure is not None:
                    aborted.append(failure.procedure)
                if not run.undone(failure, e):
                    return run
                skip = {**skip, **skips(failure.undone, f"{failure.procedure}: {failure.reason(e)}")}
            except BaseException:
                self._rollback(saved)
                raise

    def _metered(self, run: _Run) -> None:
        """A finished command's TEs into the partition's meter: live work only, not what recovery replays."""
        if self.journal is None:
            return
        meter = self.engine.meter
        if run.aborted:
            meter.aborted(run.aborted)
        if run.timed:
            p = run.push
            meter.committed(run.timed, run.ts, None if p is None else (p.producer, p.stream, p.batch_id))

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
        shared = _shared_ts(pushes)
        for p in pushes:
            if p.stream not in consumers:
                consumers[p.stream] = self._state_consumer(p.stream)
            consumer = consumers[p.stream]
            if consumer is not None and (p.batch.num_rows < 2 or not eng.catalog.procedures[consumer[0]].each_row):
                taken.append((p, *consumer))
        self._prefetch_sql(pushes, shared)
        events: list[Event] = []
        for (p, name, fn), rows in zip(taken, _push_rows([p for p, _, _ in taken]), strict=True):
            ts = p.ts
            prepared = [Event(row, ts) for row in rows]
            try:
                for ev in prepared:
                    fn.pre_process(ev)
            except Exception:
                continue
            if ts not in shared:  # else each TE prepares its own: they are looked up by timestamp
                eng.prepared[(ts, name)] = prepared
            events += prepared
        eng.state.load_for(events)
        eng.prepared_epoch = eng.state.ws.epoch

    def _prefetch_sql(self, pushes: list[Push], shared: set[int]) -> None:
        """Loads, for the whole interval at once, the rows the SQL procedures' compiled statements will look up
        by keys their batches hold (TStream's step 2 for SQL: one query per table, not one per batch).

        `shared`: timestamps of several pushes (a flow's FOR EACH ROW rows), whose rows are not kept by ts."""
        eng = self.engine
        cat = eng.catalog
        wanted: dict[str, list[Any]] = {}
        self.push_rows = {}
        lookups_of: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        for p in pushes:
            if p.stream not in lookups_of:
                lookups_of[p.stream] = [
                    f
                    for proc in cat.consumers.get(p.stream, [])
                    if cat.procedures[proc].python is None
                    for f in eng.sql_plans.prefetch(proc, cat.plans[proc].statements)
                ]
        looked_up = [p for p in pushes if lookups_of[p.stream]]
        for p, rows in zip(looked_up, _push_rows(looked_up), strict=True):
            lookups = lookups_of[p.stream]
            params = dict.fromkeys(TS_PARAMS, p.ts)
            if p.ts not in shared:
                self.push_rows[p.ts] = rows
            for row in rows:
                for table, key in lookups:
                    try:
                        wanted.setdefault(table, []).append(key(row, params))
                    except Exception:  # the statement itself will fail on this row, and say why
                        continue
        for table, keys in wanted.items():
            eng.state.load(table, keys)

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
        for stream, stamps in keep.items():
            self.engine.retain(stream, stamps)

    def _duplicate(self, producer: str, stream: str, batch_id: int, within: int = 0) -> Outcome | None:
        """DUPLICATE with the original outcome if the batch was taken: committed, or `within` the open interval."""
        eng = self.engine
        if batch_id > within and not eng.marks.taken(producer, stream, batch_id):
            return None
        eng.counters["duplicates"] += 1
        return eng.original_outcome(producer, stream, batch_id)

    def run_body(self, tx: Transaction, procedure: str) -> None:
        """Feeds the procedure's windows with its input, then runs its code."""
        cat = self.engine.catalog
        proc = cat.procedures[procedure]
        if tx.input_stream is not None and tx.input is not None and not tx.away:
            for window in self.engine.owned_windows(procedure):
                self.engine.windows.feed(tx, window, tx.input_stream, tx.input)
        if proc.python is not None:
            tx.run_python(self.engine.python_code(proc.python))
        else:  # the batch is registered for DuckDB only if a statement runs there (Transaction._run)
            tx.run_plan(tx.statements_of(procedure))


def _shared_ts(pushes: list[Push]) -> set[int]:
    """Timestamps that several of the pushes carry: the rows of one FOR EACH ROW batch, items of a flow."""
    seen: set[int] = set()
    shared: set[int] = set()
    for p in pushes:
        (shared if p.ts in seen else seen).add(p.ts)
    return shared


class _Cascade(Exception):
    """A flow's batch reaches a procedure that runs beyond the home partition: it leaves the flow."""


@dataclass
class _Failure:
    """Where a TE aborted: what to leave out when the command runs again (`Dataflow._execute`)."""

    procedure: str | None
    undone: list[tuple[Key, Unit]]  # its unit and the earlier units of its open transaction group
    group: str | None

    def reason(self, error: StreamTxError) -> str:
        return reason(self.group, error.message)


class _Run:
    """The TEs one command causes on this partition, in the order its `Schedule` gives (server/schedule.py)."""

    def __init__(self, flow: Dataflow, ts: int, skip: dict[Key, str | None] | None = None, isolated: bool = False):
        self.flow = flow
        self.eng = flow.engine
        self.ts = ts
        self.schedule = Schedule(self.eng.catalog, skip)
        self.out = Outcome("committed", ts)
        self.push: Push | None = None
        self.call_params: dict[str, Any] | None = None
        self.call_error: StreamTxError | None = None
        self.results: list[pa.Table] = []
        self.stored: set[str] = set()
        self.isolated = isolated
        self.failure: _Failure | None = None
        self.logged: Logged = []  # committed TEs, for strong logging
        self.timed: list[tuple[str, float]] = []  # each procedure's TE and its run time, for the meter
        self.aborted: list[str] = []  # procedures whose TE aborted (`Dataflow._execute`)
        self.values: dict[str, tuple[pa.Table, list[Values]]] = {}  # a span push's rows, converted by `_span`
        self.stage: str | None = None  # a flow's stage (front/flows.py): "entry" or "rest"
        self.outputs: dict[str, Batch] = {}  # stage "entry": what the entry TEs emitted for other TEs

    def start_push(self, p: Push) -> None:
        """The batch's entry unit: every consumer of its stream, taken or refused together."""
        self.push = p
        self.schedule.push(p.stream, p.batch)

    def start_call(self, procedure: str, params: dict[str, Any]) -> None:
        self.call_params = params
        self.schedule.call(procedure)

    def finish(self, keep: dict[str, list[int]]) -> Outcome:
        """After the commit: notes the output batches to keep for subscribers in `keep`."""
        for stream in sorted(self.stored):
            kept = keep.setdefault(stream, [])
            if not kept or kept[-1] != self.ts:  # a FOR EACH ROW batch's rows in a flow: one ts, several runs
                kept.append(self.ts)
            self.out.emitted.add(stream)
        return self.out

    # -------------------------------------------------------------- execution
    def execute(self) -> None:
        """Every TE inside the caller's transaction; an abort propagates to the caller (with `failure` set).

        In a flow (`Dataflow.run_flow`), stage "entry" runs the entry unit only,
        and stage "rest" raises `_Cascade` at a unit that does not run on the
        home partition alone.
        """
        placement = self.eng.catalog.placement
        for _, unit in self.schedule:
            if self.stage is not None and not unit.entry:
                if self.stage == "entry":
                    break
                if any(placement.procedures[p] != SINGLE for p in unit.procedures):
                    raise _Cascade(unit.procedures[0])
            self._unit(unit)
        if self.schedule.aborted:
            self.eng.counters["tes_aborted"] += len(self.schedule.aborted)
            self.out.aborted_tes += self.schedule.aborted

    def undone(self, failure: _Failure, error: StreamTxError) -> bool:
        """After a rollback: False when the abort ends the command (batch rejected, call failed), else True."""
        eng = self.eng
        undone = [unit for _, unit in failure.undone]
        if any(u.entry for u in undone):
            assert self.push is not None
            reason = failure.reason(error)
            code = error.code.value[0]
            self.out = Outcome("rejected", self.ts, code, reason)
            self.stored = set()
            self.logged = []
            self.timed = []
            eng.record_rejection(self.push.producer, self.push.stream, self.push.batch_id, self.ts, code, reason)
            return False
        if self.call_params is not None and any(u.stream is None for u in undone):
            self.call_error = error
            self.timed = []
            return False
        return True

    # -------------------------------------------------------------- helpers
    def _unit(self, unit: Unit) -> None:
        """Runs a unit's TEs: its procedures in order, the first appending the batch if it is the entry."""
        batch = self.schedule.input(unit)
        for i, procedure in enumerate(unit.procedures or (None,)):
            te = TeSpec(procedure, unit.stream, unit.border and i == 0, unit.entry)
            tx = self._transaction(te, batch)
            started = perf_counter()
            try:
                self._run_te(te, tx, batch)
                if self.isolated:  # rows a constraint refuses abort this TE, not the command
                    self.eng.state.write_back_in(procedure)
            except StreamTxError:
                self.failure = _Failure(procedure, list(self.schedule.instance), unit.group)
                raise
            if procedure is not None:
                self.timed.append((procedure, perf_counter() - started))
            self.logged.append((te, batch))
            self._done(unit, tx)

    def _transaction(self, te: TeSpec, batch: Batch | None) -> Transaction:
        known = self.values.get(te.stream) if batch is not None and te.stream is not None else None
        tx = Transaction(
            self.eng,
            te.procedure,
            self.ts,
            te.stream,
            batch,
            self.call_params if te.stream is None else None,
            known[1] if known is not None and known[0] is batch else None,
        )
        if te.border and self.push is not None and batch is self.push.batch:
            tx.input_rows = self.flow.push_rows.get(self.ts)
        return tx

    def _run_te(self, te: TeSpec, tx: Transaction, batch: Batch | None) -> None:
        cat = self.eng.catalog
        if te.border:
            assert te.stream is not None and batch is not None
            if te.stream in cat.retained:  # stored with the interval's other output, at the commit
                self.eng.state.pending.out.setdefault(te.stream, []).append((self.ts, arrow(batch)))
                tx.stored.add(te.stream)
            elif self.eng.stream_triggers(te.stream):
                tx.fire_stream_triggers(te.stream, batch)
        if te.procedure is not None:
            self.flow.run_body(tx, te.procedure)

    def _done(self, unit: Unit, tx: Transaction) -> None:
        """A TE finished: its results, stored streams, and its output for the TEs it triggers (PE triggers)."""
        self.out.tes += 1
        if unit.stream is None:
            self.results = tx.results
        self.stored |= tx.stored
        for stream, parts in tx.emitted.items():
            rows = concat(parts)
            if self.stage == "entry" and self.eng.catalog.consumers.get(stream):
                before = self.outputs.get(stream)  # the entry unit's TEs may emit to one stream, in their order
                self.outputs[stream] = rows if before is None else concat([before, rows])  # Arrow once per step
            self.schedule.emitted(unit, stream, rows)


def _push_rows(pushes: list[Push]) -> list[list[Row]]:
    """Each push's rows, its stream's batches converted together (`_rows_per_batch`)."""
    by_stream: dict[str, list[pa.Table]] = {}
    for p in pushes:
        by_stream.setdefault(p.stream, []).append(p.batch)
    rows = {stream: iter(_rows_per_batch(batches)) for stream, batches in by_stream.items()}
    return [next(rows[p.stream]) for p in pushes]


def _rows_per_batch(batches: list[pa.Table]) -> list[list[Row]]:
    """Each batch's rows (`to_pylist`), converted together: one conversion per interval, not per batch."""
    if len(batches) == 1:
        return [table_rows(batches[0])]
    try:
        rows = table_rows(pa.concat_tables(batches))
    except pa.ArrowInvalid:  # schemas differ: one by one
        return [table_rows(b) for b in batches]
    out = []
    at = 0
    for b in batches:
        out.append(rows[at : at + b.num_rows])
        at += b.num_rows
    return out
