"""The one way the server parses SQL text into a tree: with a nesting limit, never a RecursionError.

sqlglot's parser recurses about 26 Python frames per level of parentheses,
so 40 levels already passed Python's default limit of 1,000 frames and a
deploy failed with INTERNAL. SQL nested deeper than `MAX_NESTING` levels is
refused by name before parsing (one linear scan that skips string literals,
quoted names and comments), and the interpreter's limit is raised once to
what that depth needs. DuckDB itself stops at 1,000 levels
(`max_expression_depth`).
"""

from __future__ import annotations

import sys

import sqlglot
from sqlglot import exp

from streamtx.errors import InvalidArgument

MAX_NESTING = 256
"""Deepest nesting of parentheses accepted in one statement."""
MAX_SQL_BYTES = 256 * 1024
"""Longest SQL text accepted (a deploy script, a query): parsing and checking a deploy costs
~0.1 ms per list element on the front and again on every partition, so this bounds a deploy
to a few seconds (a 40,000-element IN list)."""

_FRAMES_PER_LEVEL = 40  # measured ~26 for parse + render; the rest is headroom for walks over the tree
sys.setrecursionlimit(max(sys.getrecursionlimit(), 2_000 + MAX_NESTING * _FRAMES_PER_LEVEL))


def parse(sql: str, what: str = "SQL") -> exp.Expression:
    """`sqlglot.parse_one(sql)` in DuckDB's dialect; ParseError as sqlglot raises it."""
    check_nesting(sql, what)
    return sqlglot.parse_one(sql, read="duckdb")


def check_size(sql: str, what: str) -> None:
    """InvalidArgument if the text is longer than MAX_SQL_BYTES (in UTF-8)."""
    size = len(sql.encode())
    if size > MAX_SQL_BYTES:
        raise InvalidArgument(
            f"{what}: {size:,} bytes of SQL; at most {MAX_SQL_BYTES:,} are accepted "
            "(split the script, or load long value lists into a table)"
        )


def check_nesting(sql: str, what: str = "SQL") -> None:
    """InvalidArgument if `sql` nests deeper than MAX_NESTING (linear, quote- and comment-aware)."""
    depth = deepest = 0
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"":
            end = sql.find(ch, i + 1)
            i = n if end < 0 else end + 1
            continue
        if ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if ch == "/" and sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
        i += 1
    if deepest > MAX_NESTING:
        raise InvalidArgument(
            f"{what}: parentheses nest {deepest} levels deep; at most {MAX_NESTING} are accepted "
            "(flatten the expression, e.g. with a CTE or IN (...))"
        )
