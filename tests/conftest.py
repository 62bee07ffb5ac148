"""Fixtures: a real server in a subprocess on a free port, and clients for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamtx.server.embedded import EmbeddedServer

PARTITION_COUNTS = (1, 2, 4)
"""The partition counts every dataflow correctness suite runs with (a module opts in with PARTITIONS = ...)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    counts = getattr(metafunc.module, "PARTITIONS", None)
    if counts and "server" in metafunc.fixturenames:
        metafunc.parametrize("server", counts, indirect=True, ids=[f"P{p}" for p in counts])


@pytest.fixture
def server(request, tmp_path) -> Iterator[EmbeddedServer]:
    """A fresh server (its own data directory) per test; `.target` is HOST:PORT.

    One partition, unless the module parametrizes it (PARTITIONS).
    """
    with EmbeddedServer(tmp_path / "data", partitions=getattr(request, "param", 1)) as srv:
        yield srv


@pytest.fixture
def client(server):
    from streamtx.client import Client

    with Client(server.target) as c:
        yield c


def drop_all(client) -> None:
    """Drops every object the server holds (triggers first, tables last), so a module-scoped server
    can be deployed afresh for each test."""
    status = client.status()
    drops = [
        f"DROP {kind.upper()} {name};"
        for kind in ("trigger", "procedure", "window", "stream", "view", "table")
        for name in status.get(kind + "s", [])
    ]
    if drops:
        client.deploy("\n".join(drops))
