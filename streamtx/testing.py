"""Procedures under test: a deploy script run in this process, on the real engine, under either executor.

`Harness` is one partition of a server without its front or gRPC: the real
catalog deploys the script, a real DuckDB database holds the state, the
real dataflow runs every TE. What the front does before a command reaches a
partition is done here the same way: addresses and parameters are checked
(front/checks.py), bad rows reject their batch, every batch and call takes
the next global timestamp, a producer's batch ids are taken in order and a
re-sent one is answered DUPLICATE. Its methods mirror `streamtx.Client`'s
and return the same values (`PushResult`, `Result`), so a test reads alike
against either. `run` runs one list of batches under both executors and
checks they agree: a differential test in one call.

>>> from streamtx.testing import Harness
>>> DDL = '''
... CREATE TABLE counters (key BIGINT PRIMARY KEY, n BIGINT NOT NULL);
... CREATE STREAM counter_events (event_id BIGINT, key BIGINT, delta BIGINT, "limit" BIGINT, mirror BIGINT);
... CREATE STREAM counter_results (event_id BIGINT, ok BOOLEAN);
... CREATE PROCEDURE bounded_add ON STREAM counter_events AS PYTHON 'examples.counters:bounded_add';
... '''
>>> event = {"event_id": 1, "key": 7, "delta": 5, "limit": 10, "mirror": None}
>>> with Harness(DDL, executor="opchain") as h:
...     [h.push("counter_events", [event]).outcome for _ in range(3)]
...     h.query("SELECT key, n FROM counters").fetchall()
...     h.read_stream("counter_results")[-1][1].fetchall()
['committed', 'committed', 'committed']
[(7, 10)]
[(1, False)]

Not covered: several partitions (spans, coordinated commands), durability
and recovery, and the limits the front applies to sizes (`--max-batch-rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import pyarrow as pa

from streamtx.client.async_client import to_table
from streamtx.client.results import DeployResult, PushResult, Result
from streamtx.errors import FailedPrecondition, StreamTxError
from streamtx.server import sqltree
from streamtx.server.catalog.catalog import Catalog
from streamtx.server.catalog.compile import quote
from streamtx.server.config import EXECUTORS, ServerConfig
from streamtx.server.front import checks
from streamtx.server.front.service import fill_ack
from streamtx.server.loader import ProcedureLoader
from streamtx.server.partition.dataflow import Dataflow, Push
from streamtx.server.partition.engine import Engine
from streamtx.server.protocol import Outcome
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.wire import conform

__all__ = ["EXECUTORS", "Harness", "RunResult", "run"]


class Harness:
    """One partition in this process: `with Harness(script) as h: h.push(...); h.query(...)`.

    `procedures_path` is the directory the deploy script's `AS PYTHON
    'module:function'` names are found under (the server's
    `--procedures-path`; by default the procedures that ship with streamtx).
    Each harness imports its procedure modules afresh, as a server process
    would. Single-threaded, like a partition. `executor`, `interval_size` and
    `stream_retention` are the server's settings (server/config.py), with
    their defaults and checks: a bad value is a ValueError naming its flag.
    """

    def __init__(
        self,
        deploy: str | None = None,
        *,
        procedures_path: str | Path | None = None,
        executor: str = ServerConfig.executor,
        interval_size: int = ServerConfig.interval_size,
        stream_retention: int = ServerConfig.stream_retention,
        sql_compiler: str = ServerConfig.sql_compiler,
    ) -> None:
        paths = {"procedures_path": Path(procedures_path)} if procedures_path else {}
        config = ServerConfig(
            partitions=1,
            executor=executor,
            interval_size=interval_size,
            stream_retention=stream_retention,
            sql_compiler=sql_compiler,
            **paths,
        )
        self.executor = config.executor
        self.interval_size = config.interval_size
        self.loader = ProcedureLoader(config.procedures_path)
        self.engine = Engine(
            0,
            self.loader,
            executor=config.executor,
            stream_retention=config.stream_retention,
            sql_compiler=config.sql_compiler == "on",
        )
        self.dataflow = Dataflow(self.engine)
        self.catalog = Catalog()  # the front's copy; the engine installs its own from JSON, as a partition does
        self.last_ts = 0
        self.dispatched: dict[tuple[str, str], int] = {}  # (producer, stream) -> last batch id taken
        self._parser = duckdb.connect(":memory:")  # casts call parameters, checks queries; holds no data
        if deploy is not None:
            self.deploy(deploy)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self.engine.con.close()
        self._parser.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------- commands
    def deploy(self, script: str) -> DeployResult:
        """Applies a deploy script, all or nothing; a bad one raises InvalidArgument naming the statement."""
        sqltree.check_size(script, "deploy")
        new, created, dropped, ddl = self.catalog.deploy(script, self.loader.resolve)
        self.engine.state.sync()
        self.engine.install(new, ddl)
        self.catalog = new
        self.dispatched = {key: b for key, b in self.dispatched.items() if key[1] in new.streams}
        return DeployResult(created=created, dropped=dropped)

    def push(self, stream: str, rows: Any, *, producer: str = "harness", batch_id: int | None = None) -> PushResult:
        """Takes one atomic batch and returns its outcome, as `Client.push_one` would.

        `rows` takes the shapes `Client.push` takes. `batch_id` defaults to
        the producer's next; a smaller one is a re-send (DUPLICATE, nothing
        runs); a larger one is rejected FAILED_PRECONDITION, as the server
        does when the missing batches never come.
        """
        return self._take([(stream, rows, batch_id)], producer)[0]

    def push_many(self, batches: Iterable[tuple[str, Any]], *, producer: str = "harness") -> list[PushResult]:
        """Takes (stream, rows) batches in order, each with the producer's next batch id, as the server
        takes batches that are queued.

        Consecutive batches form punctuation intervals of up to
        `interval_size` (in one DuckDB transaction when none aborts; under
        `opchain`, with their state access set-based); a batch rejected for
        its rows ends the interval before it, as on the server. The outcomes
        equal those of the batches pushed one at a time.
        """
        return self._take([(stream, rows, None) for stream, rows in batches], producer)

    def call(self, procedure: str, **params: Any) -> list[Result]:
        """Runs an OLTP procedure, as `Client.call`: one Result per result table; an abort raises Aborted."""
        bound = checks.bind_call(self.catalog, self._parser, procedure, params)
        ts = self._next_ts()
        self.engine.state.sync()
        _, results = self.dataflow.run_call(procedure, bound, ts)
        return [Result(t) for t in results]

    def query(self, sql: str, params: dict[str, Any] | None = None) -> Result:
        """Read-only SQL (one SELECT) over the committed state, as `Client.query`."""
        sqltree.check_size(sql, "query")
        checks.check_read_only(self._parser, sql)
        self.engine.state.sync()
        return Result(self.engine.query(sql, dict(params or {})))

    def read_stream(self, stream: str, from_ts: int = 0) -> list[tuple[int, Result]]:
        """Every kept batch of a stream no procedure consumes, from timestamp `from_ts` on: (ts, its tuples).

        What `Client.subscribe` yields, up to the latest batch, then it ends.
        """
        self.engine.state.sync()
        out: list[tuple[int, Result]] = []
        while True:
            batches = self.engine.read_stream(stream, from_ts, 64)
            if not batches:
                return out
            out += [(ts, Result(t)) for ts, t in batches]
            from_ts = batches[-1][0] + 1

    def tables(self) -> dict[str, pa.Table]:
        """Every table, view and window of the catalog, by name, rows in ORDER BY ALL order (compared by value)."""
        self.engine.state.sync()
        return {
            name: self.engine.query(f"SELECT * FROM {quote(name)} ORDER BY ALL", {})
            for name in sorted([*self.catalog.readable, *self.engine.catalog.windows])
        }

    def outputs(self) -> dict[str, list[tuple[int, pa.Table]]]:
        """`read_stream` of every stream no procedure consumes, by name."""
        return {
            name: [(ts, r.arrow()) for ts, r in self.read_stream(name)] for name in sorted(self.engine.catalog.retained)
        }

    # ------------------------------------------------------------------ internals
    def _next_ts(self) -> int:
        self.last_ts += 1
        return self.last_ts

    def _take(self, batches: list[tuple[str, Any, int | None]], producer: str) -> list[PushResult]:
        """What the front and the partition do with pushed batches, in order (front.py `push`)."""
        out: list[PushResult | None] = []
        queued: list[tuple[int, Push]] = []
        for stream, rows, given in batches:
            table = to_table(rows)
            at = len(out)
            out.append(None)
            key = (producer, stream)
            last = self.dispatched.get(key, 0)
            batch_id = last + 1 if given is None else given
            what = f"push to {stream!r} (producer {producer!r}, batch {batch_id})"
            try:
                schema = checks.push_schema(self.catalog, stream, producer, batch_id)
                if batch_id > last + 1:
                    raise FailedPrecondition(
                        f"batch {batch_id} of producer {producer!r} on stream {stream!r}: batch {last + 1} was "
                        "never pushed; batches of a producer are taken in batch-id order, starting at 1"
                    )
            except StreamTxError as e:
                out[at] = _result(stream, producer, batch_id, table.num_rows, _refused(e))
                continue
            ts = self._next_ts()
            if batch_id <= last:  # a re-send: its original outcome, nothing runs (front.py `_resent`)
                self._run(queued, out)
                self.engine.state.sync()
                original = self.engine.original_outcome(producer, stream, batch_id).quiet()
                out[at] = _result(stream, producer, batch_id, table.num_rows, original)
                continue
            self.dispatched[key] = batch_id
            try:
                table = conform(table, schema, what)
            except StreamTxError as e:  # a well-addressed batch with bad rows: its id is used up, rejected
                self._run(queued, out)
                self.engine.state.sync()
                code, reason = e.code.value[0], e.message
                outcome = self.dataflow.run_reject(stream, producer, batch_id, ts, code, reason)
                out[at] = _result(stream, producer, batch_id, table.num_rows, outcome)
                continue
            queued.append((at, Push(stream, producer, batch_id, ts, table)))
            if len(queued) == self.interval_size:
                self._run(queued, out)
        self._run(queued, out)
        return out  # type: ignore[return-value]

    def _run(self, queued: list[tuple[int, Push]], out: list[PushResult | None]) -> None:
        """The queued batches as one interval; their outcomes into `out`; the queue emptied."""
        if not queued:
            return
        results = self.dataflow.run_pushes([p for _, p in queued])
        for (at, p), result in zip(queued, results, strict=True):
            outcome = _refused(result) if isinstance(result, StreamTxError) else result
            out[at] = _result(p.stream, p.producer, p.batch_id, p.batch.num_rows, outcome)
        queued.clear()


def _refused(e: StreamTxError) -> Outcome:
    """The outcome of a batch refused before it ran (the front's REJECTED ack)."""
    return Outcome("rejected", 0, e.code.value[0], e.message)


def _result(stream: str, producer: str, batch_id: int, rows: int, outcome: Outcome) -> PushResult:
    """The PushResult a client gets for this outcome: built through the server's ack."""
    ack = pb.PushAck(stream=stream, producer_id=producer, batch_id=batch_id, rows=rows)
    return PushResult.from_ack(fill_ack(ack, outcome), rows=rows)


# ------------------------------------------------------------------- differential


@dataclass
class RunResult:
    """What a run left: each batch's outcome, every table, and every batch of the streams nothing consumes."""

    outcomes: list[PushResult]
    tables: dict[str, pa.Table]
    outputs: dict[str, list[tuple[int, pa.Table]]] = field(default_factory=dict)


def run(
    deploy: str,
    batches: Iterable[tuple[str, Any]],
    *,
    executors: Iterable[str] = EXECUTORS,
    procedures_path: str | Path | None = None,
    setup: Callable[[Harness], Any] | None = None,
    interval_size: int = ServerConfig.interval_size,
    sql_compiler: Iterable[str] = ("on",),
) -> RunResult:
    """Runs the batches under each executor and `sql_compiler` setting, each in a fresh `Harness`; returns the first's.

    `setup(harness)` runs after the deploy, before the batches (an OLTP call
    that fills reference tables, say). The runs must agree on every outcome,
    every table and every output batch (the tuples of one batch compared in
    any order): else AssertionError naming the first difference. With
    `sql_compiler=("off", "on")`, SQL run in DuckDB is the reference the
    compiled statements (server/sqlc) are checked against.
    """
    batches = list(batches)
    results: dict[str, RunResult] = {}
    for compiler in sql_compiler:
        for executor in executors:
            with Harness(
                deploy,
                procedures_path=procedures_path,
                executor=executor,
                interval_size=interval_size,
                sql_compiler=compiler,
            ) as h:
                if setup is not None:
                    setup(h)
                outcomes = h.push_many(batches)
                defects = h.engine.counters["sql_defects"]
                assert not defects, f"{executor}/sql-compiler {compiler}: {defects} compiled statement(s) failed"
                results[f"{executor}/sql-compiler {compiler}"] = RunResult(outcomes, h.tables(), h.outputs())
    if not results:
        raise ValueError("run: no executor given")
    (first, expected), *others = results.items()
    for executor, got in others:
        _check_same(f"{first} vs {executor}", expected, got)
    return expected


def _check_same(what: str, a: RunResult, b: RunResult) -> None:
    for i, (x, y) in enumerate(zip(a.outcomes, b.outcomes, strict=True)):
        if x != y:
            raise AssertionError(f"{what}: batch {i} (of {len(a.outcomes)}): {x} != {y}")
    for name in sorted(a.tables.keys() | b.tables.keys()):
        x, y = a.tables.get(name), b.tables.get(name)
        if x is None or y is None or not x.equals(y):
            raise AssertionError(f"{what}: table {name!r} differs:\n{x}\n!=\n{y}")
    for name in sorted(a.outputs.keys() | b.outputs.keys()):
        x, y = _unordered(a.outputs.get(name, [])), _unordered(b.outputs.get(name, []))
        if x != y:
            raise AssertionError(f"{what}: stream {name!r} differs: {x} != {y}")


def _unordered(batches: list[tuple[int, pa.Table]]) -> list[tuple[int, list[tuple[Any, ...]]]]:
    return [(b, sorted(Result(t), key=repr)) for b, t in batches]
