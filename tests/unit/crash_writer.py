"""A command-log writer to be killed with SIGKILL by tests/unit/test_command_log.py.

Usage: python tests/unit/crash_writer.py DIRECTORY SEED

Opens (and so repairs) the log in DIRECTORY, then appends records (for at most a minute) with
payloads that `expected_payload(lsn, seed)` can recompute, varying their size.
Each time a group becomes durable it prints `durable <lsn>` on stdout: a record
printed there has been acknowledged, and must survive the kill.
"""

from __future__ import annotations

import random
import sys
import time

from streamtx.recovery.log import CommandLog


def expected_payload(lsn: int, seed: int) -> bytes:
    """The payload the writer appends at `lsn`: size and bytes depend only on (lsn, seed)."""
    rng = random.Random(lsn * 1_000_003 + seed)
    size = rng.choice([0, 1, 17, 200, 1000, 5000, 40_000])
    return rng.randbytes(size)


def main() -> None:
    directory, seed = sys.argv[1], int(sys.argv[2])

    def report(lsn: int) -> None:
        sys.stdout.write(f"durable {lsn}\n")
        sys.stdout.flush()

    log = CommandLog(directory, group_bytes=64 * 1024, group_ms=1.0, segment_bytes=256 * 1024, on_durable=report)
    sys.stdout.write(f"start {log.last_lsn + 1}\n")
    sys.stdout.flush()
    deadline = time.monotonic() + 60  # bounded even if nobody kills it
    while time.monotonic() < deadline:
        lsn = log.last_lsn + 1
        assert log.append(lsn % 7, expected_payload(lsn, seed), ts=lsn * 10) == lsn


if __name__ == "__main__":
    main()
