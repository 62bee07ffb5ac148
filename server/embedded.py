"""A server in a child process, for the demo, benchmarks and tests.

It is the real thing (`python -m streamtx serve` on a free port of
127.0.0.1), started and stopped like an operator would: SIGTERM, then SIGKILL
if it does not stop in time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from streamtx.server.config import flags


class EmbeddedServer:
    """`with EmbeddedServer() as srv: Client(srv.target)`."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        partitions: int | None = 1,
        executor: str | None = None,
        interval_size: int | None = None,
        token: str | None = None,
        durability: str | None = None,
        extra_args: list[str] | None = None,
        quiet: bool = True,
        startup_timeout: float = 60.0,
    ) -> None:
        """Settings left None keep the server's default; `extra_args` are more `streamtx serve` flags."""
        self._tmp = None if data_dir is not None else tempfile.TemporaryDirectory(prefix="streamtx-")
        self.data_dir = Path(data_dir) if data_dir is not None else Path(self._tmp.name)
        settings = flags(
            port=0,
            data_dir=self.data_dir,
            partitions=partitions,
            executor=executor,
            token=token or None,
            interval_size=interval_size or None,
            durability=durability,
        )
        self.args = [*settings, *(extra_args or [])]
        self.quiet = quiet
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> EmbeddedServer:
        """Starts the server; with `wait`, returns once it listens (recovery done)."""
        port_file = self.data_dir / "port"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        port_file.unlink(missing_ok=True)
        out = subprocess.DEVNULL if self.quiet else None
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamtx", "serve", *self.args], stdout=out, stderr=None, env=env
        )
        if not wait:
            return self
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"streamtx server exited during start-up with status {self.proc.returncode}")
            if port_file.exists():
                text = port_file.read_text().strip()
                if text:
                    self.port = int(text)
                    return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"streamtx server did not start within {self.startup_timeout} s")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait, SIGKILL if needed; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
