"""The streaming scheduler of a partition: border TEs, then PE-triggered TEs.

For one atomic batch, `run_push` executes the border TE(s) of the batch's
stream and then every TE its outputs trigger, in the topological order of the
dataflow graph, before the partition takes its next command. Hence, per batch,
the graph order holds; across batches, batch order holds (commands arrive in
timestamp order); OLTP calls interleave between batches.

Each TE is its own DuckDB transaction. An aborted TE is undone and reported;
the dataflow goes on with the next TE or batch. Stream tuples are stored only
while some TE still has to consume them (or, for a stream nothing consumes,
for subscribers up to the retention).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from streamtx.server.catalog.compile import BATCH_PARAM, STREAM_SCHEMA, batch_relation, quote
from streamtx.server.partition.engine import Engine
from streamtx.server.partition.transaction import Transaction

from streamtx.errors import Aborted, NotFound, StreamTxError


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


class Dataflow:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # ------------------------------------------------------------- commands
    def run_push(self, stream: str, producer: str, batch_id: int, ts: int, batch: pa.Table) -> Outcome:
        eng = self.engine
        cat = eng.catalog
        if stream not in cat.streams:
            raise NotFound(f"unknown stream {stream!r}")
        if batch_id <= eng.marks.get((producer, stream), 0):
            eng.counters["duplicates"] += 1
            orig = eng.original_outcome(producer, stream, batch_id)
            return Outcome("duplicate", orig["ts"], orig["code"], orig["reason"], orig["original"])
        eng.last_ts = max(eng.last_ts, ts)
        consumers = cat.consumers.get(stream, [])
        first = consumers[0] if consumers else None
        out = Outcome("committed", ts)
        tx = Transaction(eng, first, ts, stream, batch)
        eng.con.execute("BEGIN")
        try:
            tx.register_input()
            if len(consumers) != 1:
                self._store(stream, ts, batch)
            tx.fire_stream_triggers(stream, batch)
            if first is not None:
                self._run_body(tx, first)
            eng.record_mark(producer, stream, batch_id, ts)
            eng.con.execute("COMMIT")
        except StreamTxError as e:
            eng.con.execute("ROLLBACK")
            tx.close()
            eng.record_rejection(producer, stream, batch_id, ts, e.code.value[0], e.message)
            eng.counters["rejected"] += 1
            return Outcome("rejected", ts, e.code.value[0], e.message)
        tx.close()
        eng.marks[(producer, stream)] = batch_id
        eng.counters["committed"] += 1
        eng.counters["rows"] += batch.num_rows
        out.tes += 1
        if not consumers:
            eng.retain(stream, ts)
            out.emitted.add(stream)
        pending: list[tuple[int, str, str]] = []
        for proc in consumers[1:]:
            heapq.heappush(pending, (cat.topo_rank.get(proc, 0), proc, stream))
        inputs = {stream: batch}
        self._absorb(tx, inputs, pending, out)
        self._run_pending(pending, inputs, ts, out)
        return out

    def run_call(self, procedure: str, params: dict[str, Any], ts: int) -> tuple[Outcome, list[pa.Table]]:
        eng = self.engine
        if procedure not in eng.catalog.procedures:
            raise NotFound(f"unknown procedure {procedure!r}")
        eng.last_ts = max(eng.last_ts, ts)
        tx = Transaction(eng, procedure, ts, params=params)
        out = Outcome("committed", ts)
        eng.con.execute("BEGIN")
        try:
            self._run_body(tx, procedure)
            eng.con.execute("COMMIT")
        except StreamTxError:
            eng.con.execute("ROLLBACK")
            tx.close()
            eng.counters["calls_aborted"] += 1
            raise
        tx.close()
        eng.counters["calls"] += 1
        out.tes += 1
        pending: list[tuple[int, str, str]] = []
        inputs: dict[str, pa.Table] = {}
        self._absorb(tx, inputs, pending, out)
        self._run_pending(pending, inputs, ts, out)
        return out, tx.results

    # ------------------------------------------------------------- internals
    def _run_body(self, tx: Transaction, procedure: str) -> None:
        proc = self.engine.catalog.procedures[procedure]
        if proc.python is not None:
            tx.run_python(self.engine.loader.resolve(proc.python))
        else:
            tx.run_plan(self.engine.catalog.plans[procedure].statements)

    def _store(self, stream: str, ts: int, batch: pa.Table) -> None:
        self.engine.con.execute(
            f"INSERT INTO {STREAM_SCHEMA}.{quote(stream)} SELECT *, ${BATCH_PARAM} "
            f"FROM {quote(batch_relation(stream))}",
            {BATCH_PARAM: ts},
        )

    def _absorb(self, tx: Transaction, inputs: dict[str, pa.Table], pending: list, out: Outcome) -> None:
        """Schedules the consumers of the streams a committed TE emitted on (PE triggers)."""
        cat = self.engine.catalog
        for stream, parts in tx.emitted.items():
            rows = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            prior = inputs.get(stream)
            inputs[stream] = rows if prior is None or prior is tx.batch else pa.concat_tables([prior, rows])
            consumers = cat.consumers.get(stream, [])
            if not consumers:
                self.engine.retain(stream, tx.batch_id)
                out.emitted.add(stream)
            for proc in consumers:
                heapq.heappush(pending, (cat.topo_rank.get(proc, 0), proc, stream))

    def _run_pending(self, pending: list, inputs: dict[str, pa.Table], ts: int, out: Outcome) -> None:
        eng = self.engine
        cat = eng.catalog
        remaining = {s: len(cat.consumers.get(s, [])) for s in inputs}
        done_first = {s for s in inputs if s in remaining and _border_done(cat, s)}
        for s in done_first:
            remaining[s] -= 1
        while pending:
            _, proc, stream = heapq.heappop(pending)
            remaining[stream] = remaining.get(stream, len(cat.consumers.get(stream, []))) - 1
            last = remaining[stream] <= 0
            tx = Transaction(eng, proc, ts, stream, inputs[stream])
            eng.con.execute("BEGIN")
            try:
                tx.register_input()
                self._run_body(tx, proc)
                if last:
                    eng.consume(stream, ts)
                eng.con.execute("COMMIT")
            except StreamTxError as e:
                eng.con.execute("ROLLBACK")
                tx.close()
                eng.counters["tes_aborted"] += 1
                out.aborted_tes.append(f"{proc}: {e.message}")
                if last:
                    eng.consume(stream, ts)
                continue
            tx.close()
            eng.counters["tes"] += 1
            out.tes += 1
            self._absorb(tx, inputs, pending, out)


def _border_done(cat: Any, stream: str) -> bool:
    """Whether the first consumer of a pushed stream already ran inside the border TE."""
    return cat.is_border(stream) and bool(cat.consumers.get(stream))


__all__ = ["Dataflow", "Outcome", "Aborted"]
