"""Fixtures: a real server in a subprocess on a free port, and clients for it."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator

import pytest

from streamtx.server.embedded import EmbeddedServer

PARTITION_COUNTS = (1, 2, 4)
"""The partition counts every dataflow correctness suite runs with (a module opts in with PARTITIONS = ...)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    counts = getattr(metafunc.module, "PARTITIONS", None)
    for name in ("server", "shared_server"):
        if counts and name in metafunc.fixturenames:
            metafunc.parametrize(name, counts, indirect=True, ids=[f"P{p}" for p in counts])


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


_DROP_ORDER = (
    ("TRIGGER", "triggers"),
    ("PROCEDURE", "procedures"),
    ("WINDOW", "windows"),
    ("STREAM", "streams"),
    ("INDEX", "indexes"),
    ("VIEW", "views"),
    ("TABLE", "tables"),
)
"""Each kind of object and the Status field listing it, in the order `drop_all` drops them."""


def drop_all(client) -> None:
    """Drops every object the server holds (groups and triggers first, tables last), so a module-scoped
    server can be deployed afresh for each test."""
    status = client.status()
    drops = [f"DROP TRANSACTION GROUP {name};" for name in status.get("groups", [])]
    drops += [f"DROP {kind} {name};" for kind, listed in _DROP_ORDER for name in status.get(listed, [])]
    if drops:
        client.deploy("\n".join(drops))


# ------------------------------------------------------------------- one server for a module's tests

_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Notes on the item that its setup or call failed (for `shared_client`'s teardown)."""
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


class SharedServer:
    """The server the tests of a module share, started when first asked for; `discard` stops it (the
    next test gets another, fresh one)."""

    def __init__(self, make: Callable[[], EmbeddedServer]) -> None:
        self._make = make
        self._server: EmbeddedServer | None = None

    @property
    def target(self) -> str:
        if self._server is None:
            self._server = self._make().start()
        return self._server.target

    def discard(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()


@pytest.fixture(scope="module")
def shared_server(request, tmp_path_factory) -> Iterator[SharedServer]:
    """One server for the tests of a module that take `shared_client` (one per partition count, when the
    module parametrizes it: PARTITIONS); see `shared_client`."""
    partitions = getattr(request, "param", 1)
    shared = SharedServer(lambda: EmbeddedServer(tmp_path_factory.mktemp("shared"), partitions=partitions))
    try:
        yield shared
    finally:
        shared.discard()


@pytest.fixture
def shared_client(request, shared_server: SharedServer):
    """A new client (its own producer id) of the module's shared server, emptied by `drop_all`: each test
    deploys its app afresh.

    What a fresh server would not have is left over: the global timestamp ($ts, `timestamp` in push
    results) goes on from the previous test's, and the status counters add up. A test that failed (or
    whose emptying failed) may have left more behind (a stuck batch, a half-read subscription, objects
    `drop_all` cannot see): its server is discarded, so that the next test starts on a fresh one.
    """
    from streamtx.client import Client

    c = Client(shared_server.target)
    emptied = False
    try:
        drop_all(c)
        emptied = True
        yield c
    finally:
        failed = not emptied or request.node.stash.get(_FAILED, False)
        try:
            c.close(flush=not failed)
        finally:
            if failed:
                shared_server.discard()
