"""server/cluster/natsd.py against real nats-server processes: a JetStream log that survives losing its leader.

Checks the launcher itself (ports, configs, readiness, SIGKILL and restart), which the cluster tests and
`streamtx bench cluster` build on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats
import pytest
from nats.js import api

from streamtx.server.cluster.natsd import NatsCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

T = TypeVar("T")
RETRY = 15.0  # bound on one call while a new leader is elected


async def _connect(cluster: NatsCluster) -> Any:
    async def quiet(_: Exception) -> None:
        pass

    return await nats.connect(
        servers=cluster.urls, reconnect_time_wait=0.1, max_reconnect_attempts=-1, connect_timeout=2, error_cb=quiet
    )


async def _retry(call: Callable[[], Awaitable[T]], within: float = RETRY) -> T:
    """Retries a JetStream call while a stream or meta leader is being elected (it times out or gets a 503)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except (TimeoutError, nats.errors.Error):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _publish(js: Any, i: int) -> int:
    """Publishes message i; Nats-Msg-Id makes a publish that was stored but whose ack was lost, land once."""
    ack = await _retry(lambda: js.publish("t", f"m{i}".encode(), timeout=1, headers={"Nats-Msg-Id": f"m{i}"}))
    return ack.seq


def test_one_node_stream_round_trip(tmp_path):
    async def run(cluster: NatsCluster) -> None:
        nc = await _connect(cluster)
        try:
            js = nc.jetstream()
            await js.add_stream(name="T", subjects=["t"], storage=api.StorageType.FILE)
            for i in range(100):
                assert (await js.publish("t", f"m{i}".encode())).seq == i + 1
            sub = await js.pull_subscribe("t", durable="reader", stream="T")
            got = []
            while len(got) < 100:
                for msg in await sub.fetch(100 - len(got), timeout=5):
                    await msg.ack()
                    got.append((msg.metadata.sequence.stream, msg.data.decode()))
            assert got == [(i + 1, f"m{i}") for i in range(100)]
        finally:
            await nc.close()

    with NatsCluster(tmp_path, nodes=1) as cluster:
        assert len(cluster.urls) == 1 and cluster.url == cluster.urls[0]
        config = (tmp_path / "n0" / "nats.conf").read_text()
        assert "sync_interval: always" in config and "cluster" not in config
        asyncio.run(run(cluster))
    cluster.stop()  # idempotent


def test_three_nodes_survive_killing_the_stream_leader(tmp_path):
    async def write_first_half(cluster: NatsCluster) -> int:
        nc = await _connect(cluster)
        try:
            js = nc.jetstream()
            await js.add_stream(name="T", subjects=["t"], storage=api.StorageType.FILE, num_replicas=3)
            for i in range(50):
                assert await _publish(js, i) == i + 1
            info = await js.stream_info("T")
            assert info.cluster is not None and info.cluster.leader is not None
            return int(info.cluster.leader.removeprefix("n"))
        finally:
            await nc.close()

    async def write_second_half_and_read(cluster: NatsCluster, killed: int) -> None:
        nc = await _connect(cluster)
        try:
            js = nc.jetstream()
            for i in range(50, 100):
                assert await _publish(js, i) == i + 1
            info = await _retry(lambda: js.stream_info("T"))
            assert info.state.messages == 100
            assert info.cluster.leader not in (None, f"n{killed}")
            # consumer creation goes through the meta leader, which the kill may also have taken down
            sub = await _retry(lambda: js.subscribe("t", stream="T", ordered_consumer=True))
            got = []
            for _ in range(100):
                msg = await sub.next_msg(timeout=5)
                got.append((msg.metadata.sequence.stream, msg.data.decode()))
            assert got == [(i + 1, f"m{i}") for i in range(100)]
            with pytest.raises(nats.errors.TimeoutError):
                await sub.next_msg(timeout=0.5)
        finally:
            await nc.close()

    async def replicas_current(cluster: NatsCluster, timeout: float = 15.0) -> None:
        nc = await _connect(cluster)
        try:
            js = nc.jetstream()
            deadline = time.monotonic() + timeout
            while True:
                info = await _retry(lambda: js.stream_info("T"))
                peers = info.cluster.replicas or []
                if len(peers) == 2 and all(p.current and not p.offline for p in peers):
                    return
                assert time.monotonic() < deadline, f"replicas never caught up: {peers}"
                await asyncio.sleep(0.2)
        finally:
            await nc.close()

    with NatsCluster(tmp_path, nodes=3) as cluster:
        assert len(cluster.urls) == 3 and cluster.url.split(",") == cluster.urls
        assert "nats-route://" in (tmp_path / "n0" / "nats.conf").read_text()
        leader = asyncio.run(write_first_half(cluster))
        cluster.kill(leader)
        asyncio.run(write_second_half_and_read(cluster, leader))
        cluster.restart(leader)
        asyncio.run(replicas_current(cluster))
