"""streamtx: a transactional stream-processing server and its Python client.

The client classes and `__version__` are looked up lazily so that server
processes, which import `streamtx.errors` and `streamtx.wire`, pay neither for
loading the client nor for reading package metadata (a tenth of a second).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamtx.client import AsyncClient, Client, connect

__all__ = ["AsyncClient", "Client", "__version__", "connect"]

_CLIENT_NAMES = frozenset({"AsyncClient", "Client", "connect"})


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("streamtx")
        except PackageNotFoundError:  # running from a source tree that is not installed
            found = "0+unknown"
        globals()["__version__"] = found
        return found
    if name in _CLIENT_NAMES:
        from streamtx import client

        return getattr(client, name)
    raise AttributeError(f"module 'streamtx' has no attribute {name!r}")
