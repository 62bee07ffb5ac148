"""Shared by the cluster-mode tests: a 2-TE dataflow, hosts on a NATS cluster, and how to read what they hold."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from support.processes import Launched

from streamtx import errors
from streamtx.client import Client
from streamtx.server.cluster.natsd import NatsCluster

SCRIPT = """
CREATE TABLE seen (k BIGINT PRIMARY KEY, v BIGINT) PARTITION BY (k);
CREATE TABLE totals (g BIGINT PRIMARY KEY, n BIGINT, v BIGINT);
CREATE STREAM s (k BIGINT, v BIGINT) PARTITION BY (k);
CREATE STREAM s2 (g BIGINT, v BIGINT);
CREATE PROCEDURE p1 ON STREAM s AS BEGIN
  INSERT INTO seen SELECT k, v FROM s ON CONFLICT (k) DO UPDATE SET v = excluded.v;
  INSERT INTO s2 SELECT k % 7, v FROM s;
END;
CREATE PROCEDURE p2 ON STREAM s2 AS BEGIN
  INSERT INTO totals SELECT g, count(*), sum(v) FROM s2 GROUP BY g
    ON CONFLICT (g) DO UPDATE SET n = totals.n + excluded.n, v = totals.v + excluded.v;
END;
CREATE PROCEDURE add_to(g BIGINT, amount BIGINT) AS BEGIN
  INSERT INTO totals SELECT $g, 0, $amount ON CONFLICT (g) DO UPDATE SET v = totals.v + excluded.v;
END;
"""


def start_host(
    root: Path, name: str, nats: NatsCluster, replicas: int = 1, partitions: int = 2, *more: str
) -> Launched:
    extra = ["--cluster", ",".join(nats.urls), "--host-id", name, "--log-replicas", str(replicas), *more]
    return Launched(root / name, partitions, extra)


def batch(k: int) -> dict[str, list[int]]:
    return {"k": [k], "v": [k % 5]}


def expected(ks: set[int], added: dict[int, int] | None = None) -> list[tuple[int, int, int]]:
    """The totals a plain count gives: per g = k % 7, the batches and the sum of their v."""
    out: dict[int, list[int]] = {}
    for k in ks:
        row = out.setdefault(k % 7, [0, 0])
        row[0] += 1
        row[1] += k % 5
    for g, amount in (added or {}).items():
        out.setdefault(g, [0, 0])[1] += amount
    return sorted((g, n, v) for g, (n, v) in out.items())


def tables(target: str) -> tuple[list[tuple], list[tuple]]:
    with Client(target) as c:
        totals = c.query("SELECT g, n::BIGINT, v::BIGINT FROM totals ORDER BY g").fetchall()
        seen = c.query("SELECT k, v FROM seen ORDER BY k").fetchall()
    return totals, seen


def wait_for(hosts: list[Launched], want: list[tuple], timeout: float = 60.0) -> None:
    """Until every host's totals are `want` (a host applies the log at its own pace)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = [tables(h.target)[0] for h in hosts]
        except errors.InvalidArgument:  # a host that has not run the deploy yet
            got = []
        if got and all(g == want for g in got):
            return
        assert time.monotonic() < deadline, f"hosts did not converge: want {want}, got {got}"
        time.sleep(0.2)


def cluster(nats: NatsCluster, verb: str, returncode: int = 0) -> dict:
    """`streamtx cluster VERB --json`, which reads NATS itself."""
    out = subprocess.run(
        [sys.executable, "-m", "streamtx", "cluster", verb, "--cluster", ",".join(nats.urls), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == returncode, out.stderr
    return json.loads(out.stdout)


def deployed_pair(root: Path, nats: NatsCluster, pushed: int) -> list[Launched]:
    """Hosts a and b (2 partitions each) with SCRIPT deployed and batches 1..`pushed` of producer "p" committed."""
    hosts = [start_host(root, "a", nats), start_host(root, "b", nats)]
    try:
        with Client(hosts[0].target, producer_id="p") as c:
            c.deploy(SCRIPT)
            outcomes = {c.push("s", batch(k), batch_id=k).result().outcome for k in range(1, pushed + 1)}
        assert outcomes == {"committed"}
    except BaseException:
        for h in hosts:
            h.close()
        raise
    return hosts
