"""Spark streaming source: a streamtx output stream, with batch ids as offsets.

The offset is `{"next": N}`: every batch with an id below N has been read.
The latest offset is one past the server's `complete_through` — every batch
up to it is final — so a range, once planned, always reads the same batches:
a restart from the checkpoint re-reads the planned range and goes on, with no
gap and no repeat.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from streamtx.client.spark.options import Options, read_schema
from streamtx.errors import FailedPrecondition

TS_COLUMN = "__ts"  # the timestamp of the batch a row came in, as the server's stream views name it


def source_schema(opts: Options) -> StructType:
    """The stream's columns plus `__ts` (checked on the driver: the stream exists and is readable)."""
    with opts.conn(retry_for_s=min(opts.timeout_s, 10.0)) as conn:
        desc = conn.describe(opts.stream)
    if not desc.readable:
        raise FailedPrecondition(
            f"streamtx: stream {opts.stream!r} is consumed by a procedure (its tuples are garbage "
            "collected); read a stream no procedure consumes"
        )
    schema = read_schema(desc.arrow_schema)
    return from_arrow_schema(schema.append(pa.field(TS_COLUMN, pa.int64())))


class TsRange(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


class StreamSourceReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = Options.parse(options)
        self.schema = schema

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's names
        return {"next": self.opts.starting_ts}

    def latestOffset(self, start: dict, limit: object) -> dict:  # noqa: N802
        with self.opts.conn(timeout_s=self.opts.timeout_s) as conn:
            complete = conn.describe(self.opts.stream, complete_through=True).complete_through
        return {"next": max(int(start["next"]), complete + 1)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [TsRange(int(start["next"]), int(end["next"]))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TsRange)
        names = [f.name for f in self.schema.fields]
        with self.opts.conn(timeout_s=self.opts.timeout_s) as conn:
            for ts, table in conn.read(self.opts.stream, partition.start, partition.end):
                if table.num_rows == 0:
                    continue
                table = table.append_column(TS_COLUMN, pa.array([ts] * table.num_rows, pa.int64()))
                yield from table.select(names).to_batches()

    def commit(self, end: dict) -> None:
        pass


__all__ = ["StreamSourceReader", "source_schema"]
