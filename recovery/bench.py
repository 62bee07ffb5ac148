"""Side-by-side cost of durability: one fsync per record against group commit, in one run.

    python -m streamtx.recovery.bench [--records N] [--size BYTES] [--dir DIR]

Every mode appends the same records to a fresh log in DIR (default: a temp
directory next to the working directory, so on the same disk as a data dir) and
counts a record only once it is durable.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from streamtx.recovery.log import CommandLog


def _run(directory: Path, records: int, payload: bytes, mode: str) -> tuple[float, int]:
    shutil.rmtree(directory, ignore_errors=True)
    kw = {"fsync": mode != "no fsync", "group_ms": 2.0}
    t0 = time.perf_counter()
    with CommandLog(directory, **kw) as log:
        if mode == "fsync per record":
            for _ in range(records):
                log.append(1, payload)
                log.flush()
        else:
            for _ in range(records):
                log.append(1, payload)
            log.flush()
        groups = log.groups
    return time.perf_counter() - t0, groups


def _latency(directory: Path, records: int, payload: bytes, rate: float) -> tuple[float, float, int]:
    """Append→durable latency (p50, p99 in ms) for an executor appending `rate` records/s."""
    shutil.rmtree(directory, ignore_errors=True)
    appended: list[float] = []
    durable_at: list[tuple[int, float]] = []
    with CommandLog(directory, on_durable=lambda lsn: durable_at.append((lsn, time.perf_counter()))) as log:
        start = time.perf_counter()
        for i in range(records):
            while time.perf_counter() < start + i / rate:
                time.sleep(0.0001)  # the executor's work, GIL released (as DuckDB does)
            appended.append(time.perf_counter())
            log.append(1, payload)
        log.flush()
        groups = log.groups
    lat, j = [], 0
    for lsn, t in durable_at:
        while j < lsn:
            lat.append(1000 * (t - appended[j]))
            j += 1
    lat.sort()
    return lat[len(lat) // 2], lat[int(len(lat) * 0.99)], groups


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each mode reports its median")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="streamtx-logbench-", dir=args.dir or os.getcwd()))
    payload = os.urandom(args.size)
    modes = ("fsync per record", "group commit", "no fsync")
    rates: dict[str, list[tuple[float, int]]] = {m: [] for m in modes}
    try:
        print(f"{args.records} records of {args.size} bytes, {args.rounds} interleaved rounds, log in {base}")
        for _ in range(args.rounds):
            for mode in modes:
                n = args.records if mode != "fsync per record" else min(args.records, 500)
                secs, groups = _run(base / mode.replace(" ", "-"), n, payload, mode)
                rates[mode].append((n / secs, groups))
        for mode in modes:
            rate, groups = statistics.median_low(rates[mode])
            print(f"  {mode:17s} {rate:>10,.0f} durable appends/s  (median round: {groups} fsync'd groups)")
        ratio = statistics.median_low(rates["group commit"])[0] / statistics.median_low(rates["fsync per record"])[0]
        print(f"  group commit / fsync per record = {ratio:,.1f}x")
        for rate in (1000.0, 10000.0):
            p50, p99, groups = _latency(base / "latency", int(rate), payload, rate)
            print(f"  append->durable at {rate:,.0f}/s for 1 s: p50 {p50:.2f} ms, p99 {p99:.2f} ms, {groups} groups")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
