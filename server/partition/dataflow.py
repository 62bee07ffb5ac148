"""The streaming scheduler of a partition: border TEs, then PE-triggered TEs.

For one atomic batch, `run_push` executes the border TE of the batch's stream
and then every TE its outputs trigger, choosing each time among the ready TEs
by the graph's topological rank, before the partition takes its next command.
Hence, per batch, the TEs run in a topological order of the graph; across
batches, batch order holds (commands arrive in timestamp order); OLTP calls
interleave between batches.

Each TE is its own DuckDB transaction, except that the TEs of a transaction
group (S-Store's nested transactions) share one: nothing outside the group
sees the state between them, and if one aborts the whole group is undone.
An aborted TE (or group) is reported and the dataflow goes on.

Stream tuples are stored only while some TE still has to consume them; the
last consumer deletes them in its own transaction. A stream nothing consumes
keeps its batches for subscribers, up to the retention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from streamtx.errors import NotFound, StreamTxError
from streamtx.server.catalog.compile import BATCH_PARAM, STREAM_SCHEMA, batch_relation, quote
from streamtx.server.partition.engine import Engine
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


@dataclass
class _TE:
    """A ready TE: `procedure` (None: no consumer, a plain append) over `stream`'s batch."""

    procedure: str | None
    stream: str | None
    group: str | None
    border: bool = False
    origin_group: str | None = None  # the open group whose TE emitted its input, if any


@dataclass
class _Border:
    producer: str
    batch_id: int
    store: bool


class Dataflow:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # ------------------------------------------------------------- commands
    def run_push(self, stream: str, producer: str, batch_id: int, ts: int, batch: pa.Table) -> Outcome:
        eng = self.engine
        cat = eng.catalog
        if stream not in cat.streams:
            raise NotFound(f"unknown stream {stream!r}")
        duplicate = self._duplicate(producer, stream, batch_id)
        if duplicate is not None:
            return duplicate
        eng.last_ts = max(eng.last_ts, ts)
        consumers = cat.consumers.get(stream, [])
        first = consumers[0] if consumers else None
        run = _Run(self, ts, {stream: batch})
        run.remaining[stream] = len(consumers)
        stored = len(consumers) > 1 or (not consumers and stream not in cat.transient)
        run.border = _Border(producer, batch_id, store=stored)
        run.pending.append(_TE(first, stream, cat.group_of(first) if first else None, border=True))
        run.pending += [_TE(proc, stream, cat.group_of(proc)) for proc in consumers[1:]]
        run.execute()
        out = run.out
        if out.outcome == "rejected":
            eng.counters["rejected"] += 1
            return out
        eng.marks[(producer, stream)] = batch_id
        eng.counters["committed"] += 1
        eng.counters["rows"] += batch.num_rows
        if not consumers and stream not in cat.transient:
            eng.retain(stream, ts)
            out.emitted.add(stream)
        return out

    def run_reject(self, stream: str, producer: str, batch_id: int, ts: int, code: int, reason: str) -> Outcome:
        """Records a batch the front found bad as rejected (or answers DUPLICATE)."""
        eng = self.engine
        duplicate = self._duplicate(producer, stream, batch_id)
        if duplicate is not None:
            return duplicate
        eng.last_ts = max(eng.last_ts, ts)
        eng.record_rejection(producer, stream, batch_id, ts, code, reason)
        eng.counters["rejected"] += 1
        return Outcome("rejected", ts, code, reason)

    def run_call(self, procedure: str, params: dict[str, Any], ts: int) -> tuple[Outcome, list[pa.Table]]:
        eng = self.engine
        if procedure not in eng.catalog.procedures:
            raise NotFound(f"unknown procedure {procedure!r}")
        eng.last_ts = max(eng.last_ts, ts)
        run = _Run(self, ts, {})
        run.call_params = params
        run.pending.append(_TE(procedure, None, eng.catalog.group_of(procedure)))
        run.execute()
        if run.call_error is not None:
            eng.counters["calls_aborted"] += 1
            raise run.call_error
        eng.counters["calls"] += 1
        return run.out, run.results

    # ------------------------------------------------------------- internals
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
        if tx.input_stream is not None and tx.batch is not None:
            for window in cat.owned_windows(procedure):
                self.engine.windows.feed(tx, window, tx.input_stream, tx.batch)
        if proc.python is not None:
            tx.run_python(self.engine.loader.resolve(proc.python))
        else:
            tx.run_plan(cat.plans[procedure].statements)


class _Run:
    """The TEs one command causes, executed in a topological order of the graph."""

    def __init__(self, flow: Dataflow, ts: int, inputs: dict[str, pa.Table]) -> None:
        self.flow = flow
        self.eng = flow.engine
        self.ts = ts
        self.inputs = inputs
        self.remaining: dict[str, int] = {}
        self.pending: list[_TE] = []
        self.out = Outcome("committed", ts)
        self.border: _Border | None = None
        self.call_params: dict[str, Any] | None = None
        self.call_error: StreamTxError | None = None
        self.results: list[pa.Table] = []
        self._group: str | None = None  # the open transaction group
        self._group_tes: list[tuple[_TE, Transaction]] = []
        self._saved_windows: Any = None
        self.transient = self.eng.catalog.transient

    def execute(self) -> None:
        while self.pending:
            te = self._next()
            if self._group is not None and te.group != self._group:
                self._commit()
            if self._group is None:
                self._begin(te.group)
            tx = Transaction(
                self.eng,
                te.procedure,
                self.ts,
                te.stream,
                self.inputs.get(te.stream) if te.stream else None,
                self.call_params if te.stream is None else None,
            )
            try:
                self._run_te(te, tx)
            except StreamTxError as e:
                tx.close()
                self._abort(te, e)
                continue
            tx.close()
            self.out.tes += 1
            if te.procedure is not None and te.stream is None:
                self.results = tx.results
            if self._group is None:
                self.eng.con.execute("COMMIT")
                self._absorb(tx, None)
            else:
                self._group_tes.append((te, tx))
                self._absorb(tx, self._group)
        if self._group is not None:
            self._commit()

    def _next(self) -> _TE:
        """The ready TE to run next: a member of the open group first, else by topological rank."""
        rank = self.eng.catalog.topo_rank
        candidates = [t for t in self.pending if self._group is not None and t.group == self._group]
        pool = candidates or self.pending
        best = min(pool, key=lambda t: (rank.get(t.procedure or "", -1), t.procedure or ""))
        self.pending.remove(best)
        return best

    def _begin(self, group: str | None) -> None:
        self.eng.con.execute("BEGIN")
        self._saved_windows = self.eng.windows.snapshot()
        self._group = group
        self._group_tes = []

    def _commit(self) -> None:
        self.eng.con.execute("COMMIT")
        self._group = None
        self._group_tes = []

    def _run_te(self, te: _TE, tx: Transaction) -> None:
        eng = self.eng
        tx.register_input()
        if te.border:
            assert self.border is not None and te.stream is not None
            if self.border.store:
                eng.con.execute(
                    f"INSERT INTO {STREAM_SCHEMA}.{quote(te.stream)} SELECT *, ${BATCH_PARAM} "
                    f"FROM {quote(batch_relation(te.stream))}",
                    {BATCH_PARAM: self.ts},
                )
            tx.fire_stream_triggers(te.stream, self.inputs[te.stream])
        if te.procedure is not None:
            self.flow.run_body(tx, te.procedure)
        if te.stream is not None and te.procedure is not None:
            self.remaining[te.stream] -= 1
            if self.remaining[te.stream] == 0 and not (te.border and not self.border.store):
                eng.consume(te.stream, self.ts)
        if te.border:
            eng.record_mark(self.border.producer, te.stream, self.border.batch_id, self.ts)

    def _abort(self, te: _TE, error: StreamTxError) -> None:
        """Undoes the open transaction (the TE, or its whole group) and reports it."""
        eng = self.eng
        eng.con.execute("ROLLBACK")
        eng.windows.restore(self._saved_windows)
        group = self._group
        undone = [t for t, _ in self._group_tes] + [te]
        self._group = None
        self._group_tes = []
        if te.stream is not None and te.procedure is not None:
            self.remaining[te.stream] -= 1
        if group is not None:
            self.pending = [t for t in self.pending if t.origin_group != group]
        code = error.code.value[0]
        reason = error.message if group is None else f"transaction group {group} undone: {error.message}"
        if any(t.border for t in undone):
            assert self.border is not None and undone[0].stream is not None
            self.out = Outcome("rejected", self.ts, code, reason)
            eng.record_rejection(self.border.producer, undone[0].stream, self.border.batch_id, self.ts, code, reason)
            self.pending = []
            return
        if self.call_params is not None and any(t.stream is None for t in undone):
            self.call_error = error
            self.pending = []
            return
        eng.counters["tes_aborted"] += 1
        self.out.aborted_tes.append(f"{te.procedure}: {reason}")
        for t in undone:  # their inputs count as consumed all the same: the dataflow moves on
            emitted_inside = group is not None and t.origin_group == group
            if t.stream is not None and not emitted_inside and self.remaining.get(t.stream) == 0:
                eng.consume(t.stream, self.ts)

    def _absorb(self, tx: Transaction, group: str | None) -> None:
        """Schedules the consumers of the streams a TE emitted on (PE triggers)."""
        cat = self.eng.catalog
        for stream, parts in tx.emitted.items():
            rows = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            prior = self.inputs.get(stream)
            self.inputs[stream] = rows if prior is None else pa.concat_tables([prior, rows])
            consumers = cat.consumers.get(stream, [])
            if not consumers:
                if stream not in self.transient:
                    self.eng.retain(stream, self.ts)
                    self.out.emitted.add(stream)
                continue
            if stream in self.remaining and prior is not None:
                continue  # already scheduled; they will read the grown batch
            self.remaining[stream] = len(consumers)
            for proc in consumers:
                self.pending.append(_TE(proc, stream, cat.group_of(proc), origin_group=group))
