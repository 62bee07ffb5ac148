"""Fixtures: a real server in a subprocess on a free port, and clients for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamtx.server.embedded import EmbeddedServer


@pytest.fixture
def server(tmp_path) -> Iterator[EmbeddedServer]:
    """A fresh server (its own data directory) per test; `.target` is HOST:PORT."""
    with EmbeddedServer(tmp_path / "data") as srv:
        yield srv


@pytest.fixture
def client(server):
    from streamtx.client import Client

    with Client(server.target) as c:
        yield c
