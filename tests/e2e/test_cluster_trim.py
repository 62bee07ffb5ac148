"""Cluster mode: snapshots shared through NATS, the log trimmed below them, and hosts behind the log's start.

Real NATS servers, real hosts; a host killed, paused or new comes back from the newest snapshot and ends with
the same tables as the others.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import SCRIPT, batch, cluster, deployed_pair, expected, start_host, tables, wait_for
from support.processes import Launched

from streamtx.client import Client
from streamtx.server.cluster.natsd import NatsCluster

pytestmark = pytest.mark.slow


def test_a_host_behind_the_trimmed_log_starts_from_a_shared_snapshot(tmp_path: Path) -> None:
    """Each checkpoint is shared and the log trimmed below it; a new host, and one that was away while the log
    was trimmed past its position, install the newest snapshot and read the log on from there."""
    from streamtx.server.cluster.inputlog import LIVE_WITHIN_S

    def trimmed_past(position: int) -> dict:
        """Checkpoints on host a until the log is trimmed past `position` (a trim is skipped, and tried again at
        the next checkpoint, when reading the hosts' positions was slow)."""
        deadline = time.monotonic() + 60
        while True:
            with Client(a.target) as c:
                c.checkpoint()
            time.sleep(1.0)
            status = cluster(nats, "status")
            if status["log"]["first"] > position + 1 and status["snapshots"]:
                return status
            assert time.monotonic() < deadline, f"the log was not trimmed past {position}: {status}"

    with NatsCluster(tmp_path / "nats", 1) as nats:
        hosts = deployed_pair(tmp_path, nats, 200)
        a, b = hosts
        try:
            acked = set(range(1, 201))
            wait_for([a, b], expected(acked))
            time.sleep(1.5)  # each host has said how far it applied the log
            status = trimmed_past(1)
            assert [(s["host"], s["partitions"]) for s in status["snapshots"]] == [("a", 2)]
            assert status["snapshots"][0]["position"] >= status["log"]["first"] - 1
            shown = subprocess.run(
                [sys.executable, "-m", "streamtx", "cluster", "status", "--cluster", nats.urls[0]],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "COLUMNS": "200"},
            ).stdout
            assert "snapshots" in shown and ("so far trimmed" in shown or "positions" in shown), shown
            applied_b = next(h["applied"] for h in status["hosts"] if h["host"] == "b")

            b.proc.kill()  # away while the log goes on and is trimmed past where it was
            b.proc.wait()
            with Client(a.target, producer_id="p") as c:
                assert {c.push("s", batch(k), batch_id=k).result().outcome for k in range(201, 301)} == {"committed"}
                acked |= set(range(201, 301))
                time.sleep(LIVE_WITHIN_S + 1)  # b no longer counts as live: it holds the log back no more
            trimmed_past(applied_b + 1)

            newcomer = start_host(tmp_path, "c", nats)  # empty, and the log no longer starts at 1
            hosts.append(newcomer)
            b = start_host(tmp_path, "b", nats)  # its own state is behind the log's first entry
            hosts[1] = b
            for h in (newcomer, b):
                assert "installed host a's snapshot" in h.stderr()
            with Client(newcomer.target, producer_id="p") as c:
                again = c.push_one("s", batch(7), batch_id=7)  # the snapshot holds the dedup marks too
                assert (again.outcome, again.original) == ("duplicate", "committed")
                assert {c.push("s", batch(k), batch_id=k).result().outcome for k in range(301, 351)} == {"committed"}
            acked |= set(range(301, 351))
            wait_for(hosts, expected(acked))
            assert tables(a.target) == tables(b.target) == tables(newcomer.target)
            verified = cluster(nats, "verify")
            assert sorted(verified["hosts"]) == ["a", "b", "c"] and verified["differences"] == []
        finally:
            for h in hosts:
                h.close()


def test_a_host_leaves_sharing_to_another_that_shared_since_its_last_checkpoint(tmp_path: Path) -> None:
    """One copy of the state in NATS is enough: a checkpoint is shared only if no other host shared one since
    this host's previous checkpoint; the log is trimmed below the other's then."""

    def counters(h: Launched) -> tuple[int, int]:
        with Client(h.target) as c:
            got = c.status()["counters"]
        return got.get("cluster_snapshots", 0), got.get("cluster_snapshots_left_to_others", 0)

    def push(ks: range) -> None:
        with Client(a.target, producer_id="p") as c:
            assert {c.push("s", batch(k), batch_id=k).result().outcome for k in ks} == {"committed"}
        wait_for([a, b], expected(set(range(1, ks.stop))))

    with NatsCluster(tmp_path / "nats", 1) as nats:
        a, b = start_host(tmp_path, "a", nats, partitions=1), start_host(tmp_path, "b", nats, partitions=1)
        try:
            with Client(a.target) as c:
                c.deploy(SCRIPT)
            push(range(1, 51))
            time.sleep(1.5)  # each host has said how far it applied the log
            deadline = time.monotonic() + 30
            with Client(a.target) as c:
                c.checkpoint()
            while counters(a) != (1, 0):
                assert time.monotonic() < deadline, counters(a)
                time.sleep(0.2)
            with Client(b.target) as c:
                c.checkpoint()
            while counters(b) != (0, 1):
                assert time.monotonic() < deadline, (counters(a), counters(b))
                time.sleep(0.2)
            status = cluster(nats, "status")
            assert [s["host"] for s in status["snapshots"]] == ["a"]
            assert status["log"]["first"] > 1  # trimmed below a's snapshot

            push(range(51, 101))  # a shares nothing since b's last checkpoint: b's next one is shared
            with Client(b.target) as c:
                c.checkpoint()
            while counters(b) != (1, 1):
                assert time.monotonic() < deadline, counters(b)
                time.sleep(0.2)
            assert [s["host"] for s in cluster(nats, "status")["snapshots"]] == ["a", "b"]
        finally:
            a.close()
            b.close()


def test_a_host_paused_while_the_log_is_trimmed_past_it_starts_again_from_a_snapshot(tmp_path: Path) -> None:
    """Host b is stopped (SIGSTOP) for longer than hosts count as live, while host a takes more than the NATS
    connection buffers for b and trims the log past b's position. Resumed, b finds entries missing, stops,
    and runs itself anew (same process id): it installs a's snapshot and catches up."""
    import signal

    padded = SCRIPT + "CREATE STREAM pad (k BIGINT, blob VARCHAR);"
    with NatsCluster(tmp_path / "nats", 1) as nats:
        a, b = start_host(tmp_path, "a", nats, partitions=1), start_host(tmp_path, "b", nats, partitions=1)
        try:
            with Client(a.target, producer_id="p") as c:
                c.deploy(padded)
                assert {c.push("s", batch(k), batch_id=k).result().outcome for k in range(1, 101)} == {"committed"}
            wait_for([a, b], expected(set(range(1, 101))))
            time.sleep(1.5)  # b has said how far it applied the log
            applied_b = next(h["applied"] for h in cluster(nats, "status")["hosts"] if h["host"] == "b")
            port_b = (b.data_dir / "port").read_text()

            os.kill(b.proc.pid, signal.SIGSTOP)
            blob = pa.table({"k": pa.array(range(900), pa.int64()), "blob": pa.array(["x" * 1000] * 900)})
            with Client(a.target, producer_id="pad") as c:  # ~16 MB: more than b's connection holds unread
                assert {c.push("pad", blob, batch_id=i).result().outcome for i in range(1, 19)} == {"committed"}
            with Client(a.target, producer_id="p") as c:
                assert {c.push("s", batch(k), batch_id=k).result().outcome for k in range(101, 201)} == {"committed"}
            deadline = time.monotonic() + 90
            while cluster(nats, "status")["log"]["first"] <= applied_b + 1:
                with Client(a.target) as c:  # b no longer counts as live after 10 s: the log is trimmed past it
                    c.checkpoint()
                time.sleep(1.0)
                assert time.monotonic() < deadline, "the log was not trimmed past b"
            os.kill(b.proc.pid, signal.SIGCONT)

            deadline = time.monotonic() + 90
            while "installed host a's snapshot" not in b.stderr() or (b.data_dir / "port").read_text() in ("", port_b):
                assert b.proc.poll() is None, b.stderr()
                assert time.monotonic() < deadline, f"b did not start again: {b.stderr()} {cluster(nats, 'status')}"
                time.sleep(0.2)
            assert "starts again from the newest snapshot" in b.stderr()
            b.target = f"127.0.0.1:{(b.data_dir / 'port').read_text().strip()}"
            wait_for([a, b], expected(set(range(1, 201))))
            assert tables(a.target) == tables(b.target)
        finally:
            a.close()
            b.close()
