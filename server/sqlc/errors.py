"""The two ways a compiled statement can say no."""

from __future__ import annotations


class Unsupported(Exception):  # noqa: N818 - a verdict at compile time, not a failure: the statement runs in DuckDB
    """The statement (or an expression in it) is outside the compiled subset; the message says why.

    Raised only while compiling, so a statement is either compiled whole or
    run in DuckDB whole; `streamtx explain` shows the reason.
    """


class SqlError(Exception):
    """An error DuckDB raises for the same statement on the same state, worded as DuckDB words it.

    The transaction aborts with this text, so a batch's outcome does not depend
    on whether its statements ran compiled or in DuckDB.
    """
