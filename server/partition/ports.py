"""What a partition's helpers see of it (as front/ports.py for the front): `Parts`, the pieces they share.

The engine (partition/engine.py) owns the DuckDB connection, the catalog and
the partition map, and builds the helpers: the working set (state.py), the
windows, each TE's transaction, the ownership checks, the exchange of a TE
that spans partitions. Each helper receives the engine typed as `Parts`, or
as a protocol of its own adding the few members it calls, never as `Engine`:
a helper reaches only what its protocol names, and no module below the
engine imports it, so the engine is the top of the partition's imports
rather than a hub every helper loops back to.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import duckdb

    from streamtx.server.catalog.catalog import Catalog
    from streamtx.server.partitioning import PartitionMap


class Parts(Protocol):
    partition: int
    con: duckdb.DuckDBPyConnection
    catalog: Catalog
    """Replaced by every deploy: read it where it is used, never keep it."""
    map: PartitionMap
    counters: collections.Counter[str]
