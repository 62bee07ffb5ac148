"""What a partition writes to its command log (partition/replay.py reads it back in recovery).

Modes (`--durability`):

- `weak`: the commands a partition takes from outside are logged: each atomic
  batch (PUSH: its stream, producer, batch id, timestamp and tuples; the
  batches one interval committed together are one PUSHES record), OLTP call
  (CALL), front-side rejection (REJECT), deploy (INSTALL), and the fragments of
  coordinated commands it committed (FRAGMENTS: their inputs came from other
  partitions, so they cannot be re-derived here; a state TE's fragment keeps
  the rows the partitions merged for it, partition/exchange.py), and spans
  (SPAN: a punctuation interval of state batches over several partitions,
  with the rows they merged; both modes log it whole), and flow stages (FLOW:
  the batches of a flow's step as this partition ran them, front/flows.py;
  both modes log it whole), and migration steps (MIGRATE: the new partition
  map and the rows that moved here, partition/migration.py; both modes).
  Replay re-runs each command
  with PE triggers on, which re-derives every interior TE (upstream backup).
- `strong`: every committed TE is logged, border and interior alike (TE: the
  procedure, its input tuples or parameters, its timestamp, the batch's dedup
  id on the border TE), as consecutive records `i of n` per command; the
  batches one interval committed together are one record (INTERVAL: every
  batch's TEs, their input tuples joined per schema). Replay re-executes each
  TE alone, PE triggers off. A command whose last records are missing (the
  torn tail of a crash) was never acknowledged and is dropped.
- `off`: nothing is logged; acknowledgements do not wait.

Records are appended after the DuckDB commit, in commit order; the worker
acknowledges a command only once its last record is durable (group commit).
The in-memory database itself is never durable: a crash loses exactly the
unacknowledged commands, which producers re-send (deduplication makes that
safe, since marks are rebuilt by replay too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from streamtx.recovery import (
    CommandLog,
    LogReader,
    NullLog,
    encode_command,
)
from streamtx.recovery.log import Log
from streamtx.recovery.records import RecordKind as K
from streamtx.server import protocol as pr
from streamtx.server.ipc import join_grouped
from streamtx.server.partition.exchange import Exchange
from streamtx.server.protocol import TeSpec
from streamtx.server.tuples import Batch, arrow

Logged = list[tuple[TeSpec, Batch | None]]
"""The TEs a command committed, with their input tuples: what strong mode logs."""


class Pushed(Protocol):
    """An atomic batch a partition took (partition/dataflow.py `Push`)."""

    stream: str
    producer: str
    batch_id: int
    ts: int
    batch: pa.Table


COMMAND_FORMAT = 4
"""The form of the records' payloads (their JSON headers and relations), written in every log segment.

A release that changes it bumps it and lists in `READABLE` the formats it
still replays; recovery refuses any other, naming the segment. 0 is a log
from before the format was written down, identical to 1. In 0 and 1 the DDL
of an INSTALL names stored tuples' timestamp column `batch_id`; replay reads
it as `__ts` (catalog/physical.py `current_ddl`). 3 added MIGRATE records. 4: an
INTERVAL record lists its TEs' specs once (`specs`) and names them by place.
"""
READABLE = (0, 1, 2, 3, 4)


class Journal:
    def __init__(self, mode: str, log: Log, sync: bool = False) -> None:
        """`mode`: one of config.DURABILITIES, checked with the server's settings."""
        self.mode = mode
        self.log = log
        self.sync = sync

    @classmethod
    def open(
        cls,
        mode: str,
        directory: Path | None,
        wake: Callable[[int], None],
        group_ms: float,
        on_synced: Callable[[float], None] | None = None,
    ) -> Journal:
        """`group_ms` 0 turns group commit off: each record is fsynced alone before the partition goes on.

        `on_synced` gets the seconds each group of records took to write and sync (the partition's meter).

        That is H-Store's command log without group commit, the setting of
        S-Store's logging experiment (§4.2.3); it costs an fsync per record.
        """
        if mode == "off" or directory is None:
            return cls("off", NullLog())
        LogReader(directory / "log", READABLE)  # a log of another release is refused before anything is written
        log = CommandLog(
            directory / "log",
            group_ms=group_ms,
            on_durable=wake,
            on_failure=lambda _error: wake(-1),  # a partition idle with acks waiting must see the failure too
            payload_format=COMMAND_FORMAT,
            on_synced=on_synced,
        )
        return cls(mode, log, sync=group_ms <= 0)

    @property
    def last_lsn(self) -> int:
        return self.log.last_lsn

    def _append(self, kind: K, ts: int, header: dict[str, Any], tables: list[pa.Table]) -> None:
        if self.mode != "off":
            self.log.append(kind, encode_command(header, tables), ts)
            if self.sync:
                self.log.flush()

    # ------------------------------------------------------------- writing
    def push(self, p: Pushed, logged: Logged, rejected: bool, outcome: pr.Outcome | None = None) -> None:
        if self.mode == "weak":
            head = {"stream": p.stream, "producer": p.producer, "batch_id": p.batch_id}
            self._append(K.PUSH, p.ts, head, [p.batch])
            return
        self._tes(p.ts, logged, None, [p.producer, p.stream, p.batch_id])
        if rejected and outcome is not None:
            self.reject(p.producer, p.stream, p.batch_id, p.ts, outcome.code, outcome.reason)

    def interval(self, committed: list[tuple[Pushed, Logged]]) -> None:
        """The batches one DuckDB transaction committed, as one record: INTERVAL (strong) or PUSHES (weak).

        One record instead of one per TE or batch: on 1-tuple batches, encoding
        a record each cost more than running the batch's state operations.
        """
        if self.mode == "off":
            return
        if len(committed) == 1:
            self.push(*committed[0], rejected=False)
            return
        last_ts = committed[-1][0].ts
        if self.mode == "weak":
            order, runs, joined = join_grouped([p.batch for p, _ in committed], [p.stream for p, _ in committed])
            pushes = [[p.stream, p.producer, p.batch_id, p.ts] for p, _ in committed]
            self._append(K.PUSHES, last_ts, {"pushes": pushes, "order": order, "runs": runs}, joined)
            return
        batches: list[list[Any]] = []
        flat: list[Batch] = []
        streams: list[str] = []
        places: dict[TeSpec, int] = {}  # each spec once: 1-tuple batches repeat the same few
        for p, logged in committed:
            specs, inputs = [], []
            for spec, table in logged:
                place = places.get(spec)
                if place is None:
                    place = places[spec] = len(places)
                specs.append(place)
                inputs.append(-1 if table is None else len(flat))
                if table is not None:
                    flat.append(table)
                    streams.append(spec.stream)
            mark = [p.producer, p.stream, p.batch_id] if any(s.border for s, _ in logged) else None
            batches.append([p.ts, mark, specs, inputs])
        order, runs, joined = join_grouped(flat, streams)
        head = {"specs": [s.to_log() for s in places], "batches": batches, "order": order, "runs": runs}
        self._append(K.INTERVAL, last_ts, head, joined)

    def call(self, procedure: str, params: dict[str, Any], ts: int, logged: Logged) -> None:
        if self.mode == "weak":
            self._append(K.CALL, ts, {"procedure": procedure, "params": params}, [])
        else:
            self._tes(ts, logged, params, None)

    def reject(self, producer: str, stream: str, batch_id: int, ts: int, code: int, reason: str) -> None:
        head = {"producer": producer, "stream": stream, "batch_id": batch_id, "code": code, "reason": reason}
        self._append(K.REJECT, ts, head, [])

    def install(self, catalog: str, ddl: list[str], partition_map: str | None) -> None:
        self._append(K.INSTALL, 0, {"catalog": catalog, "ddl": ddl, "map": partition_map}, [])

    def done(self, ts: int) -> None:
        self._append(K.DONE, ts, {}, [])

    def fragments(
        self,
        ts: int,
        specs: list[tuple[TeSpec, pa.Table]],
        params: dict[str, Any] | None,
        mark: Any,
        exchange: Exchange | None = None,
    ) -> None:
        """A coordinated command's fragments committed here, with the merged state rows a state TE used."""
        head = {"specs": [s.to_log() for s, _ in specs], "params": params, "mark": mark}
        extra: list[pa.Table] = []
        if exchange is not None:
            head["exchange"], extra = exchange.wire()
        self._append(K.FRAGMENTS, ts, head, [t for _, t in specs] + extra)

    def span(self, ts: int, span: pr.Span, tables: list[pa.Table]) -> None:
        """A span committed here, as the front sent it (its batches and the merged rows); `ts` is its last batch's."""
        self._append(K.SPAN, ts, span.to_log(), tables)

    def flow(self, ts: int, flow: pr.Flow, tables: list[pa.Table]) -> None:
        """A flow stage committed here, as the front sent it; `ts` is the flow's last batch's."""
        self._append(K.FLOW, ts, flow.to_log(), tables)

    def migrate(self, ts: int, partition_map: str, tables: list[str], rows: list[pa.Table]) -> None:
        """A migration step committed here (partition/migration.py): the new map and the rows that arrived."""
        self._append(K.MIGRATE, ts, {"map": partition_map, "tables": tables}, rows)

    def _tes(
        self,
        ts: int,
        logged: Logged,
        params: dict[str, Any] | None,
        mark: list[Any] | None,
    ) -> None:
        n = len(logged)
        for i, (spec, table) in enumerate(logged):
            head = {"i": i, "n": n, "spec": spec.to_log(), "params": params, "mark": mark if spec.border else None}
            self._append(K.TE, ts, head, [arrow(table)] if table is not None else [])

    def undone(self, stamps: list[int]) -> None:
        """Commands cut short at these timestamps: their records are not replayed, even when run again (recovery)."""
        for ts in stamps:
            self._append(K.UNDONE, ts, {}, [])
        if stamps:
            self.log.flush()
