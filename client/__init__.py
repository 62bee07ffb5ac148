"""Python client for streamtx: `Client` (blocking) and `AsyncClient` (asyncio).

import streamtx
with streamtx.connect("127.0.0.1:7411") as c:
    c.deploy(open("app.sql").read())
    c.push("votes", [{"phone": 5551234, "contestant": 3}]).result().raise_for_outcome()
    print(c.query("SELECT * FROM leaderboard").df())
"""

from .async_client import AsyncClient, to_table
from .results import DeployResult, PushResult, Result, StatementPlan
from .sync_client import Client, connect

__all__ = [
    "AsyncClient",
    "Client",
    "DeployResult",
    "PushResult",
    "Result",
    "StatementPlan",
    "connect",
    "to_table",
]
