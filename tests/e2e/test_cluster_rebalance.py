"""Cluster mode: bins moved, and partitions added and retired, through the log on every host at once.

Real NATS, real hosts, batches flowing; the hosts' maps and tables stay equal, and a host that reads the
steps again after a crash runs none twice.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import SCRIPT, batch, cluster, deployed_pair, expected, start_host, tables, wait_for
from support.processes import Launched

from streamtx.client import Client
from streamtx.server.cluster.natsd import NatsCluster

pytestmark = pytest.mark.slow


def shape(h: Launched) -> list[int]:
    """The bins each partition of host `h` owns."""
    with Client(h.target) as c:
        return c.status()["bins_per_partition"]


def test_bins_move_on_every_host_at_the_same_log_position_while_batches_flow(tmp_path: Path) -> None:
    """A rebalance sent to one host runs each step through the log: every host moves the same bins at the same
    position, between the same batches, so the hosts' maps and tables stay equal; growing and shrinking the
    partition count too. Bins moved and moved back, a host that reads the steps again after a crash (its saved
    position from before them, as a crash can leave it) finds the map as it was before the first one, yet runs
    none of them twice: its recovered state says it ran them."""
    with NatsCluster(tmp_path / "nats", 1) as nats:
        hosts = deployed_pair(tmp_path, nats, 100)
        a, b = hosts
        try:
            wait_for(hosts, expected(set(range(1, 101))))
            time.sleep(1.0)  # b has saved its position
            before = json.loads((b.data_dir / "cluster.json").read_text())
            acked: set[int] = set(range(1, 101))
            stop = threading.Event()

            def produce() -> None:
                with Client(a.target, producer_id="p") as c:
                    k = 100
                    while not stop.is_set() or k < 500:
                        k += 1
                        assert c.push("s", batch(k), batch_id=k).result(timeout=60).outcome == "committed"
                        acked.add(k)

            producer = threading.Thread(target=produce)
            producer.start()
            with Client(b.target) as c:  # sent to b: the steps go through the log to a as well
                there = list(c.rebalance([(0, 511, 1)], strategy="batched", bins_per_step=64))
                back = list(c.rebalance([(k, k, 0) for k in range(0, 512, 2)], strategy="batched", bins_per_step=32))
            assert (there[-1]["bins_moved"], there[-1]["steps"], back[-1]["steps"]) == (256, 4, 8)
            assert there[-1]["rows_moved"] > 0
            with Client(a.target) as c:  # growing and shrinking: every host adds and retires a worker
                list(c.rebalance(partitions=3, strategy="batched", bins_per_step=128))
                deadline = time.monotonic() + 30
                while (grown := [shape(h) for h in hosts])[0] != grown[1]:  # b runs the steps at its own pace
                    assert time.monotonic() < deadline, grown
                    time.sleep(0.1)
                list(c.rebalance(partitions=2, strategy="all-at-once"))
            assert grown[0] == grown[1] and len(grown[0]) == 3 and min(grown[0]) > 300, grown
            stop.set()
            producer.join(120)
            wait_for(hosts, expected(acked))

            def migrations(h: Launched) -> list[int]:
                with Client(h.target) as c:
                    got = c.status()["counters"]
                return [got.get(f"partition{i}.migrations", 0) for i in (0, 1)]

            assert min(migrations(b)) >= 12  # each step committed on both partitions
            b.proc.kill()
            b.proc.wait()
            (b.data_dir / "cluster.json").write_text(json.dumps(before))
            b = hosts[1] = start_host(tmp_path, "b", nats)
            time.sleep(2.0)  # b reads the steps and the batches again
            wait_for(hosts, expected(acked))
            assert [shape(h) for h in hosts] == [[512, 512], [512, 512]]
            assert tables(a.target) == tables(b.target)
            assert migrations(b) == [0, 0]  # read again after the restart, and run once: before it
            verified = cluster(nats, "verify")
            assert not verified["differences"] and set(verified["hosts"]) == {"a", "b"}
        finally:
            for h in hosts:
                h.close()


def test_one_host_plans_automatic_migrations_for_the_cluster(tmp_path: Path) -> None:
    """`--auto-rebalance` on every host: all measure the same load (they run the same entries), the first by
    name plans, and its steps run on every host through the log."""
    from streamtx.server.partitioning import PartitionMap

    owners = PartitionMap.round_robin(2, 1024).owners(pa.array(range(1, 200_001), pa.int64()))
    hot = [k for k, owner in zip(range(1, 200_001), owners.tolist(), strict=True) if owner == 0]  # partition 0's
    with NatsCluster(tmp_path / "nats", 1) as nats:
        a, b = (start_host(tmp_path, h, nats, 1, 2, "--auto-rebalance", "0.5") for h in "ab")
        try:
            with Client(a.target, producer_id="p") as c:
                c.deploy(SCRIPT)
                sent, batch_id = 0, 0

                def counters(h: Launched) -> dict:
                    with Client(h.target) as hc:
                        return hc.status()["counters"]

                deadline = time.monotonic() + 120
                while not counters(a).get("auto_rebalances"):
                    assert time.monotonic() < deadline, counters(a)
                    futures = []
                    for _ in range(20):
                        keys = hot[sent : sent + 50]
                        sent += 50
                        batch_id += 1
                        rows = {"k": keys, "v": [k % 5 for k in keys]}
                        futures.append(c.push("s", rows, batch_id=batch_id))
                    assert {f.result(timeout=60).outcome for f in futures} == {"committed"}
            wait_for([a, b], expected(set(hot[:sent])))
            deadline = time.monotonic() + 60
            while True:  # until a's migration is through, on both hosts
                shapes = []
                for h in (a, b):
                    with Client(h.target) as hc:
                        status = hc.status()
                    shapes.append((status["bin_owner"], status["rebalancing"].get("steps", 0)))
                if shapes[0] == shapes[1] and shapes[0][1] == 0:
                    break
                assert time.monotonic() < deadline, shapes
                time.sleep(0.2)
            assert sum(shapes[0][0]) > 512  # partition 0 gave bins to partition 1
            assert counters(b).get("auto_rebalances", 0) == 0  # b heard a: a plans
            assert tables(a.target) == tables(b.target)
        finally:
            a.close()
            b.close()
