"""Tests for the deploy-script parser (streamtx.server.catalog.ddl)."""

from __future__ import annotations

import pickle

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtx.server.catalog.ddl import (
    Column,
    CreateGroup,
    CreateIndex,
    CreateProcedure,
    CreateStream,
    CreateTable,
    CreateTrigger,
    CreateView,
    CreateWindow,
    DdlError,
    Drop,
    Param,
    parse_script,
    split_sql,
)


def one(script: str):
    stmts = parse_script(script)
    assert len(stmts) == 1, stmts
    return stmts[0]


def error(script: str) -> DdlError:
    with pytest.raises(DdlError) as info:
        parse_script(script)
    return info.value


# --------------------------------------------------------------------------- tables


def test_create_table_strips_partition_by_and_runs_in_duckdb():
    stmt = one(
        "CREATE TABLE votes (\n"
        "  id BIGINT PRIMARY KEY,\n"
        "  name VARCHAR NOT NULL DEFAULT 'a;b',\n"
        "  amount DECIMAL(10, 2) CHECK (amount > 0)\n"
        ") PARTITION BY (id);"
    )
    assert isinstance(stmt, CreateTable)
    assert stmt.name == "votes"
    assert stmt.partition_by == "id"
    assert not stmt.if_not_exists
    assert stmt.line == 1
    assert "PARTITION" not in stmt.sql.upper()
    con = duckdb.connect()
    con.execute(stmt.sql)
    con.execute("INSERT INTO votes VALUES (1, 'x', 2.5)")
    assert con.execute("SELECT count(*) FROM votes").fetchone() == (1,)


def test_create_table_variants():
    stmt = one('create table if not exists "MyTable" (a int) partition by a')
    assert stmt == CreateTable("MyTable", 'create table if not exists "MyTable" (a int)', "a", True, 1)
    duckdb.connect().execute(stmt.sql)
    stmt = one("CREATE TABLE Plain (a INT)")
    assert (stmt.name, stmt.partition_by, stmt.sql) == ("plain", None, "CREATE TABLE Plain (a INT)")


def test_create_table_keeps_comments_inside_runnable():
    stmt = one('CrEaTe TaBlE t ( -- the key; really\n a INT /* ) */ ) pArTiTiOn By ( "A" ) ;')
    assert stmt.partition_by == "A"
    duckdb.connect().execute(stmt.sql)


# --------------------------------------------------------------------------- streams


def test_create_stream_columns_and_types():
    stmt = one(
        'CREATE STREAM IF NOT EXISTS "Ev" (a decimal( 10 ,2 ), b bigint [], '
        'c struct(X int, "y z" varchar), d map(varchar,int), e INT[3], '
        'f timestamp  with time zone, "Q" varchar) PARTITION BY (a);'
    )
    assert isinstance(stmt, CreateStream)
    assert stmt.name == "Ev" and stmt.if_not_exists and stmt.partition_by == "a"
    assert stmt.columns == (
        Column("a", "DECIMAL(10, 2)"),
        Column("b", "BIGINT[]"),
        Column("c", 'STRUCT(X INT, "y z" VARCHAR)'),
        Column("d", "MAP(VARCHAR, INT)"),
        Column("e", "INT[3]"),
        Column("f", "TIMESTAMP WITH TIME ZONE"),
        Column("Q", "VARCHAR"),
    )
    con = duckdb.connect()
    for col in stmt.columns:
        con.execute(f"SELECT NULL::{col.type}")


def test_create_stream_without_partition():
    assert one("create stream s (x int)") == CreateStream("s", (Column("x", "INT"),), None, False, 1)


@pytest.mark.parametrize(
    ("cols", "label"),
    [
        ("x INT PRIMARY KEY", "PRIMARY KEY"),
        ("x INT NOT NULL", "NOT NULL"),
        ("x INT DEFAULT 3", "DEFAULT"),
        ("x INT UNIQUE", "UNIQUE"),
        ("x INT CHECK (x > 0)", "CHECK"),
        ("x INT REFERENCES t(id)", "REFERENCES"),
    ],
)
def test_stream_column_constraints_are_errors(cols, label):
    err = error(f"\n\nCREATE STREAM s (a INT,\n {cols});")
    assert err.line == 4
    assert err.message == (
        f'CREATE STREAM s: column "x" has a constraint ({label}); stream columns take a name and a type only'
    )
    assert str(err).startswith(f'line 4: CREATE STREAM s: column "x" has a constraint ({label})')


def test_stream_table_constraint_and_bad_columns():
    assert "table constraint PRIMARY KEY" in error("create stream s (a int, primary key (a))").message
    assert error("create stream s (a)").message == 'CREATE STREAM s: column "a" has no type'
    assert "duplicate column" in error("create stream s (a int, A bigint)").message
    assert "empty column definition" in error("create stream s (a int,)").message
    assert "column list is empty" in error("create stream s ()").message
    assert "expected a type, found 5" in error("create stream s (a 5)").message
    assert "unexpected = in the type" in error("create stream s (a int = 5)").message


# --------------------------------------------------------------------------- windows


def test_create_window_rows_and_range():
    assert one("CREATE WINDOW w ON s ROWS 10 SLIDE 5;") == CreateWindow("w", "s", "rows", 10, 5, False, 1)
    assert one('create window if not exists "W" on stream "S" range 100 slide 100') == (
        CreateWindow("W", "S", "range", 100, 100, True, 1)
    )


def test_window_errors():
    script = "\n".join(["create table t (a int);"] * 6 + ["CREATE WINDOW w ON s ROWS 3 SLIDE 5;"])
    err = error(script)
    assert str(err) == "line 7: CREATE WINDOW w: SLIDE 5 is larger than ROWS 3"
    assert (err.line, err.column) == (7, 0)
    assert "RANGE expects a positive integer, found 0" in error("create window w on s range 0 slide 1").message
    assert "SLIDE expects a positive integer, found -" in error("create window w on s rows 3 slide -1").message
    assert "found 1.5" in error("create window w on s rows 1.5 slide 1").message
    assert "expected SLIDE" in error("create window w on s rows 3").message
    assert "expected ROWS n or RANGE t" in error("create window w on s slide 3").message


# --------------------------------------------------------------------------- procedures


def test_procedure_full_header_and_body():
    stmt = one(
        "CREATE OR REPLACE PROCEDURE Vote(p BIGINT, amount decimal(10,2), tags varchar[])\n"
        "  ON STREAM votes PARTITION ON P\n"
        "AS BEGIN\n"
        "  SELECT 1;\n"
        "  UPDATE t SET n = n + 1 WHERE id = p;\n"
        "END;"
    )
    assert stmt == CreateProcedure(
        name="vote",
        params=(
            Param("p", "BIGINT"),
            Param("amount", "DECIMAL(10, 2)"),
            Param("tags", "VARCHAR[]"),
        ),
        on_stream="votes",
        partition_on="p",
        body=("SELECT 1", "UPDATE t SET n = n + 1 WHERE id = p"),
        python=None,
        or_replace=True,
        line=1,
        body_lines=(4, 5),
    )


def test_procedure_clause_order_and_no_params():
    stmt = one("create procedure p partition on x on stream s as begin select 1 end")
    assert (stmt.params, stmt.on_stream, stmt.partition_on) == ((), "s", "x")
    assert not stmt.or_replace
    assert one("create procedure p () as begin select 1; end;").params == ()


def test_procedure_body_with_case_strings_comments_and_dollar_quotes():
    stmt = one(
        "create procedure p as begin\n"
        "  select case when x then 'END; ;' else case y when 1 then 2 end end from t;\n"
        "  -- a comment; END\n"
        "  /* another ; END\n */ insert into log values ('it''s; END', $$ ; END $$);\n"
        "  select $tag$ END; $$ $tag$, t.end as e from t\n"
        "end;"
    )
    assert stmt.body == (
        "select case when x then 'END; ;' else case y when 1 then 2 end end from t",
        "insert into log values ('it''s; END', $$ ; END $$)",
        "select $tag$ END; $$ $tag$, t.end as e from t",
    )
    assert stmt.body_lines == (2, 5, 6)


def test_procedure_body_missing_final_semicolon():
    assert one("create procedure p as begin select 1; select 2 end").body == (
        "select 1",
        "select 2",
    )
    assert one("create procedure p as begin select 1; end").body == ("select 1",)


def test_procedure_body_statements_run_in_duckdb():
    stmt = one("create procedure p as begin create table t (a int); insert into t values (1); end")
    con = duckdb.connect()
    for sql in stmt.body:
        con.execute(sql)
    assert con.execute("select * from t").fetchall() == [(1,)]


def test_procedure_python_form():
    stmt = one("create or replace procedure Fast (k bigint) partition on k as python 'pkg.mod:run';")
    assert stmt == CreateProcedure("fast", (Param("k", "BIGINT"),), None, "k", (), "pkg.mod:run", True, 1, ())
    assert "AS PYTHON expects a string 'module:function'" in error("create procedure p as python 'nocolon'").message
    assert "unexpected" in error("create procedure p as python 'm:f' extra").message


def test_procedure_for_each_row():
    stmt = one("CREATE PROCEDURE vote ON STREAM votes_in FOR EACH ROW AS PYTHON 'voter.state:vote';")
    assert isinstance(stmt, CreateProcedure) and stmt.each_row and stmt.on_stream == "votes_in"
    assert one("create procedure v for each row on stream s as begin select 1; end").each_row
    assert not one("create procedure v on stream s as begin select 1; end").each_row
    assert "FOR EACH ROW needs ON STREAM" in error("create procedure p for each row as begin select 1; end").message
    assert "FOR EACH ROW is given twice" in error("create procedure p on stream s for each row for each row as").message
    assert "expected EACH after FOR" in error("create procedure p on stream s for row as begin select 1; end").message


def test_procedure_errors():
    err = error("create table t (a int);\n\nCREATE PROCEDURE vote AS BEGIN\n select 1;\n")
    assert str(err) == "line 3: CREATE PROCEDURE vote: missing END for BEGIN at line 3"
    err = error("\n" * 8 + "CREATE PROCEDURE p AS SELECT 1;")
    assert err.line == 9
    assert str(err).startswith("line 9: CREATE PROCEDURE p: expected AS BEGIN ... END or AS PYTHON 'module:function'")
    assert error("create procedure p begin select 1 end").message.startswith(
        "CREATE PROCEDURE p: expected AS BEGIN ... END or AS PYTHON"
    )
    err = error("create procedure p as\nbegin\nend;")
    assert "empty body" in err.message and err.line == 2
    assert "empty body" in error("create procedure p as begin ; ; end").message
    err = error("create procedure p as begin\n select 1;\n begin;\n commit;\nend")
    assert err.line == 3 and "nested BEGIN at line 3" in err.message
    err = error("create procedure p as begin\n select case when a then 1;\nend")
    assert err.line == 2 and "CASE at line 2 has no END" in err.message
    assert "expected ';' after END, found foo" in error("create procedure p as begin select 1 end foo").message
    assert (
        'parameter "a" has a constraint (DEFAULT)'
        in error("create procedure p (a int default 1) as begin select 1 end").message
    )
    assert (
        "ON STREAM is given twice" in error("create procedure p on stream a on stream b as begin select 1 end").message
    )


# ------------------------------------------------------------- triggers, indexes, groups, drops


def test_triggers():
    assert one("CREATE TRIGGER tr ON STREAM s AS BEGIN INSERT INTO t SELECT * FROM s; END;") == (
        CreateTrigger("tr", "stream", "s", ("INSERT INTO t SELECT * FROM s",), False, 1, (1,))
    )
    stmt = one('create or replace trigger "T" on window w as begin\n delete from x\nend')
    assert stmt == CreateTrigger("T", "window", "w", ("delete from x",), True, 1, (2,))
    assert (
        "expected ON STREAM name or ON WINDOW name"
        in error("create trigger t on table x as begin select 1 end").message
    )
    assert "expected AS BEGIN ... END" in error("create trigger t on stream x as python 'a:b'").message


def test_indexes_pass_through():
    assert one("CREATE INDEX idx ON t (a, b);") == CreateIndex("idx", "CREATE INDEX idx ON t (a, b)", 1)


def test_create_view():
    query = "SELECT g, count(*) AS n FROM t GROUP BY g"
    assert one(f"CREATE VIEW v AS {query};") == CreateView("v", query, 1)
    assert one(f"create materialized view v as\n  {query}") == CreateView("v", query, 1)
    assert "expected AS after the view name" in error(f"CREATE VIEW v {query}").message
    assert "expected SELECT ... GROUP BY after AS" in error("CREATE VIEW v AS VALUES (1)").message
    stmt = one('create unique index if not exists "Ix" on t(a)')
    assert (stmt.name, stmt.sql) == ("Ix", 'create unique index if not exists "Ix" on t(a)')
    assert "an index needs a name" in error("create index on t(a)").message


def test_transaction_groups():
    assert one('CREATE TRANSACTION GROUP g (p1, "P2", p3);') == CreateGroup("g", ("p1", "P2", "p3"), 1)
    assert "at least one procedure" in error("create transaction group g ()").message
    assert "listed twice" in error("create transaction group g (a, A)").message
    assert "expected a procedure name" in error("create transaction group g (a b)").message
    assert "expected ( procedure" in error("create transaction group g").message


@pytest.mark.parametrize("kind", ["table", "stream", "window", "procedure", "trigger", "index", "group"])
def test_drops(kind):
    assert one(f'DROP {kind.upper()} IF EXISTS "X";') == Drop(kind, "X", True, 1)
    assert one(f"drop {kind} x") == Drop(kind, "x", False, 1)


def test_drop_transaction_group_and_errors():
    assert one("drop transaction group g") == Drop("group", "g", False, 1)
    assert "unexpected cascade" in error("drop table t cascade").message
    assert error("drop sequence s").message.startswith("unsupported statement at line 1: drop sequence s;")
    assert one("drop view v") == Drop("view", "v", False, 1)


# --------------------------------------------------------------------------- top level


@pytest.mark.parametrize(
    ("script", "first"),
    [
        ("INSERT INTO t VALUES (1);", "INSERT INTO t"),
        ("select 1", "select 1"),
        ("UPDATE t SET a = 1", "UPDATE t SET"),
        ("alter table t add column b int", "alter table t"),
        ("create sequence s", "create sequence s"),
        ("create or replace macro m(a) as a", "create or replace"),
        ("begin; commit;", "begin"),
    ],
)
def test_unsupported_statements(script, first):
    err = error("create table t (a int);\n-- x\n" + script)
    assert err.line == 3
    assert str(err) == (
        f"line 3: unsupported statement at line 3: {first}; a deploy script holds CREATE/DROP of "
        "tables, streams, windows, procedures, triggers, indexes and views"
    )


def test_or_replace_only_for_procedures_and_triggers():
    assert "OR REPLACE is only supported" in error("create or replace table t (a int)").message


def test_unterminated_literals():
    err = error("create table t (a int);\ncreate table u (b varchar default 'oops);\n")
    assert (err.line, err.column) == (2, 35)
    assert str(err).startswith("line 2: unterminated string literal starting at line 2")
    assert "column 35" in str(err)
    assert "unterminated comment" in error("create table t (a int); /* x").message
    assert "unterminated quoted identifier" in error('create table "t (a int);').message
    assert "unterminated dollar-quoted string" in error("create procedure p as begin select $$x end").message


def test_earlier_statement_error_wins_over_later_lexical_error():
    err = error("select 1;\ncreate table t (a varchar default 'x);")
    assert err.message.startswith("unsupported statement at line 1")


def test_error_is_picklable():
    err = error("select 1")
    again = pickle.loads(pickle.dumps(err))
    assert (again.message, again.line, again.column) == (err.message, err.line, err.column)


def test_empty_and_comment_only_scripts():
    assert parse_script("") == []
    assert parse_script("  ;; -- nothing ; here\n /* ; */ ;") == []


def test_mixed_script():
    script = """
-- schema for the voting benchmark; version 1
CREATE TABLE contestants (id INT PRIMARY KEY, name VARCHAR) PARTITION BY (id);
create table votes (phone bigint, contestant int);
CREATE STREAM vote_in (phone BIGINT, contestant INT, ts TIMESTAMP) PARTITION BY (phone);
/* sliding window; last 100 votes */
CREATE WINDOW recent ON vote_in ROWS 100 SLIDE 10;

CREATE PROCEDURE validate(phone BIGINT, contestant INT) ON STREAM vote_in PARTITION ON phone
AS BEGIN
    INSERT INTO votes
    SELECT phone, contestant
    WHERE contestant IN (SELECT id FROM contestants);
    SELECT CASE WHEN count(*) > 3 THEN 'too many; END' END FROM votes WHERE phone = phone
END;
CREATE PROCEDURE score AS PYTHON 'voter.procs:score';
CREATE TRIGGER leaderboard ON WINDOW recent AS BEGIN
    DELETE FROM votes WHERE phone < 0;
END;
CREATE INDEX votes_phone ON votes (phone);
CREATE TRANSACTION GROUP voting (validate, score);
DROP TRIGGER IF EXISTS old_trigger;
"""
    stmts = parse_script(script)
    assert [type(s) for s in stmts] == [
        CreateTable,
        CreateTable,
        CreateStream,
        CreateWindow,
        CreateProcedure,
        CreateProcedure,
        CreateTrigger,
        CreateIndex,
        CreateGroup,
        Drop,
    ]
    assert [s.line for s in stmts] == [3, 4, 5, 7, 9, 16, 17, 20, 21, 22]
    validate = stmts[4]
    assert validate.body_lines == (11, 14)
    assert validate.body[0].startswith("INSERT INTO votes\n") and validate.body[0].endswith(
        "(SELECT id FROM contestants)"
    )
    assert stmts[6].body_lines == (18,)
    con = duckdb.connect()
    for stmt in stmts[:2]:
        con.execute(stmt.sql)
    con.execute(stmts[7].sql)
    assert validate.body[1] == ("SELECT CASE WHEN count(*) > 3 THEN 'too many; END' END FROM votes WHERE phone = phone")
    assert stmts[5].python == "voter.procs:score"
    assert stmts[8].procedures == ("validate", "score")


def test_split_sql():
    assert split_sql("select 1; -- x;\n select ';' ; ;  /* ; */ select 2") == [
        ("select 1", 1),
        ("select ';'", 2),
        ("select 2", 2),
    ]
    assert split_sql("select $$a;b$$;\n\n  select 'it''s;'") == [
        ("select $$a;b$$", 1),
        ("select 'it''s;'", 3),
    ]
    assert split_sql(" ;\n -- only a comment\n") == []
    with pytest.raises(DdlError, match="unterminated string literal starting at line 1"):
        split_sql("select 'x")


# --------------------------------------------------------------------------- property


_NAMES = st.builds(lambda i: f"n{i}", st.integers(0, 999))
_QUOTED = st.builds(lambda i: f'"Q {i}"', st.integers(0, 99))


def _statement(kind: str, name: str) -> str:
    return {
        "table": f"create table {name} (a int, b varchar default ';')",
        "stream": f"CREATE STREAM {name} (a INT, b DECIMAL(10,2)) PARTITION BY (a)",
        "window": f"create window {name} on s rows 4 slide 2",
        "proc": f"create procedure {name}(x int) as begin select ';'; select case when x then 1 end end",
        "python": f"create procedure {name} as python 'm:f'",
        "trigger": f"create trigger {name} on stream s as begin delete from t where a = 'END' end",
        "index": f"create index {name} on t (a)",
        "view": f"create view {name} as select a, count(*) from t group by a",
        "group": f"create transaction group {name} (a, b)",
        "drop": f"drop table if exists {name}",
    }[kind]


_TYPES = {
    "table": CreateTable,
    "stream": CreateStream,
    "window": CreateWindow,
    "proc": CreateProcedure,
    "python": CreateProcedure,
    "trigger": CreateTrigger,
    "index": CreateIndex,
    "view": CreateView,
    "group": CreateGroup,
    "drop": Drop,
}
_SEPARATORS = st.lists(st.sampled_from([" ", "\n", "\t", "\r\n", "-- c; END\n", "/* ; BEGIN */", ";"]), max_size=4).map(
    "".join
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(sorted(_TYPES)), st.one_of(_NAMES, _QUOTED)), max_size=8),
    st.data(),
)
def test_property_statement_count_and_order(items, data):
    parts = [data.draw(_SEPARATORS)]
    for kind, name in items:
        parts.append(_statement(kind, name))
        parts.append(data.draw(_SEPARATORS) + ";" + data.draw(_SEPARATORS))
    stmts = parse_script("".join(parts))
    assert len(stmts) == len(items)
    for stmt, (kind, name) in zip(stmts, items, strict=True):
        assert type(stmt) is _TYPES[kind]
        assert stmt.name == name.strip('"')
