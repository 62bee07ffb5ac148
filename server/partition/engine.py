"""A partition's state: its DuckDB database, catalog, and the system tables.

The engine is used by exactly one thread, the partition's executing thread.
System tables in schema `streamtx` hold what exactly-once needs, written in
the same DuckDB transaction as the effects they vouch for:

- `producers(producer_id, stream, last_batch_id, last_ts)`: per producer and
  stream, the last batch taken (batches are taken in batch-id order, so every
  id up to it is a duplicate);
- `taken(producer_id, stream, batch_id, ts)`: each batch's timestamp, for the
  latest `TAKEN_HISTORY` ids of each producer's stream (partition/state.py), so
  a re-sent batch's ack carries its original timestamp;
- `rejections(producer_id, stream, batch_id, ts, code, reason)`: the batches
  that were rejected, so a re-sent one gets its original outcome.

In memory, `Engine.marks` (partition/marks.py) holds the committed marks and
the partition's clock; every path takes batches through it.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from streamtx.errors import Aborted, FailedPrecondition, Internal, InvalidArgument, NotFound, OutOfRange
from streamtx.procedure import Event
from streamtx.server.catalog.catalog import Catalog
from streamtx.server.catalog.compile import STREAM_SCHEMA, SYSTEM_SCHEMA, TS_COLUMN, WINDOW_SCHEMA, Compiled, quote
from streamtx.server.catalog.placement import REPLICATED, owner_filter
from streamtx.server.config import ServerConfig
from streamtx.server.deadline import query_deadline
from streamtx.server.loader import ProcedureLoader
from streamtx.server.partition.exchange import Exchange
from streamtx.server.partition.marks import Marks
from streamtx.server.partition.meter import Meter
from streamtx.server.partition.ownership import Known
from streamtx.server.partition.relations import Relations
from streamtx.server.partition.sqlplans import SqlPlans
from streamtx.server.partition.state import StateStore
from streamtx.server.partition.transaction import compile_python_sql, error_text
from streamtx.server.partition.windows import Windows
from streamtx.server.partitioning import KEY_TYPES, PartitionMap
from streamtx.server.protocol import Outcome
from streamtx.server.tuples import Batch, arrow

SYSTEM_DDL = [
    f"CREATE SCHEMA IF NOT EXISTS {SYSTEM_SCHEMA}",
    f"CREATE SCHEMA IF NOT EXISTS {STREAM_SCHEMA}",
    f"CREATE SCHEMA IF NOT EXISTS {WINDOW_SCHEMA}",
    f"CREATE TABLE IF NOT EXISTS {SYSTEM_SCHEMA}.producers (producer_id VARCHAR NOT NULL, "
    "stream VARCHAR NOT NULL, last_batch_id BIGINT NOT NULL, last_ts BIGINT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {SYSTEM_SCHEMA}.taken (producer_id VARCHAR NOT NULL, stream VARCHAR NOT NULL, "
    "batch_id BIGINT NOT NULL, ts BIGINT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {SYSTEM_SCHEMA}.rejections (producer_id VARCHAR, stream VARCHAR, "
    "batch_id BIGINT, ts BIGINT, code INTEGER, reason VARCHAR, PRIMARY KEY (producer_id, stream, batch_id))",
]


class LazyBegin:
    """A DuckDB connection whose transaction begins at the first statement after `pending` is set.

    An opchain interval whose rows are all held back (partition/state.py)
    runs no statement: its BEGIN and COMMIT, 0.2-0.5 ms a pair, are then
    skipped. Every use of the connection goes through `__getattr__`, so none
    can run outside the transaction it belongs to.
    """

    __slots__ = ("raw", "pending")

    def __init__(self, raw: duckdb.DuckDBPyConnection) -> None:
        self.raw = raw
        self.pending = False

    def __getattr__(self, name: str) -> Any:
        if self.pending:
            self.pending = False
            self.raw.execute("BEGIN")
        return getattr(self.raw, name)


class Engine:
    def __init__(
        self,
        partition: int,
        loader: ProcedureLoader,
        *,
        executor: str = ServerConfig.executor,
        stream_retention: int = ServerConfig.stream_retention,
        sql_compiler: bool = ServerConfig.sql_compiler == "on",
        query_timeout: float = ServerConfig.query_timeout,
    ) -> None:
        self.partition = partition
        self.executor = executor
        self.loader = loader
        self.stream_retention = stream_retention
        self.query_timeout = query_timeout
        self.con = LazyBegin(duckdb.connect(config={"enable_external_access": False, "threads": 1}))  # one core
        for sql in SYSTEM_DDL:
            self.con.execute(sql)
        self.catalog = Catalog()
        self.relations = Relations(self.con)
        self.sql_plans = SqlPlans(self.con, sql_compiler)
        self.marks = Marks()
        self.retained: dict[str, collections.deque[int]] = {}
        self.trimmed_through: dict[str, int] = {}
        self.counters: collections.Counter[str] = collections.Counter()
        self.meter = Meter(partition)  # per procedure, log, checkpoint measurements (partition/meter.py)
        self.windows = Windows(self)
        self.sql_plans.windows = self.windows.in_memory
        self.state = StateStore(self)
        self.prepared: dict[tuple[int, str], list[Event]] = {}  # (ts, procedure) -> pre-processed events
        self.prepared_epoch = -1  # the working set's epoch when their keys were loaded
        self._python: dict[str, Callable[..., Any]] = {}  # python_code
        self._facts_of: tuple[Catalog, PartitionMap] | None = None  # what `_facts_cache` describes
        self._facts_cache: dict[tuple[str, str], Any] = {}
        self.map = PartitionMap.round_robin(1, 1)
        self.coordinated = False  # running a fragment of a coordinated command: the front routes its output
        self.exchange: Exchange | None = None  # a state TE spanning partitions: the rows they merged (exchange.py)
        for key_type in KEY_TYPES:
            self.con.create_function(
                owner_filter(key_type),
                self._owned,
                [key_type],
                "BOOLEAN",
                type="arrow",
                null_handling="special",
            )

    # ---------------------------------------------------------------- catalog
    def install(self, catalog: Catalog, ddl: list[str], partition_map: str | None = None) -> None:
        """Runs a deploy's physical DDL and switches to the new catalog (analyzed: `Catalog.from_json`), atomically."""
        if partition_map is not None:
            self.map = PartitionMap.from_json(partition_map)
        self.con.execute("BEGIN")
        try:
            for sql in ddl:
                self.con.execute(sql)
        except duckdb.Error as e:
            self.con.execute("ROLLBACK")
            raise Internal(f"partition {self.partition}: deploy failed on {sql!r}: {error_text(e)}") from None
        self.con.execute("COMMIT")
        self.catalog = catalog
        self.relations.reset(catalog)
        self.compile_for.cache_clear()
        self._python.clear()
        self.windows.load()
        self.load_marks()
        self.state.refresh_schema()
        self.sql_plans.reset(catalog)
        for stream in list(self.retained):
            if stream not in catalog.streams:
                del self.retained[stream]
                self.trimmed_through.pop(stream, None)

    def _owned(self, keys: pa.Array) -> pa.Array:
        return pa.array(self.map.owners(keys) == self.partition)

    def check_local(self, procedure: str | None, stream: str, rows: Batch) -> None:
        """In a local (keyed) command, tuples passed to a partitioned consumer must stay on this partition.

        The front sends a keyed batch to the one partition owning its keys; a
        procedure that emits keys of another partition on a stream partitioned
        by the same column would have its consumer run in the wrong place, so
        its TE aborts instead. Coordinated commands route every output anyway.
        """
        if self.coordinated or self.map.partitions == 1:
            return
        key = self.catalog.placement.streams.get(stream)
        if key is None or not self.catalog.consumers.get(stream):
            return
        owners = self.map.owners(arrow(rows).column(key))
        stray = owners[owners != self.partition]
        if len(stray):
            raise Aborted(
                f"procedure {procedure}: emitted rows on stream {stream!r} whose {key} belongs to partition "
                f"{int(stray[0])}, not to this partition ({self.partition}); a procedure partitioned by a key "
                f"emits only rows of its own keys on a stream partitioned by {key}"
            )

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one engine per process
    def compile_for(self, procedure: str | None, sql: str) -> Compiled:
        if procedure is None:
            raise InvalidArgument("SQL outside a procedure")
        return compile_python_sql(self.catalog, procedure, sql)

    def python_emits(self, procedure: str | None) -> frozenset[str]:
        if procedure is None:
            return frozenset()
        return self.catalog.plans[procedure].emits

    def group_of(self, procedure: str) -> str | None:
        """`catalog.group_of`, remembered for the catalog: the scheduler asks for every TE."""
        facts = self._facts()
        key = ("group", procedure)
        if key not in facts:
            facts[key] = self.catalog.group_of(procedure)
        return facts[key]

    def stream_triggers(self, stream: str) -> tuple[str, ...]:
        """`catalog.triggers_on("stream", stream)`, remembered for the catalog: asked whenever tuples enter."""
        facts = self._facts()
        key = ("triggers", stream)
        if key not in facts:
            facts[key] = tuple(self.catalog.triggers_on("stream", stream))
        return facts[key]

    def owned_windows(self, procedure: str) -> tuple[str, ...]:
        """`catalog.owned_windows`, remembered for the catalog: asked for every TE with an input."""
        facts = self._facts()
        key = ("windows", procedure)
        if key not in facts:
            facts[key] = tuple(self.catalog.owned_windows(procedure))
        return facts[key]

    @property
    def replicated_tables(self) -> frozenset[str]:
        """The catalog's replicated tables, remembered for the catalog: asked for every state TE."""
        facts = self._facts()
        key = ("replicated", "")
        if key not in facts:
            placed = self.catalog.placement.tables
            facts[key] = frozenset(t for t, kind in placed.items() if kind == REPLICATED)
        return facts[key]

    @property
    def known_local(self) -> Known:
        """What the ownership check learnt (partition/ownership.py `Known`), while the catalog and map stay."""
        facts = self._facts()
        key = ("known_local", "")
        if key not in facts:
            facts[key] = Known()
        return facts[key]

    def _facts(self) -> dict[tuple[str, str], Any]:
        of = self._facts_of
        if of is None or of[0] is not self.catalog or of[1] is not self.map:
            self._facts_of = (self.catalog, self.map)
            self._facts_cache = {}
        return self._facts_cache

    def python_code(self, ref: str) -> Callable[..., Any]:
        """`loader.resolve(ref)`, remembered: every TE of a Python procedure needs it, and it never changes."""
        code = self._python.get(ref)
        if code is None:
            code = self._python[ref] = self.loader.resolve(ref)
        return code

    # ----------------------------------------------------- exactly-once marks
    def load_retained(self) -> None:
        """The timestamps of the retained streams' stored batches, as their tables hold them."""
        self.retained = {}
        for stream in self.catalog.retained:
            ids = self.con.execute(
                f"SELECT DISTINCT {TS_COLUMN} FROM {STREAM_SCHEMA}.{quote(stream)} ORDER BY {TS_COLUMN}"
            ).fetchall()
            if ids:
                self.retained[stream] = collections.deque(b for (b,) in ids)

    def load_marks(self) -> None:
        self.marks.load(
            self.con.execute(
                f"SELECT producer_id, stream, last_batch_id, last_ts FROM {SYSTEM_SCHEMA}.producers"
            ).fetchall()
        )

    # ------------------------------------------------------------ transactions
    def begin(self) -> None:
        """Opens a DuckDB transaction (at its first statement); the working set can be taken back with it."""
        self.con.pending = True
        self.state.begin()

    def commit(self, hold_back: bool = False) -> None:
        """Commits the open transaction with everything the working set holds written first.

        `hold_back` (an opchain interval): only what might not fit is written;
        the rest waits in the working set (`StateStore.end_interval`).
        """
        if hold_back:
            self.state.end_interval()
        else:
            self.state.flush()
        if self.con.pending:  # no statement ran: DuckDB has nothing to commit
            self.con.pending = False
        else:
            self.con.execute("COMMIT")
        self.state.committed()

    def rollback(self) -> None:
        """Undoes the open transaction in DuckDB and in the working set alike."""
        if self.con.pending:
            self.con.pending = False
        else:
            self.con.execute("ROLLBACK")
        self.state.rollback()

    def record_mark(self, producer: str, stream: str, batch_id: int, ts: int) -> None:
        """Records that a batch was taken, with the transaction it runs in (written with its state)."""
        self.state.add_marks([(producer, stream, batch_id, ts)])

    def record_rejection(self, producer: str, stream: str, batch_id: int, ts: int, code: int, reason: str) -> None:
        self.begin()
        self.record_mark(producer, stream, batch_id, ts)
        self.write_rejection(producer, stream, batch_id, ts, code, reason)
        self.commit()
        self.marks.took([(producer, stream, batch_id, ts)])

    def write_rejection(self, producer: str, stream: str, batch_id: int, ts: int, code: int, reason: str) -> None:
        """Stores why a batch was rejected, for re-sends (inside the caller's transaction; the mark is apart)."""
        self.con.execute(
            f"INSERT OR REPLACE INTO {SYSTEM_SCHEMA}.rejections VALUES ($p, $s, $b, $ts, $c, $r)",
            {"p": producer, "s": stream, "b": batch_id, "ts": ts, "c": code, "r": reason},
        )

    def original_outcome(self, producer: str, stream: str, batch_id: int) -> Outcome:
        """What this partition knows of a batch it may have taken: rejected (and why), else committed.

        The timestamp of a committed batch is exact for the latest
        `TAKEN_HISTORY` ids of its producer's stream; 0 for older ones, and on
        a partition that did not take it (the front keeps the highest).
        """
        key = {"p": producer, "s": stream, "b": batch_id}
        row = self.con.execute(
            f"SELECT ts, code, reason FROM {SYSTEM_SCHEMA}.rejections "
            "WHERE producer_id = $p AND stream = $s AND batch_id = $b",
            key,
        ).fetchone()
        if row is not None:
            return Outcome("duplicate", row[0], row[1], row[2], original="rejected")
        return Outcome("duplicate", self.state.taken_ts(producer, stream, batch_id) or 0, original="committed")

    # ------------------------------------------------------------ stream storage
    def retain(self, stream: str, ts: list[int]) -> None:
        """Keeps new batches of a stream nothing consumes, for subscribers: the latest `stream_retention`.

        Called once per stream after each commit, with the timestamp of every batch it stored;
        the trim is written with the state (`StateStore.trim`), so it costs
        one statement per write, not per batch.
        """
        kept = self.retained.setdefault(stream, collections.deque())
        kept.extend(ts)
        if len(kept) <= self.stream_retention:
            return
        cut = 0
        while len(kept) > self.stream_retention:
            cut = kept.popleft()
        self.state.trim(stream, cut)
        self.trimmed_through[stream] = cut

    def read_stream(self, stream: str, from_ts: int, max_batches: int) -> list[tuple[int, pa.Table]]:
        """A retained stream's batches from timestamp `from_ts` on, each as (ts, its tuples)."""
        if stream not in self.catalog.streams:
            raise NotFound(f"unknown stream {stream!r}")
        if self.catalog.consumers.get(stream):
            raise FailedPrecondition(
                f"stream {stream!r} is consumed by procedure(s) "
                f"{', '.join(self.catalog.consumers[stream])}; its tuples are garbage collected "
                "once consumed. Subscribe to a stream that no procedure consumes"
            )
        trimmed = self.trimmed_through.get(stream, 0)
        if 0 < from_ts <= trimmed:
            raise OutOfRange(
                f"stream {stream!r}: batches up to timestamp {trimmed} were trimmed (retention "
                f"{self.stream_retention} batches); resume from {trimmed + 1} or later"
            )
        kept = self.retained.get(stream)
        if not kept:
            return []
        stamps = [ts for ts in kept if ts >= from_ts][:max_batches]
        if not stamps:
            return []
        cols = ", ".join(quote(c) for c in self.catalog.stream_schemas[stream].names)
        table = self.con.execute(
            f"SELECT {cols}, {TS_COLUMN} FROM {STREAM_SCHEMA}.{quote(stream)} "
            f"WHERE {TS_COLUMN} BETWEEN $lo AND $hi ORDER BY {TS_COLUMN}",
            {"lo": stamps[0], "hi": stamps[-1]},
        ).to_arrow_table()
        ts_col = table.column(TS_COLUMN)
        data = table.drop_columns([TS_COLUMN])
        return [(ts, data.filter(pc.equal(ts_col, ts))) for ts in stamps]

    # ----------------------------------------------------------------- queries
    def query(self, sql: str, params: dict[str, Any]) -> pa.Table:
        """A read between commands (no transaction is open then), stopped after `query_timeout` seconds."""
        try:
            with query_deadline(self.con.raw, self.query_timeout, lambda: f"query on partition {self.partition}"):
                return self.con.execute(sql, params).to_arrow_table()
        except duckdb.Error as e:
            raise InvalidArgument(f"query: {error_text(e)}") from None

    def dedup_rows(self) -> dict[str, int]:
        """Rows of the exactly-once tables: batch timestamps kept for re-sends' acks, rejections kept."""
        taken, rejections = self.con.execute(
            f"SELECT (SELECT count(*) FROM {SYSTEM_SCHEMA}.taken), (SELECT count(*) FROM {SYSTEM_SCHEMA}.rejections)"
        ).fetchall()[0]
        return {"taken": taken, "rejections": rejections}

    def status(self) -> dict[str, Any]:
        """Counters, and the rows each table holds here (how the keys spread over partitions)."""
        rows = {}
        if self.catalog.tables:
            sql = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {quote(t)}" for t in sorted(self.catalog.tables))
            rows = {f"rows.{t}": n for t, n in self.con.execute(sql).fetchall()}
        return {
            "partition": self.partition,
            "last_ts": self.marks.last_ts,
            "counters": {**self.counters, **rows},
        }
