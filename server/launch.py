"""Locking the data directory and starting the partition worker processes.

Standard library only, so `streamtx serve` can do both before it imports the
front: each worker then imports DuckDB and Arrow and opens its log while the
front imports gRPC and the catalog, instead of after (about half a second of
every start-up and every crash recovery on two cores). The lock comes first: a
worker opens, and may truncate, its command log, which must never happen
under another live server.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from streamtx.server.config import ServerConfig, partitions_to_start


@dataclass
class Spawned:
    """A worker process just started, and the front's end of its socket pair."""

    proc: subprocess.Popen
    sock: socket.socket


@dataclass
class Launch:
    """A locked data directory and its started workers, in partition order."""

    lock: IO[str]
    workers: list[Spawned]


def lock_data_dir(data_dir: Path) -> IO[str]:
    """Holds `data_dir/LOCK` exclusively for as long as the returned file stays open."""
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = open(data_dir / "LOCK", "w")  # noqa: SIM115 - held for the server's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SystemExit(f"streamtx: data directory {data_dir} is in use by another server") from None
    return lock


def spawn_worker(index: int, config: ServerConfig) -> Spawned:
    """`python -m streamtx.server.partition.worker` for partition `index`, on one end of a socket pair."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # the worker has no use for the token, and a process's argv is visible to every user of the machine
    settings = replace(config, token=None).to_json()
    cmd = [sys.executable, "-m", "streamtx.server.partition.worker", "--fd", str(theirs.fileno())]
    cmd += ["--partition", str(index), "--parent", str(os.getpid()), "--config", settings]
    proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], start_new_session=False)
    theirs.close()
    return Spawned(proc, ours)


def launch(config: ServerConfig, lock: IO[str] | None = None) -> Launch:
    """Locks the data directory (unless `lock` holds it), then starts one worker per partition (as many as it
    was created with)."""
    lock = lock or lock_data_dir(Path(config.data_dir))
    mismatch = config.layout_mismatch()
    if mismatch is not None:
        lock.close()
        raise SystemExit(f"streamtx: {mismatch}")
    count = partitions_to_start(Path(config.data_dir), config.partitions)
    remove_partitions_from(config, count)
    return Launch(lock, [spawn_worker(i, config) for i in range(count)])


def remove_partitions_from(config: ServerConfig, first: int) -> None:
    """Deletes the directories of partitions `first` and after: left by a partition added live whose step
    never finished, or retired by a shrink; the map names none of them, and a partition added later
    there must start empty."""
    for found in Path(config.data_dir).glob("partition-*"):
        index = found.name.removeprefix("partition-")
        if index.isdigit() and int(index) >= first:
            shutil.rmtree(found)
