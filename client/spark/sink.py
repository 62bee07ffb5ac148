"""Spark sinks: every micro-batch (or DataFrame) becomes one atomic batch, once.

Executors stage their rows with the server under a staging id and a part name
unique to the task attempt; the driver's commit names the parts Spark chose
(one successful attempt per partition) and the server turns exactly those
into one atomic batch, pushed as producer `spark-<query id>`, batch id
`micro-batch id + 1`. The server's (producer, stream, batch id)
deduplication makes every re-run safe: a retried or speculative task stages a
part that is never named, a re-sent commit (lost acknowledgement) or a
micro-batch re-run after a driver restart is answered DUPLICATE and changes
nothing; an aborted micro-batch's rows are discarded (or expire).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from streamtx.client.spark.options import Options, query_id_from_checkpoint, read_schema
from streamtx.client.spark.rpc import Conn, ack_text
from streamtx.client.spark.schema import column_map, conform_batch
from streamtx.errors import Aborted, FailedPrecondition, InvalidArgument, StreamTxError, Unavailable
from streamtx.v1 import streamtx_pb2 as pb

QUERY_ID_KEY = "sql.streaming.queryId"  # Spark's local properties of a micro-batch's tasks
BATCH_ID_KEY = "streaming.sql.batchId"
IN_FLIGHT = 2  # Stage calls a task keeps in flight per host (overlaps encoding with the server's work)
CONNECT_S = 2.0
"""Seconds a task waits for one of several hosts to accept a connection before it stages on the next."""
COPY_RETRY_S = 5.0
"""Seconds a call to one of several hosts is retried before the task fails (Spark then runs it again, on the hosts
that answer) or the commit moves to the next host holding every part."""
T = TypeVar("T")


@dataclass
class Staged(WriterCommitMessage):
    """What one task attempt staged: the parts it wrote, each (staging id, part, chunks, rows), and the hosts
    holding a copy of each."""

    partition: int
    parts: list[tuple[str, str, int, int]]
    query_id: str = ""
    hosts: tuple[str, ...] = ()


class _Validated:
    """Driver-side checks shared by both writers: server reachable, stream pushable, schemas agree."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.opts = Options.parse(options)
        if overwrite:
            raise InvalidArgument(
                f"streamtx: stream {self.opts.stream!r} is append-only; write in append mode (not overwrite/complete)"
            )
        with self.opts.conn(retry_for_s=min(self.opts.timeout_s, 10.0)) as conn:
            desc = conn.describe(self.opts.stream)
        if not desc.border:
            raise FailedPrecondition(
                f"streamtx: stream {self.opts.stream!r} is a procedure's output; Spark can push to border streams only"
            )
        self.stream_schema_bytes = desc.arrow_schema
        self.mapping = column_map(schema, read_schema(desc.arrow_schema), self.opts.stream)

    def conn(self) -> Conn:
        return self.opts.conn(timeout_s=self.opts.timeout_s)

    def staging_conns(self) -> list[Conn]:
        """The hosts this task stages on: with several targets, the first `stage_copies` that accept a
        connection, each called without moving to another (a part must be whole where it is staged)."""
        targets = self.opts.targets
        if len(targets) == 1:
            return [self.conn()]
        chosen: list[Conn] = []
        for target in targets:
            conn = self.opts.conn(target, timeout_s=self.opts.timeout_s, retry_for_s=COPY_RETRY_S)
            if not conn.ready(CONNECT_S):
                conn.close()
                continue
            chosen.append(conn)
            if len(chosen) == self.opts.stage_copies:
                return chosen
        if not chosen:
            raise Unavailable(f"streamtx: no host of {self.opts.target} accepts a connection")
        return chosen

    def on_a_holder(self, staged: list[Staged], call: Callable[[Conn], T]) -> T:
        """`call` (a commit) on a host holding a copy of every staged part: the first in target order that
        answers and does not lack a part (one that restarted lost what it held); the other copies are dropped
        after. Without such a host, on the targets as any call (which fails if a part is missing)."""
        holders = [t for t in self.opts.targets if staged and all(t in m.hosts for m in staged)]
        if not holders:
            with self.conn() as conn:
                return call(conn)
        failed: StreamTxError | None = None
        for host in holders:
            with self.opts.conn(host, timeout_s=self.opts.timeout_s, retry_for_s=COPY_RETRY_S) as conn:
                try:
                    result = call(conn)
                except (Unavailable, FailedPrecondition) as e:
                    failed = e
                    continue
            self.drop_copies(staged, keep=host)
            return result
        assert failed is not None
        raise failed

    def drop_copies(self, staged: list[Staged], keep: str) -> None:
        """Frees the copies a commit did not use (best effort: whatever is left expires)."""
        ids = sorted({sid for m in staged for sid, *_ in m.parts})
        for host in sorted({h for m in staged for h in m.hosts} - {keep}):
            try:
                with self.opts.conn(host, timeout_s=CONNECT_S, retry_for_s=0.0) as conn:
                    for staging_id in ids:
                        conn.abort(self.opts.stream, staging_id)
            except StreamTxError:
                pass

    def stage(
        self, conns: list[Conn], staging_id: str, part: str, batches: Iterator[pa.RecordBatch]
    ) -> tuple[int, int]:
        """Stages record batches as chunks of `chunk_rows` rows on every host of `conns`, a few in flight;
        returns (chunks, rows)."""
        schema = read_schema(self.stream_schema_bytes)
        chunk_rows = self.opts.chunk_rows
        pending: list = []
        buf: list[pa.RecordBatch] = []
        buffered = chunks = rows = 0

        def flush() -> None:
            nonlocal buffered, chunks
            if not buf:
                return
            table = pa.Table.from_batches(buf)
            pending.extend((c, c.stage_future(self.opts.stream, staging_id, part, chunks, table)) for c in conns)
            chunks += 1
            buf.clear()
            buffered = 0
            while len(pending) > IN_FLIGHT * len(conns):
                conn, started = pending.pop(0)
                conn.finish_stage(started)

        for batch in batches:
            if batch.num_rows == 0:
                continue
            batch = conform_batch(batch, self.mapping, schema)
            while batch.num_rows:
                take = min(batch.num_rows, chunk_rows - buffered)
                buf.append(batch.slice(0, take))
                batch = batch.slice(take)
                buffered += take
                rows += take
                if buffered >= chunk_rows:
                    flush()
        flush()
        for conn, started in pending:
            conn.finish_stage(started)
        return chunks, rows

    def report(self, ack: pb.PushAck, what: str) -> None:
        """A rejected batch used up its id (nothing of it was applied): fail or log, as configured."""
        rejected = ack.outcome == pb.REJECTED or (ack.outcome == pb.DUPLICATE and ack.original == pb.REJECTED)
        if not rejected:
            return
        message = f"streamtx: {what} on {self.opts.stream!r} was rejected: {ack_text(ack)}"
        if self.opts.on_rejected == "fail":
            raise Aborted(message)
        print(message, file=sys.stderr)


def _part_name(tc: TaskContext) -> str:
    """Unique per task attempt, across driver restarts too (attempt numbers restart at 0)."""
    return f"p{tc.partitionId():05d}.a{tc.attemptNumber()}.t{tc.taskAttemptId()}.{uuid.uuid4().hex[:12]}"


class StreamSinkWriter(_Validated, DataSourceStreamArrowWriter):
    """`df.writeStream.format("streamtx")`: one atomic batch per micro-batch, exactly once."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        tc = TaskContext.get()
        query_id = tc.getLocalProperty(QUERY_ID_KEY)
        micro_batch = tc.getLocalProperty(BATCH_ID_KEY)
        if not query_id or micro_batch is None:
            raise FailedPrecondition("streamtx: the stream sink runs only inside a streaming query's micro-batch")
        staging_id = f"{query_id}/{micro_batch}"
        part = _part_name(tc)
        conns = self.staging_conns()
        try:
            chunks, rows = self.stage(conns, staging_id, part, iterator)
        finally:
            for conn in conns:
                conn.close()
        hosts = tuple(c.target for c in conns)
        return Staged(tc.partitionId(), [(staging_id, part, chunks, rows)], query_id, hosts)

    def _query_id(self, messages: list[WriterCommitMessage | None]) -> str:
        for m in messages:
            if isinstance(m, Staged) and m.query_id:
                return m.query_id
        return query_id_from_checkpoint(self.opts.checkpoint)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        query_id = self._query_id(messages)
        staging_id = f"{query_id}/{batchId}"
        staged = sorted((m for m in messages if isinstance(m, Staged)), key=lambda m: m.partition)
        parts = [(p, c, r) for m in staged for sid, p, c, r in m.parts if sid == staging_id]
        producer = self.opts.producer_id or f"spark-{query_id}"
        ack = self.on_a_holder(
            staged, lambda conn: conn.commit(self.opts.stream, staging_id, producer, batchId + 1, parts)
        )
        self.report(ack, f"micro-batch {batchId} (batch {batchId + 1} of {producer})")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        try:
            query_id = self._query_id(messages)
        except FailedPrecondition:
            return  # nothing named: whatever was staged expires
        staged = [m for m in messages if isinstance(m, Staged)]
        self.drop_copies(staged, keep="")
        with self.conn() as conn:
            conn.abort(self.opts.stream, f"{query_id}/{batchId}")


class BatchSinkWriter(_Validated, DataSourceArrowWriter):
    """`df.write.format("streamtx")`: the DataFrame as one atomic batch, or as batches of
    at most `batch_size` rows (task by task, in partition order), each exactly once."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.job = uuid.uuid4().hex
        self.producer = self.opts.producer_id or f"spark-batch-{self.job}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        tc = TaskContext.get()
        part = _part_name(tc)
        size = self.opts.batch_size
        conns = self.staging_conns()
        hosts = tuple(c.target for c in conns)
        try:
            if size == 0:
                chunks, rows = self.stage(conns, self.job, part, iterator)
                return Staged(tc.partitionId(), [(self.job, part, chunks, rows)], hosts=hosts)
            parts = []
            for i, piece in enumerate(_split(iterator, size)):
                staging_id = f"{self.job}/{tc.partitionId()}/{i}"
                chunks, rows = self.stage(conns, staging_id, part, iter(piece))
                parts.append((staging_id, part, chunks, rows))
        finally:
            for conn in conns:
                conn.close()
        return Staged(tc.partitionId(), parts, hosts=hosts)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = sorted((m for m in messages if isinstance(m, Staged)), key=lambda m: m.partition)
        self.on_a_holder(staged, lambda conn: self._commit_all(conn, staged))

    def _commit_all(self, conn: Conn, staged: list[Staged]) -> None:
        """Every batch, in order (run again on another host, those committed already are DUPLICATE)."""
        batch_id = self.opts.first_batch_id
        if self.opts.batch_size == 0:
            parts = [(p, c, r) for m in staged for _, p, c, r in m.parts]
            ack = conn.commit(self.opts.stream, self.job, self.producer, batch_id, parts)
            self.report(ack, f"batch {batch_id} of {self.producer}")
            return
        for m in staged:
            for staging_id, p, c, r in m.parts:
                ack = conn.commit(self.opts.stream, staging_id, self.producer, batch_id, [(p, c, r)])
                self.report(ack, f"batch {batch_id} of {self.producer}")
                batch_id += 1

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = [m for m in messages if isinstance(m, Staged)]
        self.drop_copies(staged, keep="")
        ids = {self.job} | {sid for m in staged for sid, *_ in m.parts}
        with self.conn() as conn:
            for staging_id in sorted(ids):
                conn.abort(self.opts.stream, staging_id)


def _split(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[list[pa.RecordBatch]]:
    """Record batches regrouped into lists of exactly `size` rows (the last may be shorter)."""
    group: list[pa.RecordBatch] = []
    n = 0
    for batch in batches:
        while batch.num_rows:
            take = min(batch.num_rows, size - n)
            group.append(batch.slice(0, take))
            batch = batch.slice(take)
            n += take
            if n == size:
                yield group
                group, n = [], 0
    if group:
        yield group


__all__ = ["BatchSinkWriter", "Staged", "StreamSinkWriter"]
