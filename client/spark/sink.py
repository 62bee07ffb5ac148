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
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from streamtx.client.spark.options import Options, query_id_from_checkpoint, read_schema
from streamtx.client.spark.rpc import Conn, ack_text
from streamtx.client.spark.schema import column_map, conform_batch
from streamtx.errors import Aborted, FailedPrecondition, InvalidArgument
from streamtx.v1 import streamtx_pb2 as pb

QUERY_ID_KEY = "sql.streaming.queryId"  # Spark's local properties of a micro-batch's tasks
BATCH_ID_KEY = "streaming.sql.batchId"
IN_FLIGHT = 2  # Stage calls a task keeps in flight (overlaps encoding with the server's work)


@dataclass
class Staged(WriterCommitMessage):
    """What one task attempt staged: the parts it wrote, each (staging id, part, chunks, rows)."""

    partition: int
    parts: list[tuple[str, str, int, int]]
    query_id: str = ""


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

    def stage(self, conn: Conn, staging_id: str, part: str, batches: Iterator[pa.RecordBatch]) -> tuple[int, int]:
        """Stages record batches as chunks of `chunk_rows` rows, a few in flight; returns (chunks, rows)."""
        schema = read_schema(self.stream_schema_bytes)
        chunk_rows = self.opts.chunk_rows
        pending: list = []
        buf: list[pa.RecordBatch] = []
        buffered = chunks = rows = 0

        def flush() -> None:
            nonlocal buffered, chunks
            if not buf:
                return
            pending.append(conn.stage_future(self.opts.stream, staging_id, part, chunks, pa.Table.from_batches(buf)))
            chunks += 1
            buf.clear()
            buffered = 0
            if len(pending) > IN_FLIGHT:
                conn.finish_stage(pending.pop(0))

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
        for started in pending:
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
        with self.conn() as conn:
            chunks, rows = self.stage(conn, staging_id, part, iterator)
        return Staged(partition=tc.partitionId(), parts=[(staging_id, part, chunks, rows)], query_id=query_id)

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
        with self.conn() as conn:
            ack = conn.commit(self.opts.stream, staging_id, producer, batchId + 1, parts)
        self.report(ack, f"micro-batch {batchId} (batch {batchId + 1} of {producer})")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        try:
            query_id = self._query_id(messages)
        except FailedPrecondition:
            return  # nothing named: whatever was staged expires
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
        with self.conn() as conn:
            if size == 0:
                chunks, rows = self.stage(conn, self.job, part, iterator)
                return Staged(partition=tc.partitionId(), parts=[(self.job, part, chunks, rows)])
            parts = []
            for i, piece in enumerate(_split(iterator, size)):
                staging_id = f"{self.job}/{tc.partitionId()}/{i}"
                chunks, rows = self.stage(conn, staging_id, part, iter(piece))
                parts.append((staging_id, part, chunks, rows))
        return Staged(partition=tc.partitionId(), parts=parts)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = sorted((m for m in messages if isinstance(m, Staged)), key=lambda m: m.partition)
        batch_id = self.opts.first_batch_id
        with self.conn() as conn:
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
        ids = {self.job} | {sid for m in messages if isinstance(m, Staged) for sid, *_ in m.parts}
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
