"""The SQL compiler: procedure statements compiled at deploy into Python over the partition's working set.

A statement inside the compiled subset runs as generated Python (a few
dictionary operations per row) instead of a DuckDB query; one outside it
runs in DuckDB, and `streamtx explain` says which and why. Either way the
outcome is DuckDB's: the compiler refuses at compile time what it cannot
state exactly (`Unsupported`), and at run time hands DuckDB any statement
that meets an error or a value it does not judge itself (`Fallback`).

statement.py  INSERT / UPDATE / DELETE / SELECT, and their writes
query.py      FROM, joins, WHERE, GROUP BY, window functions, ORDER BY, LIMIT
expr.py       scalar expressions; runtime.py, casts.py, types.py beneath it
ctx.py        what compiled code runs against; relational.py its helpers
"""
