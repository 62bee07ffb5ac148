"""streamtx: a transactional stream-processing server and its Python client.

The client classes are imported lazily so that server processes, which import
`streamtx.errors` and `streamtx.wire`, do not pay for loading the client.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("streamtx")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from streamtx.client import AsyncClient, Client, connect

__all__ = ["AsyncClient", "Client", "__version__", "connect"]

_CLIENT_NAMES = frozenset({"AsyncClient", "Client", "connect"})


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        from streamtx import client

        return getattr(client, name)
    raise AttributeError(f"module 'streamtx' has no attribute {name!r}")
