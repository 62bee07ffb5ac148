"""Snapshots a cluster's hosts share, so that the log can be trimmed and a host can start from another's state.

In cluster mode a checkpoint's cut falls between two log entries (the log
reader holds `Front.boundary` while it admits an entry), so a checkpoint
holds exactly the entries up to the last one admitted at its cut. After
each checkpoint a host puts it in a JetStream object store (one object per
host, `<cluster>.<host>`, replaced by its next one): every partition's
checkpoint directory, the catalog and the partition map, as one tar file.

Then the log is trimmed: the entries every live host has applied and the
host's own snapshot holds are purged. A host whose saved position is below
the log's first entry (it was away, or it is new and the log no longer starts
at 1) installs the newest snapshot before its partitions start: its
partition directories, catalog and map are replaced by the snapshot's, each
partition's command log starts after the checkpoint's LSN, and it reads the
log on from the snapshot's position. Entries a host had applied but not
saved are run again (DUPLICATE), as after any restart.

Guarantees:

- A snapshot is installed whole or not at all: `INSTALLING` is written
  before anything is replaced and removed after the new position is saved;
  a host that finds it installs again from scratch.
- A snapshot is verified twice: the object store's SHA-256 of the whole
  file, then each checkpoint's own checksums when its partition loads it.
- Nothing in a snapshot is code: the catalog names procedures, loaded from
  the host's own procedures path. The tar is extracted with the `data`
  filter (no absolute paths, links out of the directory or devices).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tarfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from streamtx.errors import FailedPrecondition
from streamtx.files import atomic_write
from streamtx.recovery.checkpoint import MANIFEST, checkpoint_name
from streamtx.recovery.log import CommandLog, fsync_dir
from streamtx.server import log
from streamtx.server.config import CATALOG_FILE, MAP_FILE
from streamtx.server.partition.journal import COMMAND_FORMAT

POSITION_FILE = "cluster.json"
INSTALLING = "installing.json"
"""Present while a snapshot replaces this host's state: the next start installs again."""
TRIM_DECIDE_S = 0.5
"""A host trims the log only if it read the hosts' positions less than this long before."""
TRIM_GRACE_S = 1.5
"""A starting host waits this long after saying where it is before it reads where the log starts: longer
than TRIM_DECIDE_S, so a trim decided without its position has landed by then."""
PACKED, FETCHED, UNPACKED = ".snapshot-out.tar", ".snapshot-in.tar", ".snapshot-in"


@dataclass(frozen=True)
class SnapshotInfo:
    """What a shared snapshot holds, stored as its object's description."""

    host: str
    position: int  # the last log entry whose effects it holds
    ts: int  # its checkpoint's timestamp
    partitions: int
    log_created: str  # the log it was taken from (a log made anew has other positions)
    time: float
    bytes: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SnapshotInfo:
        return cls(**json.loads(text))


# ------------------------------------------------------------------ position file
def saved_position(data_dir: Path, stream: str, created: str) -> int:
    """How far this host has applied the log (0: never), refusing a position in another log."""
    path = Path(data_dir) / POSITION_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return 0
    if data.get("log") != stream:
        raise FailedPrecondition(
            f"--cluster: data directory {path.parent} applied the cluster log {data.get('log')!r}, not "
            f"{stream!r}; a host stays with one log (use another --data-dir)"
        )
    if data.get("created") != created:
        raise FailedPrecondition(
            f"--cluster: the cluster log {stream} was created anew ({created}) since data "
            f"directory {path.parent} ran it to position {data['applied']} (in the log created "
            f"{data.get('created')}): its positions name other entries now; start this host on an empty "
            "--data-dir to run the new log from its start"
        )
    return int(data["applied"])


def save_position(data_dir: Path, stream: str, created: str, host: str, applied: int) -> None:
    """Writes how far this host has applied the log (a crash leaves the old or the new position)."""
    record = {"log": stream, "created": created, "host": host, "applied": applied}
    atomic_write(Path(data_dir) / POSITION_FILE, json.dumps(record))


# ------------------------------------------------------------------ packing
def pack(data_dir: Path, ts: int, partitions: int) -> Path:
    """One tar of the checkpoint at `ts` of every partition, the catalog and the map; returns its path.

    Raises FileNotFoundError if a later checkpoint has already replaced it (the next one is shared then).
    """
    data_dir = Path(data_dir)
    out = data_dir / PACKED
    with tarfile.open(out, "w") as tar:
        for name in (CATALOG_FILE, MAP_FILE):
            if (data_dir / name).exists():
                tar.add(data_dir / name, arcname=name)
        for i in range(partitions):
            ckpt = data_dir / f"partition-{i}" / "checkpoints" / checkpoint_name(ts)
            if not (ckpt / MANIFEST).is_file():
                raise FileNotFoundError(ckpt)
            tar.add(ckpt, arcname=f"partition-{i}/checkpoints/{ckpt.name}")
    return out


# ------------------------------------------------------------------ installing
def must_install(data_dir: Path, applied: int, first: int) -> bool:
    """True if this host cannot go on from its own state: an install was cut short, or the log no longer holds
    the entry after the last one it applied (`first`: the log's first entry)."""
    return (Path(data_dir) / INSTALLING).exists() or first > applied + 1


def install(data_dir: Path, tar: Path, info: SnapshotInfo, stream: str, host: str) -> None:
    """Replaces this host's partitions, catalog and map with the snapshot in `tar`; its position becomes the
    snapshot's. Run with the data directory locked and no partition started."""
    data_dir = Path(data_dir)
    unpacked = data_dir / UNPACKED
    shutil.rmtree(unpacked, ignore_errors=True)
    with tarfile.open(tar) as t:
        t.extractall(unpacked, filter="data")
    parts = sorted(unpacked.glob("partition-*"))
    if len(parts) != info.partitions or not (unpacked / MAP_FILE).exists():
        raise FailedPrecondition(
            f"cluster snapshot of host {info.host} at position {info.position}: holds {len(parts)} partition(s) "
            f"and {'a' if (unpacked / MAP_FILE).exists() else 'no'} partition map, expected {info.partitions}"
        )
    atomic_write(data_dir / INSTALLING, info.to_json())
    for old in [*data_dir.glob("partition-*"), data_dir / POSITION_FILE, data_dir / CATALOG_FILE, data_dir / MAP_FILE]:
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink(missing_ok=True)
    for part in parts:
        ckpt = part / "checkpoints" / checkpoint_name(info.ts)
        lsn = int(json.loads((ckpt / MANIFEST).read_text())["lsn"])
        CommandLog(part / "log", payload_format=COMMAND_FORMAT, first_lsn=lsn + 1).close()  # LSNs go on after it
        part.rename(data_dir / part.name)
    for name in (CATALOG_FILE, MAP_FILE):
        if (unpacked / name).exists():
            (unpacked / name).rename(data_dir / name)
    fsync_dir(data_dir)
    save_position(data_dir, stream, info.log_created, host, info.position)
    (data_dir / INSTALLING).unlink()
    shutil.rmtree(unpacked, ignore_errors=True)
    fsync_dir(data_dir)


async def catch_up(
    inputlog: Any, data_dir: Path, host: str, partitions: int, announce: Callable[[int], Awaitable[None]]
) -> int:
    """Installs the newest shared snapshot if this host cannot go on from its own state; returns the last entry
    the host holds, where it reads the log on from.

    Before it looks at the log's first entry, the host says how far it has applied the log (`announce`) and waits
    TRIM_GRACE_S: a host trimming the log then either counts it or has trimmed already. Raises FailedPrecondition
    if it must install and no snapshot holds what the log no longer does.
    """
    applied = saved_position(data_dir, inputlog.stream_name, inputlog.created)
    await announce(applied)
    await asyncio.sleep(TRIM_GRACE_S)
    first = await inputlog.first()
    if not must_install(data_dir, applied, first):
        return applied
    # trims since the announcement stop at `applied`, below `first`: the log keeps what follows the snapshot
    applied = await _install_newest(inputlog, data_dir, host, partitions, applied, first)
    await announce(applied)
    return applied


def newest_of(infos: list[SnapshotInfo], log_created: str) -> SnapshotInfo | None:
    """The snapshot holding the most of the log created at `log_created` (none of another log counts)."""
    return max((i for i in infos if i.log_created == log_created), key=lambda i: i.position, default=None)


async def _install_newest(inputlog: Any, data_dir: Path, host: str, partitions: int, applied: int, first: int) -> int:
    newest = newest_of(await inputlog.snapshots(), inputlog.created)
    if newest is None or newest.position + 1 < first:
        raise FailedPrecondition(
            f"--cluster: this host applied the log {inputlog.stream_name} to position {applied}, the log starts "
            f"at {first} now, and no host's snapshot holds the entries between "
            f"(newest: {newest.position if newest else 'none'}); start another host's checkpoint first"
        )
    if newest.partitions != partitions:
        raise FailedPrecondition(
            f"--partitions {partitions}: the cluster's snapshot (host {newest.host}) has {newest.partitions} "
            f"partition(s); start every host of the cluster with --partitions {newest.partitions}"
        )
    started = time.monotonic()
    log.event(
        "cluster_snapshot_fetch",
        f"the log starts at {first}, this host applied it to {applied}: fetching host {newest.host}'s snapshot "
        f"at position {newest.position} ({newest.bytes:,} bytes)",
    )
    fetched = Path(data_dir) / FETCHED
    try:
        await inputlog.fetch_snapshot(newest.host, fetched)
        install(data_dir, fetched, newest, inputlog.stream_name, host)
    finally:
        fetched.unlink(missing_ok=True)
    log.event(
        "cluster_snapshot_installed",
        f"installed host {newest.host}'s snapshot at log position {newest.position} in "
        f"{time.monotonic() - started:.2f} s; reading the log on from {newest.position + 1}",
        position=newest.position,
    )
    return newest.position


def trim_point(own: int, hosts: dict[str, dict[str, Any]], live: set[str]) -> int:
    """The last entry the log may drop: one this host's snapshot holds (`own`) and every live host applied.

    A host not heard from lately (not in `live`) does not hold the log back: if it comes back behind the
    log's start it installs a snapshot."""
    return min([own, *(int(r.get("applied", 0)) for h, r in hosts.items() if h in live)])
