"""What the front's helpers see of `Front` (front.py): the few members each one uses, never the whole object.

front.py builds the supervisor, the coordinator, spans, flows, scatter/gather
and the metrics endpoint, and hands each what it uses: the collaborators
themselves (the partitions, the counters, the config, the gate, the
supervisor, the coordinator) and, where a helper needs the front's own
methods or state the front replaces, one of these protocols, which name just
those members. So no module below front.py imports it, not even for types,
and what a helper can reach is written in its signature.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client import Histogram

    from streamtx.server import protocol as pr
    from streamtx.server.catalog.catalog import Catalog
    from streamtx.server.front.partitions import Reply
    from streamtx.server.partitioning import PartitionMap


class Finishing(Protocol):
    """What a command of several rounds (coordinated, span, flow) needs of the front as it ends."""

    def notify(self, stream: str) -> None:
        """Wakes the subscribers of a stream the command stored tuples in."""

    async def finished_outcome(self, stream: str, producer: str, batch_id: int, ts: int) -> pr.Outcome:
        """The outcome of a batch whose command finished just before the partitions were restarted."""


class Routing(Finishing, Protocol):
    """What the coordinator reads of the front to place a command's units on partitions.

    A deploy replaces the catalog, and the start and migration steps the
    partition map: the coordinator reads them through this port each time,
    and never keeps them; a command's map is the one of its timestamp.
    """

    @property
    def catalog(self) -> Catalog: ...

    def map_at(self, ts: int) -> PartitionMap: ...

    def call_owner(self, procedure: str, params: dict[str, Any], ts: int | None = None) -> int: ...


class Reads(Protocol):
    """Reads of the partitions in the command order (behind a coordinated command), as scatter/gather does."""

    async def ask(self, partition: int, command: pr.Command) -> Reply: ...

    async def ask_all(self, command: pr.Command) -> list[Reply]: ...


class Observed(Protocol):
    """What the metrics endpoint scrapes: a status snapshot per scrape, and the push latency histogram."""

    @property
    def push_seconds(self) -> Histogram: ...

    async def status(self) -> dict[str, Any]: ...
