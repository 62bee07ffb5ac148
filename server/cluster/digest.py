"""A host's state in a few numbers, to compare replicas: per table, its rows and a hash of them.

Every host computes it at the same log position (a `verify` entry), so equal
states give equal digests. The hash of a table is the XOR of its rows' DuckDB
hashes: independent of row order and of how rows are spread over partitions.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


async def digest(front: Any) -> dict[str, Any]:
    """{"state": one hex digest of everything, "tables": {table: [rows, hash]}} of `front`'s catalog tables."""
    tables: dict[str, list[int]] = {}
    for name in sorted(front.catalog.tables):
        quoted = '"' + name.replace('"', '""') + '"'
        sql = f"SELECT count(*) AS n, coalesce(bit_xor(hash(t)), 0) AS h FROM {quoted} AS t"
        result = await front.query(sql, {})
        rows, hashed = result.column("n")[0].as_py(), result.column("h")[0].as_py()
        tables[name] = [int(rows), int(hashed)]
    state = hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()[:16]
    return {"state": state, "tables": tables}


def differences(reports: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between hosts' digests, one line per table (none: every host holds the same state)."""
    states = {host: r["state"] for host, r in reports.items()}
    if len(set(states.values())) <= 1:
        return []
    out = []
    names = sorted({t for r in reports.values() for t in r["tables"]})
    for name in names:
        seen = {host: tuple(r["tables"].get(name, ("missing",))) for host, r in sorted(reports.items())}
        if len(set(seen.values())) > 1:
            out.append(
                f"table {name}: "
                + ", ".join(
                    f"{host} {v[0]} rows" + (f" (hash {v[1]:x})" if len(v) > 1 else "") for host, v in seen.items()
                )
            )
    return out or [f"states differ: {states}"]
