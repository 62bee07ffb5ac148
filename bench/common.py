"""What every `streamtx bench` verb shares: output lines, timing, interleaving, plots.

Conventions (docs/benchmarks.md, "Conventions"):

- stdout carries only JSON lines, one per configuration, then the ratio lines
  (`emit`, `ratio_line`); progress goes to stderr (`progress`), so that
  `streamtx bench push > push.jsonl` stays machine-readable;
- timings on the shared 2-core machine are noisy, so configurations are run
  interleaved, A,B,A,B,..., for several rounds and each reports its median round
  (`interleave`, `median_round`); every claim is a ratio of two numbers measured
  in the same run.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

C = TypeVar("C")
T = TypeVar("T")


# -- output -------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """JSON-friendly: numpy scalars to Python, non-finite floats to None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def emit(record: Mapping[str, Any]) -> None:
    """Writes one JSON object as one line on stdout, flushed."""
    out = sys.stdout  # looked up per call, so that redirection (and pytest's capsys) applies
    out.write(json.dumps(_plain(record), separators=(", ", ": ")) + "\n")
    out.flush()


def ratio_line(
    benchmark: str,
    ratio: float,
    target: float,
    numerator: str,
    denominator: str,
    **extra: Any,
) -> dict[str, Any]:
    """The closing line of a comparison: `numerator / denominator = ratio` against `target`.

    `met` is true when the ratio reaches the target. Extra keys (e.g. the two
    measured values) are appended after the standard ones.
    """
    ok = ratio is not None and math.isfinite(ratio)
    return {
        "benchmark": benchmark,
        "ratio": round(float(ratio), 3) if ok else None,
        "target": target,
        "numerator": numerator,
        "denominator": denominator,
        "met": bool(ok and ratio >= target),
        **extra,
    }


def find_line(lines: Sequence[Mapping[str, Any]], **match: Any) -> Any:
    """The first output line whose keys equal `match` (KeyError naming `match` if none)."""
    for line in lines:
        if all(line.get(k) == v for k, v in match.items()):
            return line
    raise KeyError(match)


def parse_sizes(text: str) -> tuple[int, ...]:
    """`--batch-sizes 1,100,10000`: distinct positive sizes, ascending (an argparse type)."""
    import argparse

    try:
        sizes = tuple(sorted({int(s) for s in text.split(",") if s.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError("batch sizes must be >= 1")
    return sizes


def round_sig(x: float, digits: int = 4) -> float:
    """`x` rounded to `digits` significant digits (for readable JSON lines)."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


# -- latency and timing -------------------------------------------------------------


def latency_summary(seconds: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """p50/p99/max in milliseconds of a list of durations in seconds (None when empty)."""
    a = np.asarray(seconds, dtype=float)
    if a.size == 0:
        return {"p50": None, "p99": None, "max": None}
    p50, p99 = np.percentile(a, [50, 99])
    return {
        "p50": round(float(p50) * 1e3, 3),
        "p99": round(float(p99) * 1e3, 3),
        "max": round(float(a.max()) * 1e3, 3),
    }


class Stopwatch:
    """Wall-clock timer on `time.perf_counter`.

    `with Stopwatch() as sw: ...` then `sw.elapsed`; or `sw = Stopwatch().start()`,
    `sw.stop()`. While running, `elapsed` is the time so far. `lap()` returns the
    time since the previous lap (or the start).
    """

    __slots__ = ("_start", "_stop", "_lap")

    def __init__(self) -> None:
        self._start: float | None = None
        self._stop: float | None = None
        self._lap: float | None = None

    def start(self) -> Stopwatch:
        self._start = self._lap = time.perf_counter()
        self._stop = None
        return self

    def stop(self) -> float:
        if self._start is None:
            raise RuntimeError("Stopwatch.stop() before start()")
        self._stop = time.perf_counter()
        return self.elapsed

    def lap(self) -> float:
        if self._lap is None:
            raise RuntimeError("Stopwatch.lap() before start()")
        now = time.perf_counter()
        since, self._lap = now - self._lap, now
        return since

    @property
    def elapsed(self) -> float:
        if self._start is None:
            return 0.0
        end = self._stop if self._stop is not None else time.perf_counter()
        return end - self._start

    def __enter__(self) -> Stopwatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Measurement:
    """One timed run of one configuration: `count` items in `elapsed` seconds.

    `latencies` are per-item durations in seconds (e.g. push→ack per batch);
    `extra` holds anything else a verb wants to carry to its output line.
    """

    elapsed: float
    count: int
    latencies: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_s(self) -> float:
        return self.count / self.elapsed if self.elapsed > 0 else math.inf


# -- CPU accounting (Linux /proc; None elsewhere) ------------------------------------


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy (all cores, all processes) so far."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """CPU used by the front, each partition worker and this client over one timed run, and by everything else.

    It shows where the time goes: for the comparison to mean anything the
    workers must be the bottleneck, not the front or the client, which share
    the two cores with them. `other_cores` is what the rest of the (shared)
    machine took meanwhile, in cores: a P = 2 run can only use what is left.
    """

    def __init__(self, front_pid: int, partition_pids: list[int]) -> None:
        self.pids = [front_pid, *partition_pids]
        self.start = [_cpu_seconds(p) for p in self.pids]
        self.own = _own_cpu_seconds()
        self.machine = _machine_busy_seconds()
        self.wall = time.perf_counter()

    def per_batch_ms(self, batches: int) -> dict[str, Any]:
        end = [_cpu_seconds(p) for p in self.pids]
        own = _own_cpu_seconds() - self.own
        machine = _machine_busy_seconds()
        wall = time.perf_counter() - self.wall
        used = [None if a is None or b is None else b - a for a, b in zip(self.start, end, strict=True)]
        other = None
        if machine is not None and self.machine is not None and None not in used and wall > 0:
            other = max(0.0, (machine - self.machine - own - sum(u for u in used if u is not None)) / wall)
        return {
            "front": None if used[0] is None else round(used[0] * 1e3 / batches, 2),
            "partitions": [None if u is None else round(u * 1e3 / batches, 2) for u in used[1:]],
            "client": round(own * 1e3 / batches, 2),
            "other_cores": None if other is None else round(other, 2),
        }


# -- progress -----------------------------------------------------------------------


class _NoProgress:
    """The part of rich's Progress API the verbs use, doing nothing."""

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        return 0

    def update(self, task: int, **kwargs: Any) -> None:
        pass

    def advance(self, task: int, advance: float = 1) -> None:
        pass

    def print(self, *objects: Any) -> None:
        pass

    def log(self, *objects: Any) -> None:
        pass


def progress_enabled(quiet: bool = False) -> bool:
    """Progress is shown on stderr only when it is a terminal and not `--quiet`."""
    if quiet:
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def progress(quiet: bool = False) -> Iterator[Any]:
    """A rich Progress on stderr (a no-op object when disabled); stdout is never touched.

    `with progress(args.quiet) as p: t = p.add_task("push", total=n); p.advance(t)`;
    `p.print(...)` writes a line above the bar.
    """
    if not progress_enabled(quiet):
        yield _NoProgress()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True, highlight=False),
        transient=False,
    )
    with bar:
        yield bar


def note(message: str, quiet: bool = False) -> None:
    """One line of commentary on stderr (suppressed with `--quiet`)."""
    if not quiet:
        print(message, file=sys.stderr, flush=True)


# -- pushing ------------------------------------------------------------------------


async def push_batches(
    target: str,
    stream: str,
    producer: str,
    batches: Sequence[Any],
    *,
    pipelined: bool = True,
    arrow: bool = True,
    max_in_flight: int = 256,
    what: str = "bench",
) -> Measurement:
    """Pushes `batches` as one producer and times it; every batch must commit cleanly.

    Pipelined: over the client's PushStream, latency from admission to ack (so
    it includes queueing behind the batches in flight). Otherwise: unary Push,
    one after another, latency = the round trip. A batch that is not committed,
    or whose ack names an aborted downstream TE, fails the benchmark.
    """
    import asyncio

    from streamtx.client import AsyncClient

    latencies = [0.0] * len(batches)
    load = os.getloadavg()[0]  # the machine is shared: record how busy it was
    async with AsyncClient(target, producer_id=producer, arrow=arrow, max_in_flight=max_in_flight) as client:
        await client.status()  # connect before the clock starts
        with Stopwatch() as sw:
            if pipelined:
                futures = []
                for i, batch in enumerate(batches):
                    fut = await client.push(stream, batch)
                    t0 = time.perf_counter()

                    def done(_f: Any, i: int = i, t0: float = t0) -> None:
                        latencies[i] = time.perf_counter() - t0

                    fut.add_done_callback(done)
                    futures.append(fut)
                results = await asyncio.gather(*futures)
            else:
                results = []
                for i, batch in enumerate(batches):
                    t0 = time.perf_counter()
                    results.append(await client.push_one(stream, batch))
                    latencies[i] = time.perf_counter() - t0
    bad = [r for r in results if r.outcome != "committed" or r.reason]
    if bad:
        first = bad[0]
        raise RuntimeError(
            f"{what}: {len(bad)} of {len(batches)} batch(es) not cleanly committed; first: batch "
            f"{first.batch_id} {first.outcome} {first.code} {first.reason}"
        )
    return Measurement(sw.elapsed, len(batches), latencies, {"load_1m": round(load, 2)})


# -- interleaving -------------------------------------------------------------------


def interleave(
    configs: Sequence[C],
    run: Callable[[C, int], T],
    rounds: int,
    *,
    on_done: Callable[[C, int, T], None] | None = None,
) -> list[list[T]]:
    """Runs every configuration once per round, in order: A,B,C,A,B,C,...

    `run(config, round)` measures one configuration once; the result is a list
    per configuration (same order as `configs`) of its `rounds` results. Slow
    drifts of the machine (another process, thermal state) then hit every
    configuration alike instead of whichever happened to run last.
    """
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    results: list[list[T]] = [[] for _ in configs]
    for r in range(rounds):
        for i, config in enumerate(configs):
            value = run(config, r)
            results[i].append(value)
            if on_done is not None:
                on_done(config, r, value)
    return results


def median_round(results: Sequence[T], key: Callable[[T], float]) -> T:
    """The round whose `key` is the median (the lower median for an even count).

    Returning a whole round, not per-metric medians, keeps a line's numbers
    consistent with each other (rows/s, batches/s and latencies of one run).
    """
    if not results:
        raise ValueError("no results")
    ordered = sorted(results, key=key)
    return ordered[(len(ordered) - 1) // 2]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


# -- plots ----------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bars(
    path: str | Path,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    log: bool = False,
    annotate: bool = True,
) -> Path:
    """Grouped bars: one group per entry of `groups`, one bar per series in each.

    `series` maps a legend label to one value per group (None draws no bar).
    Writes a PNG to `path` and returns it.
    """
    plt = _pyplot()
    path = Path(path)
    n = max(1, len(series))
    width = 0.8 / n
    x = np.arange(len(groups))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) * n / 2 + 3), 4.5))
    for i, (label, values) in enumerate(series.items()):
        ys = [np.nan if v is None else float(v) for v in values]
        bars = ax.bar(x + (i - (n - 1) / 2) * width, ys, width, label=label)
        if annotate:
            texts = ["" if np.isnan(y) else _short(y) for y in ys]
            ax.bar_label(bars, labels=texts, fontsize=7, padding=1)
    ax.set_xticks(x, list(groups))
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_lines(
    path: str | Path,
    x: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    logx: bool = False,
    logy: bool = False,
) -> Path:
    """One line per series over the shared `x` values; writes a PNG and returns it."""
    plt = _pyplot()
    path = Path(path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, values in series.items():
        ys = [np.nan if v is None else float(v) for v in values]
        ax.plot(list(x), ys, marker="o", label=label)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def save_figure(fig: Any, path: str | Path) -> Path:
    """Writes a finished figure as a PNG (its folder made if need be), closes it, returns where."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def _short(v: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= limit:
            return f"{v / limit:.3g}{suffix}"
    return f"{v:.3g}"
