"""Real server processes as the operating system sees them: /proc states, command lines, a launched server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc

from streamtx.v1 import streamtx_pb2_grpc as pb_grpc


def proc_state(pid: int) -> str | None:
    """The /proc state letter of a process (R, S, Z, ...), or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def is_dead(pid: int) -> bool:
    return proc_state(pid) in (None, "Z", "X")


def wait_dead(pids: list[int], timeout: float) -> list[int]:
    """Waits until every pid is gone or a zombie; returns the ones still running."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if not is_dead(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def live_processes_mentioning(*texts: str) -> list[tuple[int, str]]:
    """Running (not zombie) processes whose command line contains every text."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        line = cmdline(pid)
        if line and all(t in line for t in texts) and not is_dead(pid):
            found.append((pid, line))
    return found


def workers_of(front_pid: int) -> list[tuple[int, str]]:
    return live_processes_mentioning("streamtx.server.partition.worker", f"--parent {front_pid} ")


class Launched:
    """`python -m streamtx serve` with its stderr kept in a file (EmbeddedServer lets it through)."""

    def __init__(self, data_dir: Path, partitions: int = 2, extra: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.stderr_path = data_dir.parent / f"{data_dir.name}.stderr"
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "port").unlink(missing_ok=True)
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamtx", "serve", "--port", "0", "--data-dir", str(data_dir)]
                + ["--partitions", str(partitions), *(extra or [])],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"server exited at start-up: {self.stderr()}"
            port = data_dir / "port"
            if port.exists() and port.read_text().strip():
                self.target = f"127.0.0.1:{port.read_text().strip()}"
                break
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        self.channel = grpc.insecure_channel(self.target)
        self.stub = pb_grpc.StreamTxStub(self.channel)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
