"""The connector's driver-side checks, without Spark: options, type compatibility, the query id."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from streamtx.client.spark.options import Options, query_id_from_checkpoint
from streamtx.client.spark.schema import column_map, conform_batch, lossless
from streamtx.errors import FailedPrecondition, InvalidArgument


def test_options_parse_and_refuse():
    o = Options.parse({"Stream": "s", "target": "h:1", "chunk_rows": "10", "checkpointLocation": "/c"})
    assert (o.stream, o.target, o.chunk_rows, o.checkpoint, o.on_rejected) == ("s", "h:1", 10, "/c", "log")
    with pytest.raises(InvalidArgument, match='option "stream" is required'):
        Options.parse({})
    with pytest.raises(InvalidArgument, match="unknown option\\(s\\) 'batchsize'"):
        Options.parse({"stream": "s", "batchsize": "3"})
    with pytest.raises(InvalidArgument, match="'chunk_rows' must be an integer"):
        Options.parse({"stream": "s", "chunk_rows": "ten"})
    with pytest.raises(InvalidArgument, match="'chunk_rows' must be >= 1"):
        Options.parse({"stream": "s", "chunk_rows": "0"})
    with pytest.raises(InvalidArgument, match="on_rejected must be one of fail, log"):
        Options.parse({"stream": "s", "on_rejected": "ignore"})
    with pytest.raises(InvalidArgument, match="option 'target': .*no HOST:PORT"):
        Options.parse({"stream": "s", "target": " , "})
    with pytest.raises(InvalidArgument, match="'stage_copies' must be >= 1"):
        Options.parse({"stream": "s", "stage_copies": "0"})


def test_rows_are_staged_on_two_hosts_of_several_by_default():
    assert Options.parse({"stream": "s", "target": "h:1"}).stage_copies == 1
    assert Options.parse({"stream": "s", "target": "h:1,h:2,h:3"}).stage_copies == 2
    assert Options.parse({"stream": "s", "target": "h:1,h:2", "stage_copies": "5"}).stage_copies == 2
    assert Options.parse({"stream": "s", "target": "h:1,h:2,h:3", "stage_copies": "1"}).stage_copies == 1


@pytest.mark.parametrize(
    ("src", "dst", "ok"),
    [
        (pa.int32(), pa.int64(), True),
        (pa.int64(), pa.int32(), False),
        (pa.int32(), pa.float64(), True),
        (pa.int64(), pa.float64(), False),
        (pa.float32(), pa.float64(), True),
        (pa.float64(), pa.float32(), False),
        (pa.string(), pa.large_string(), True),
        (pa.timestamp("us", "UTC"), pa.timestamp("us"), True),
        (pa.string(), pa.int64(), False),
        (pa.decimal128(10, 2), pa.decimal128(12, 2), True),
        (pa.decimal128(10, 2), pa.decimal128(10, 3), False),
    ],
)
def test_lossless(src, dst, ok):
    assert lossless(src, dst) is ok


def test_column_map_and_conform():
    stream = pa.schema([("vote_id", pa.int64()), ("c", pa.int32())])
    df = StructType([StructField("C", IntegerType()), StructField("VOTE_ID", IntegerType())])
    mapping = column_map(df, stream, "votes")
    assert mapping == {"vote_id": "VOTE_ID", "c": "C"}
    batch = pa.record_batch([pa.array([1, 2], pa.int32()), pa.array([7, 8], pa.int32())], names=["C", "VOTE_ID"])
    out = conform_batch(batch, mapping, stream)
    assert out.schema == stream and out.column("vote_id").to_pylist() == [7, 8]
    with pytest.raises(InvalidArgument, match="missing column\\(s\\) 'c'.*'x' not in the stream"):
        column_map(StructType([StructField("vote_id", LongType()), StructField("x", StringType())]), stream, "votes")
    with pytest.raises(InvalidArgument, match="column 'c' is bigint in the DataFrame but int32.*cast\\('int'\\)"):
        column_map(StructType([StructField("vote_id", LongType()), StructField("c", LongType())]), stream, "votes")


def test_query_id_from_checkpoint(tmp_path):
    (tmp_path / "metadata").write_text(json.dumps({"id": "abc-123"}) + "\n")
    assert query_id_from_checkpoint(str(tmp_path)) == "abc-123"
    assert query_id_from_checkpoint(f"file:{tmp_path}") == "abc-123"
    with pytest.raises(FailedPrecondition, match="set the checkpointLocation option"):
        query_id_from_checkpoint("")
    with pytest.raises(FailedPrecondition, match="cannot read the query id"):
        query_id_from_checkpoint(str(tmp_path / "nope"))
