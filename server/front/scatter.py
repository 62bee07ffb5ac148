"""Reads that span partitions: Query by scatter/gather, and stream reads merged by batch id.

A query that touches no partitioned table is answered by the home partition
(single tables live there, replicated ones everywhere). Otherwise each
partitioned table it names is gathered from every partition, the others from
the home partition, at one cut of the command order, and DuckDB runs the
query over them on the front: any SQL keeps its meaning (COUNT, SUM, AVG,
ORDER BY ... LIMIT, joins), with no hand-written merging. Filters the query
puts on a lone partitioned table are pushed down to the partitions.
"""

from __future__ import annotations

import asyncio
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from streamtx.errors import InvalidArgument
from streamtx.server import protocol as pr
from streamtx.server import sqltree
from streamtx.server.catalog.compile import STREAM_SCHEMA, quote
from streamtx.server.catalog.placement import PARTITIONED, Placement
from streamtx.server.deadline import query_deadline
from streamtx.server.front.partitions import Reply
from streamtx.server.front.ports import Reads
from streamtx.server.partitioning import HOME


async def query(
    reader: Reads, placement: Placement, partitions: int, timeout: float, sql: str, params: dict[str, Any]
) -> pa.Table:
    """The query's result: from home alone, or run here over the partitions' rows gathered at one cut.

    `partitions`: how many there are; `timeout` (`--query-timeout`) bounds the run over the gathered rows.
    """
    spread = _partitioned_relations(placement, sql) if partitions > 1 else []
    if not spread:
        _, tables = await reader.ask(HOME, pr.Query(sql, params))
        return tables[0]
    relations = _relations(sql)
    reads = {}
    for schema, name in relations:
        qualified = f"{quote(schema)}.{quote(name)}" if schema else quote(name)
        reads[(schema, name)] = f"SELECT * FROM {qualified}"
    spread_set = set(spread)
    # one cut: every partition reads at the same place of its queue; single tables count at home only
    replies = await reader.ask_all(pr.Gather([[list(k), v] for k, v in reads.items()]))
    gathered: dict[tuple[str, str], list[pa.Table]] = {}
    for index, (reply, tables) in enumerate(replies):
        for key, table in zip(reply.keys, tables, strict=True):
            if tuple(key) in spread_set or index == HOME:
                gathered.setdefault(tuple(key), []).append(table)
    return await asyncio.to_thread(_run_over, sql, params, gathered, timeout)


def _run_over(
    sql: str, params: dict[str, Any], gathered: dict[tuple[str, str], list[pa.Table]], timeout: float
) -> pa.Table:
    """The query over the gathered tables, in a DuckDB of its own; off the event loop, which keeps serving."""
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        for (schema, name), parts in gathered.items():
            table = pa.concat_tables(parts)
            handle = f"__gathered_{schema}_{name}"
            con.register(handle, table)
            if schema:
                con.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(schema)}")
                con.execute(f"CREATE VIEW {quote(schema)}.{quote(name)} AS SELECT * FROM {quote(handle)}")
            else:
                con.execute(f"CREATE VIEW {quote(name)} AS SELECT * FROM {quote(handle)}")
        try:
            with query_deadline(con, timeout, lambda: "query over the gathered partitions"):
                return con.sql(sql, params=params).to_arrow_table()
        except duckdb.Error as e:
            raise InvalidArgument(f"query: {e}") from None
    finally:
        con.close()


def _relations(sql: str) -> list[tuple[str, str]]:
    try:
        tree = sqltree.parse(sql)
    except sqlglot.errors.ParseError:
        return []
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    out = []
    for t in tree.find_all(exp.Table):
        key = (t.db or "", t.name)
        if not t.name or (not t.db and t.name in ctes):  # no name: a table function (range(n), read_csv)
            continue
        if key not in out:
            out.append(key)
    return out


def _partitioned_relations(pl: Placement, sql: str) -> list[tuple[str, str]]:
    """Relations of the query whose rows are spread over partitions: partitioned tables and stored streams."""
    out = []
    for schema, name in _relations(sql):
        stored_stream = schema in ("", STREAM_SCHEMA) and name in pl.streams
        if (not schema and pl.tables.get(name) == PARTITIONED) or stored_stream:
            out.append((schema, name))
    return out


def merge_stream_reads(replies: list[Reply], max_batches: int) -> list[tuple[int, pa.Table]]:
    """Batches of a stored stream from every partition, merged by timestamp, without gaps.

    A partition that returned `max_batches` batches may hold more beyond its
    last one, so the merge stops there: a later read resumes after it.
    """
    by_ts: dict[int, list[pa.Table]] = {}
    cut = None
    for batches, tables in replies:
        stamps = batches.ts
        for ts, t in zip(stamps, tables, strict=True):
            by_ts.setdefault(ts, []).append(t)
        if len(stamps) >= max_batches:
            cut = stamps[-1] if cut is None else min(cut, stamps[-1])
    keep = sorted(ts for ts in by_ts if cut is None or ts <= cut)[:max_batches]
    return [(ts, pa.concat_tables(by_ts[ts])) for ts in keep]
