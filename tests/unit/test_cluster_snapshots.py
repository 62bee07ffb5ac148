"""Shared snapshots of cluster mode: packing, installing whole or not at all, and how far the log may be trimmed."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from streamtx.errors import FailedPrecondition
from streamtx.recovery.checkpoint import checkpoint_name
from streamtx.recovery.log import LogReader
from streamtx.server.cluster.inputlog import Heard
from streamtx.server.cluster.snapshots import (
    INSTALLING,
    SnapshotInfo,
    install,
    must_install,
    pack,
    saved_position,
    trim_point,
)

TS = 7 << 20


def host_dir(root: Path, partitions: int, lsn: int = 41) -> Path:
    """A data directory as a host leaves it after a checkpoint at TS (only the files a snapshot carries)."""
    root.mkdir()
    (root / "catalog.json").write_text('{"catalog": 1}')
    (root / "partition_map.json").write_text('{"map": 1}')
    for i in range(partitions):
        ckpt = root / f"partition-{i}" / "checkpoints" / checkpoint_name(TS)
        ckpt.mkdir(parents=True)
        (ckpt / "0000.arrow").write_bytes(b"rows")
        (ckpt / "manifest.json").write_text(json.dumps({"lsn": lsn + i, "ts": TS}))
    return root


def info(partitions: int = 2) -> SnapshotInfo:
    return SnapshotInfo("a", 7, TS, partitions, "created-1", 0.0)


def test_an_installed_snapshot_replaces_the_state_and_its_logs_go_on_after_the_checkpoint(tmp_path: Path) -> None:
    tar = pack(host_dir(tmp_path / "a", 2), TS, 2)
    target = tmp_path / "b"
    (target / "partition-0" / "log").mkdir(parents=True)
    (target / "partition-0" / "log" / "stale").write_text("old")
    (target / "partition-5").mkdir()
    (target / "catalog.json").write_text("old")
    install(target, tar, info(), "STREAMTX_MAIN", "b")
    assert sorted(p.name for p in target.iterdir()) == [
        "catalog.json",
        "cluster.json",
        "partition-0",
        "partition-1",
        "partition_map.json",
    ]
    assert (target / "catalog.json").read_text() == '{"catalog": 1}'
    for i in range(2):
        assert (target / f"partition-{i}" / "checkpoints" / checkpoint_name(TS) / "0000.arrow").read_bytes() == b"rows"
        assert LogReader(target / f"partition-{i}" / "log").next_lsn == 42 + i  # not 1: the checkpoint says 41
    assert saved_position(target, "STREAMTX_MAIN", "created-1") == 7


def test_a_snapshot_that_does_not_hold_what_it_says_changes_nothing(tmp_path: Path) -> None:
    tar = pack(host_dir(tmp_path / "a", 1), TS, 1)
    target = tmp_path / "b"
    target.mkdir()
    (target / "catalog.json").write_text("mine")
    with pytest.raises(FailedPrecondition, match="holds 1 partition"):
        install(target, tar, info(partitions=2), "STREAMTX_MAIN", "b")
    assert (target / "catalog.json").read_text() == "mine" and not (target / INSTALLING).exists()


def test_a_snapshot_cannot_write_outside_the_data_directory(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar"
    (tmp_path / "payload").write_text("x")
    with tarfile.open(evil, "w") as t:
        t.add(tmp_path / "payload", arcname="../outside")
    (tmp_path / "b").mkdir()
    with pytest.raises(tarfile.OutsideDestinationError):
        install(tmp_path / "b", evil, info(), "STREAMTX_MAIN", "b")
    assert not (tmp_path / "outside").exists()


def test_packing_a_checkpoint_a_newer_one_replaced_fails(tmp_path: Path) -> None:
    root = host_dir(tmp_path / "a", 2)
    (root / "partition-1" / "checkpoints" / checkpoint_name(TS) / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError):
        pack(root, TS, 2)


def test_a_host_installs_when_the_log_lost_what_it_needs_or_an_install_was_cut_short(tmp_path: Path) -> None:
    assert not must_install(tmp_path, applied=10, first=11)  # the log holds the next entry
    assert not must_install(tmp_path, applied=0, first=1)  # a new host, the log whole
    assert must_install(tmp_path, applied=0, first=12)
    assert must_install(tmp_path, applied=10, first=12)
    (tmp_path / INSTALLING).write_text("{}")
    assert must_install(tmp_path, applied=10, first=5)


def test_the_log_is_trimmed_only_below_what_the_snapshot_holds_and_every_live_host_applied() -> None:
    heard = Heard()
    heard.saw("a", at=100.0)
    heard.saw("b", at=99.0)
    heard.saw("c", at=50.0)  # not heard from for 50 s: does not hold the log back
    hosts = {  # the wall-clock times the hosts wrote, their clocks skewed, count for nothing
        "a": {"applied": 90, "time": 5.0},
        "b": {"applied": 60, "time": 1e12},
        "c": {"applied": 10, "time": 1e12},
    }
    assert heard.live(10.0, now=100.0) == {"a", "b"} and heard.live(60.0, now=100.0) == {"a", "b", "c"}
    assert trim_point(80, hosts, heard.live(10.0, now=100.0)) == 60
    assert trim_point(40, hosts, heard.live(10.0, now=100.0)) == 40
    assert trim_point(80, hosts, heard.live(60.0, now=100.0)) == 10
    assert trim_point(80, {}, heard.live(10.0, now=100.0)) == 80


def test_a_host_that_finds_entries_missing_from_the_log_stops_instead_of_skipping_them() -> None:
    import asyncio

    from streamtx.server.cluster.inputlog import Entry
    from streamtx.server.cluster.replica import LogGap, Replica

    replica = Replica.__new__(Replica)  # only its position matters before anything runs
    replica.read = 5
    with pytest.raises(LogGap, match="no longer holds entries 6 to 6"):
        asyncio.run(replica._apply(Entry(7, "push", "", b"")))
