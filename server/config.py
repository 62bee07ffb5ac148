"""Server configuration: one dataclass, built by the CLI or by tests."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PORT = 7411
EXECUTORS = ("serial", "opchain")
"""`serial`: S-Store's way, every TE alone with its own state access. `opchain`: TStream's
way, state procedures' events coalesced into punctuation intervals with set-based state access."""


def default_procedures_path() -> Path:
    """The applications that ship with streamtx (the repository's procedures/)."""
    return Path(__file__).resolve().parent.parent / "procedures"


@dataclass
class ServerConfig:
    """Everything `streamtx serve` can be told.

    Defaults give a server on 127.0.0.1 with one partition per core that works
    on a laptop with nothing else installed.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0 picks a free port; the chosen one is printed and written to data_dir/port
    data_dir: Path = field(default_factory=lambda: Path("streamtx-data"))
    partitions: int = field(default_factory=lambda: os.cpu_count() or 1)
    executor: str = "opchain"  # one of EXECUTORS
    procedures_path: Path = field(default_factory=default_procedures_path)
    token: str | None = field(default_factory=lambda: os.environ.get("STREAMTX_TOKEN") or None)
    use_uvloop: bool = True
    max_batch_rows: int = 1_000_000
    max_message_bytes: int = 64 * 1024 * 1024
    max_in_flight: int = 1024  # pushed batches admitted but not yet acknowledged, per server
    stream_retention: int = 10_000  # batches kept on a stream no procedure consumes, for Subscribe;
    # trimmed in steps of a tenth, so between N and 1.1 N of the latest batches are held
    order_timeout_s: float = 10.0  # how long a batch waits for a missing earlier batch id
    bins: int = 1024
    max_restarts: int = 5  # worker restarts (front/supervisor.py) allowed per restart window; one more stops the server
    restart_window_s: float = 60.0
    durability: str = "strong"  # strong | weak | off: what the command log holds (server/partition/journal.py)
    group_commit_ms: float = 2.0  # log records become durable together, at most this long after the first
    checkpoint_every_s: float = 0.0  # periodic online checkpoints (0: only on demand)
    interval_size: int = 500  # punctuation interval: at most this many queued batches per transaction
    interval_ms: float = 0.0  # latency budget: wait up to this long for an interval to fill
    staging_max_bytes: int = 512 * 1024 * 1024  # rows staged for two-phase pushes (Spark), in all
    staging_ttl_s: float = 900.0  # staged rows never committed are dropped after this long idle

    def validate(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"--partitions must be >= 1, got {self.partitions}")
        if self.bins < self.partitions:
            raise ValueError(f"--bins ({self.bins}) must be at least --partitions ({self.partitions})")

        if self.durability not in ("strong", "weak", "off"):
            raise ValueError(f"--durability must be strong, weak or off, got {self.durability!r}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        if not (0 <= self.port < 65536):
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        if self.interval_size < 1:
            raise ValueError("--interval-size must be >= 1")
        if self.interval_ms < 0:
            raise ValueError("--interval-ms must be >= 0")
        if self.group_commit_ms < 0:
            raise ValueError(f"--group-commit-ms must be >= 0 (0: no group commit), got {self.group_commit_ms}")
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.restart_window_s <= 0:
            raise ValueError(f"--restart-window must be > 0, got {self.restart_window_s}")
        if self.max_batch_rows < 1:
            raise ValueError("--max-batch-rows must be >= 1")
        if self.staging_max_bytes < 1:
            raise ValueError("--staging-max-bytes must be >= 1")
        if self.staging_ttl_s <= 0:
            raise ValueError("--staging-ttl must be > 0")
