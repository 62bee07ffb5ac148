"""Input batches bound by name (server/partition/relations.py): rebinding without re-registering."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamtx.server.catalog.catalog import Catalog
from streamtx.server.catalog.compile import batch_relation
from streamtx.server.config import default_procedures_path
from streamtx.server.loader import ProcedureLoader
from streamtx.server.partition.engine import Engine

NAME = batch_relation("s")


@pytest.fixture
def eng():
    loader = ProcedureLoader(default_procedures_path())
    eng = Engine(0, loader)
    new, _, _, ddl = Catalog().deploy("CREATE STREAM s (a BIGINT, b VARCHAR);", loader.resolve)
    eng.install(new, ddl)
    yield eng
    eng.con.close()


def read(eng: Engine) -> list[tuple]:
    return eng.con.execute(f'SELECT a, typeof(a), b FROM "{NAME}" ORDER BY a').fetchall()


def test_each_bind_is_what_the_next_statement_reads(eng):
    for n in (3, 1, 0, 2):
        eng.relations.bind(NAME, pa.table({"a": pa.array(range(n), pa.int64()), "b": ["x"] * n}))
        assert read(eng) == [(i, "BIGINT", "x") for i in range(n)]


def test_other_types_are_cast_to_the_stream_s_and_lossy_ones_keep_their_own(eng):
    eng.relations.bind(NAME, pa.table({"a": pa.array([7], pa.int32()), "b": pa.array([1], pa.int64())}))
    assert read(eng) == [(7, "BIGINT", "1")]  # as INSERT INTO the stream table would store them
    eng.relations.bind(NAME, pa.table({"a": [1.5], "b": ["y"]}))  # 1.5 is no BIGINT: registered as it is
    assert read(eng) == [(1.5, "DOUBLE", "y")]
    eng.relations.bind(NAME, pa.table({"a": pa.array([4], pa.int64()), "b": ["z"]}))  # plain from now on
    assert read(eng) == [(4, "BIGINT", "z")]


def test_a_bind_in_a_rolled_back_transaction_leaves_the_name_bound(eng):
    eng.con.execute("BEGIN")
    eng.relations.bind(NAME, pa.table({"a": pa.array([1], pa.int64()), "b": ["in"]}))
    assert read(eng) == [(1, "BIGINT", "in")]
    eng.con.execute("ROLLBACK")
    eng.relations.bind(NAME, pa.table({"a": pa.array([2], pa.int64()), "b": ["after"]}))
    assert read(eng) == [(2, "BIGINT", "after")]


def test_a_deploy_binds_the_new_streams(eng):
    new, _, _, ddl = eng.catalog.deploy("CREATE STREAM t (c BIGINT);", eng.loader.resolve)
    eng.install(new, ddl)
    eng.relations.bind(batch_relation("t"), pa.table({"c": pa.array([5], pa.int16())}))
    assert eng.con.execute(f'SELECT c, typeof(c) FROM "{batch_relation("t")}"').fetchall() == [(5, "BIGINT")]
