"""The `streamtx` data source for PySpark (Spark's Python Data Source API).

    from streamtx.client.spark import register
    register(spark)
    df.writeStream.format("streamtx").option("target", "host:7411").option("stream", "votes_in") \
        .option("checkpointLocation", "/ckpt").start()
    df.write.format("streamtx").option("stream", "votes_in").mode("append").save()
    spark.readStream.format("streamtx").option("stream", "counted").load()

Options: target (HOST:PORT, default STREAMTX_TARGET or 127.0.0.1:7411), stream,
chunk_rows (rows per Stage call), batch_size / producer_id / first_batch_id
(batch sink), on_rejected (log | fail), starting_ts (source), timeout (s),
token and tls_ca / tls_cert / tls_key (PEM paths, read on the driver; defaults
STREAMTX_TOKEN, STREAMTX_TLS_CA, ...).
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from streamtx.client.spark.options import Options
from streamtx.client.spark.sink import BatchSinkWriter, StreamSinkWriter
from streamtx.client.spark.source import StreamSourceReader, source_schema


class StreamTxDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "streamtx"

    def schema(self) -> StructType:
        return source_schema(Options.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return BatchSinkWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return StreamSinkWriter(dict(self.options), schema, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return StreamSourceReader(dict(self.options), schema)


def register(spark: SparkSession) -> None:
    """Makes `format("streamtx")` available in this session."""
    spark.dataSource.register(StreamTxDataSource)


__all__ = ["StreamTxDataSource", "register"]
