"""FOREIGN KEYs between tables: deploys create targets first and drop them last, whatever the names."""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtx.errors import InvalidArgument
from streamtx.server.catalog.catalog import Catalog
from streamtx.server.catalog.physical import referenced_tables


@st.composite
def schemas(draw) -> tuple[dict[str, list[str]], list[str]]:
    """Tables with FOREIGN KEYs to tables earlier in a random dependency order (so a DAG), named so that
    name order and dependency order disagree, and a random script order."""
    n = draw(st.integers(1, 6))
    names = draw(st.permutations([f"t{i}" for i in range(n)]))
    refs = {name: sorted(draw(st.sets(st.sampled_from(names[:i])))) if i else [] for i, name in enumerate(names)}
    return refs, draw(st.permutations(names))


def create_sql(name: str, refs: list[str]) -> str:
    cols = ["id INTEGER PRIMARY KEY"] + [f"r_{r} INTEGER REFERENCES {r}(id)" for r in refs]
    return f"CREATE TABLE {name} ({', '.join(cols)});"


def run(con: duckdb.DuckDBPyConnection, physical: list[str]) -> None:
    for sql in physical:
        con.execute(sql)


def user_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()
    return {r[0] for r in rows}


@settings(max_examples=120, deadline=None)
@given(schemas(), st.randoms(use_true_random=False))
def test_any_script_order_deploys_and_drops_in_duckdb(schema, rnd):
    refs, order = schema
    cat, _, _, physical = Catalog().deploy("\n".join(create_sql(n, refs[n]) for n in order))
    con = duckdb.connect()
    run(con, physical)  # what a partition runs: targets created before the tables referencing them
    assert user_tables(con) == set(refs)
    for name in (n for n in order if refs[n]):  # the constraints are DuckDB's own
        with pytest.raises(duckdb.ConstraintException):
            con.execute(f"INSERT INTO {name} (id, r_{refs[name][0]}) VALUES (1, 999)")

    drop_order = sorted(refs, key=lambda n: rnd.random())
    users = {n: {m for m in refs if n in refs[m]} for n in refs}
    if any(users[n] - set(drop_order[:i]) for i, n in enumerate(drop_order)):
        with pytest.raises(InvalidArgument, match=r"cannot drop table 't\d': used by table t\d \(FOREIGN KEY\)"):
            cat.deploy("\n".join(f"DROP TABLE {n};" for n in drop_order))
        drop_order = sorted(refs, key=lambda n: -_depth(refs, n))  # referencing tables first
    _, _, _, physical = cat.deploy("\n".join(f"DROP TABLE {n};" for n in drop_order))
    run(con, physical)
    assert user_tables(con) == set()


def _depth(refs: dict[str, list[str]], name: str) -> int:
    return 1 + max((_depth(refs, r) for r in refs[name]), default=0)


def test_references_read_from_the_table_sql():
    sql = 'CREATE TABLE a (x INT REFERENCES Z(id), y INT, FOREIGN KEY (y) REFERENCES "Q r" (k), z INT)'
    assert referenced_tables(sql) == {"z", "Q r"}
    assert referenced_tables("CREATE TABLE b (x INT PRIMARY KEY)") == frozenset()


def test_cyclic_references_are_refused_by_name():
    with pytest.raises(InvalidArgument, match=r"deploy: tables p, q reference each other"):
        Catalog().deploy(
            "CREATE TABLE p (x INT PRIMARY KEY REFERENCES q(id)); CREATE TABLE q (id INT PRIMARY KEY REFERENCES p(x));"
        )


def test_server_refuses_dropping_a_referenced_table_and_keeps_serving(client):
    client.deploy("CREATE TABLE a (x INT REFERENCES z(id)); CREATE TABLE z (id INT PRIMARY KEY);")
    with pytest.raises(InvalidArgument, match=r"cannot drop table 'z': used by table a \(FOREIGN KEY\); drop those"):
        client.deploy("DROP TABLE z;")
    assert sorted(client.status()["tables"]) == ["a", "z"]
    client.deploy("DROP TABLE a; DROP TABLE z;")
    assert client.status()["tables"] == []
