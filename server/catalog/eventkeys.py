"""`PARTITION ON (columns)` of a state procedure: where its events' keys live, checked at deploy.

A state procedure declares its state accesses in Python (pre_process), which
the front never runs. So the deploy names the event columns that hold the
keys of partitioned tables the events touch; the front hashes them per batch
(PartitionMap.partitions_of) to know the partitions a batch involves: one
partition runs it locally, several run it coordinated (server/front/exchange.py).
A list column (e.g. `keys BIGINT[]`) counts with every element.

These checks do not depend on the partition count, so a deploy is accepted
or refused alike on 1 or 4 partitions.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from streamtx.errors import InvalidArgument
from streamtx.procedure import StateProcedure
from streamtx.server.catalog.defs import ProcedureDef, StreamDef
from streamtx.server.catalog.graph import Dataflow


def hashable(t: pa.DataType) -> bool:
    """Whether values of this Arrow type can be partition keys (as server/partitioning.py hashes them)."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    )


def key_column_type_ok(t: pa.DataType) -> bool:
    """A key, or a list of keys (all its elements count)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return hashable(t.value_type)
    return hashable(t)


def check_kind(proc: ProcedureDef, fn: Any, resolved: bool) -> None:
    """Only a state procedure (AS PYTHON, a StateProcedure) declares its events' key columns."""
    if not proc.key_columns:
        return
    listed = ", ".join(proc.key_columns)
    if proc.python is None:
        raise InvalidArgument(
            f"deploy: procedure {proc.name!r}: PARTITION ON ({listed}) names the key columns of a state "
            "procedure's events; a SQL procedure ON STREAM runs where its stream's PARTITION BY column says"
        )
    if resolved and not isinstance(fn, StateProcedure):
        raise InvalidArgument(
            f"deploy: procedure {proc.name!r}: PARTITION ON ({listed}) names the key columns of a state "
            f"procedure's events, but {proc.python!r} is not a StateProcedure"
        )


def check(proc: ProcedureDef, input_stream: StreamDef, schema: pa.Schema, flow: Dataflow, fired: list[str]) -> None:
    """The columns exist and hold keys; the procedure can run wherever its batches' keys say.

    `schema` is the input stream's Arrow schema; `fired`, the EE triggers its TEs fire.
    """
    stream = input_stream.name
    listed = ", ".join(proc.key_columns)
    what = f"deploy: procedure {proc.name!r} (PARTITION ON ({listed}))"
    declared = dict(input_stream.columns)
    for col in proc.key_columns:
        if col not in schema.names:
            raise InvalidArgument(
                f"{what}: column {col!r} is not a column of stream {stream!r} (columns: {', '.join(schema.names)})"
            )
        if not key_column_type_ok(schema.field(col).type):
            raise InvalidArgument(
                f"{what}: column {col!r} of stream {stream!r} is {declared[col]}; key columns hold integers, "
                "strings, dates or timestamps, or lists of them (e.g. BIGINT[])"
            )
    partition_by = input_stream.partition_by
    if partition_by:
        raise InvalidArgument(
            f"{what}: stream {stream!r} is PARTITION BY ({partition_by}), which places the procedure already; "
            "drop one of the two"
        )
    others = sorted(p for p in flow.consumers[stream] if p != proc.name)
    if others:
        raise InvalidArgument(
            f"{what}: it must be the only consumer of stream {stream!r}, which {', '.join(others)} consumes too"
        )
    group = flow.group_of(proc.name)
    if group is not None:
        raise InvalidArgument(f"{what}: it cannot be in transaction group {group!r}")
    if fired:
        raise InvalidArgument(
            f"{what}: EE trigger {fired[0]!r} fires on a stream it emits; its TEs may span partitions, "
            "where EE triggers on its outputs are not supported: consume that stream with a procedure"
        )
