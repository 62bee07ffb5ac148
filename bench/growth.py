"""The SQL voter as its state grows: 1-vote batches/s after 10k, 100k and 1M stored votes.

One embedded server per level deploys the voter's SQL dataflow
(procedures/voter/dataflow.sql, compiled, `--executor opchain`) and is loaded
with that many stored votes, each from its own phone, before the clock starts
(one OLTP call, `INSERT ... SELECT FROM range(n)` into votes and phone_votes,
the per-contestant counts and the vote counter to match). Then each takes
untimed warm-up votes and, in interleaved rounds, the same number of 1-vote
batches from one pipelined producer with every guarantee on. Deletions are
off (`delete_every` beyond the run): a deletion scans every stored vote in
DuckDB, a cost that grows with the state by design, not the steady state this
measures.

Checked after every run against a `VoterReference` fed the run's votes alone
(the loaded votes share no phone with them): the votes, phone counts and
rejections of the run, the trending board, and the per-contestant counts and
the vote counter net of what was loaded. The ratio line divides the slowest
level's batches/s by the fastest's: flat within 20% is 0.8.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from .common import (
    Measurement,
    interleave,
    latency_summary,
    median_round,
    parse_sizes,
    plot_bars,
    progress,
    push_batches,
    ratio_line,
    round_sig,
)

NAME = "growth"
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 2
DEFAULT_LEVELS = (10_000, 100_000, 1_000_000)
QUICK_LEVELS = (1_000, 10_000, 100_000)
BATCHES = 5_000  # 1-vote batches per level and round
QUICK_BATCHES = 1_000
WARMUP = 2_000  # untimed 1-vote batches per level before the rounds
QUICK_WARMUP = 500
MAX_IN_FLIGHT = 256  # the PushStream window of `streamtx bench voter`'s dataflow runs
FLAT_TARGET = 0.8  # slowest / fastest level: flat within 20%
FIRST_PHONE = 9_000_000_000  # loaded votes' phones: area code 900, which generated votes never use
FIRST_ID = 10**12  # loaded votes' ids, above any generated one

PRELOAD = """
CREATE PROCEDURE preload(n BIGINT, contestants BIGINT) AS BEGIN
    INSERT INTO votes SELECT {first_id} + i, {first_phone} + i, 'XX', 1 + i % $contestants, 0 FROM range($n) t(i);
    INSERT INTO phone_votes SELECT {first_phone} + i, 1 FROM range($n) t(i);
    INSERT INTO contestant_votes SELECT contestant_number, count(*) FROM votes GROUP BY contestant_number
        ON CONFLICT DO UPDATE SET num_votes = excluded.num_votes;
    UPDATE vote_counter SET total = total + $n WHERE id = 1;
END;
"""


@dataclass(frozen=True)
class Level:
    stored: int
    batches: int

    @property
    def label(self) -> str:
        return f"{self.stored:,} stored votes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--levels",
        type=parse_sizes,
        default=None,
        metavar="N,N",
        help="stored votes per server (default 10000,100000,1000000; --quick 1000,10000,100000)",
    )
    parser.add_argument("--batches", type=int, default=None, help=f"1-vote batches per level and round ({BATCHES})")


def _loaded_counts(stored: int, contestants: int) -> dict[int, int]:
    """Votes per contestant the preload stored: contestant 1 + i % contestants for i < stored."""
    base, extra = divmod(stored, contestants)
    return {c: base + (1 if c <= extra else 0) for c in range(1, contestants + 1)}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from streamtx.client import Client
    from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params
    from streamtx.procedures.voter.reference import VoterReference
    from streamtx.server.embedded import EmbeddedServer

    levels_n = args.levels or (QUICK_LEVELS if args.quick else DEFAULT_LEVELS)
    batches = args.batches or (QUICK_BATCHES if args.quick else BATCHES)
    warmup = QUICK_WARMUP if args.quick else WARMUP
    levels = [Level(n, batches) for n in levels_n]
    config = VoterConfig(delete_every=10**12)  # no deletion during the run (module docstring)
    per_server = warmup + batches * args.rounds
    votes = generate_votes(per_server * len(levels), seed=23, phones=max(10_000, per_server))
    refs = {lv.stored: VoterReference(config) for lv in levels}
    checks: dict[int, list[bool]] = {lv.stored: [] for lv in levels}
    run_id = uuid.uuid4().hex[:8]
    script = deploy_script(config, "dataflow") + PRELOAD.format(first_id=FIRST_ID, first_phone=FIRST_PHONE)

    def slice_of(i: int, start: int, n: int) -> list[pa.Table]:
        base = i * per_server + start
        return [votes.slice(base + j, 1) for j in range(n)]

    def check(level: Level, target: str, sent: list[pa.Table]) -> None:
        """The server equals the reference fed the same votes, net of what was loaded."""
        ref = refs[level.stored]
        for b in sent:
            ref.process_batch(list(zip(*(b.column(c).to_pylist() for c in b.column_names), strict=True)))
        want = ref.tables()
        loaded = _loaded_counts(level.stored, config.contestants)
        with Client(target) as c:
            q = c.query
            got_votes = q(
                "SELECT vote_id, phone_number, state, contestant_number FROM votes WHERE vote_id < $id ORDER BY 1",
                {"id": FIRST_ID},
            ).fetchall()
            got_phones = q(
                "SELECT phone_number, num_votes FROM phone_votes WHERE phone_number < $p ORDER BY 1", {"p": FIRST_PHONE}
            ).fetchall()
            counts = dict(q("SELECT contestant_number, num_votes FROM contestant_votes").fetchall())
            net = sorted((k, n - loaded.get(k, 0)) for k, n in counts.items() if n != loaded.get(k, 0))
            total = q("SELECT total FROM vote_counter WHERE id = 1").fetchall()[0][0] - level.stored
            trending = q(
                "SELECT board, rank, contestant_number, num_votes FROM leaderboard WHERE board = 'trending' ORDER BY 2"
            ).fetchall()
            rejected = q("SELECT vote_id, reason FROM rejected_votes ORDER BY vote_id").fetchall()
        ok = (
            got_votes == want["votes"]
            and got_phones == want["phone_votes"]
            and net == [(k, n) for k, n in want["contestant_votes"] if n]
            and [(1, total)] == want["vote_counter"]
            and trending == [r for r in want["leaderboard"] if r[0] == "trending"]
            and rejected == sorted(ref.rejected)
        )
        checks[level.stored].append(ok)
        if not ok:
            raise RuntimeError(f"bench growth: {level.label}: the server's state differs from the reference")

    retain = ["--stream-retention", "1000000"]
    with ExitStack() as stack:
        servers = {
            lv.stored: stack.enter_context(EmbeddedServer(executor="opchain", extra_args=retain)) for lv in levels
        }
        with progress(args.quiet) as bar:
            task = bar.add_task("bench growth", total=len(levels) * (args.rounds + 1))
            for i, lv in enumerate(levels):
                target = servers[lv.stored].target
                bar.update(task, description=f"growth: loading {lv.label}, warming up")
                with Client(target) as c:
                    c.deploy(script)
                    c.call("setup", **setup_params(config))
                    c.call("preload", n=lv.stored, contestants=config.contestants)
                warm = slice_of(i, 0, warmup)
                producer = f"growth-{run_id}-{lv.stored}-w"
                asyncio.run(push_batches(target, "votes_in", producer, warm, max_in_flight=MAX_IN_FLIGHT))
                check(lv, target, warm)
                bar.advance(task)

            def one(lv: Level, r: int) -> Measurement:
                i = levels.index(lv)
                bar.update(task, description=f"growth: {lv.label}, round {r + 1}/{args.rounds}")
                target = servers[lv.stored].target
                sent = slice_of(i, warmup + r * batches, batches)
                producer = f"growth-{run_id}-{lv.stored}-r{r}"
                m = asyncio.run(push_batches(target, "votes_in", producer, sent, max_in_flight=MAX_IN_FLIGHT))
                check(lv, target, sent)  # after the clock stopped
                return m

            def done(lv: Level, r: int, m: Measurement) -> None:
                bar.advance(task)
                bar.print(f"{lv.label} round {r + 1}: {m.per_s:,.1f} batches/s")

            results = interleave(levels, one, args.rounds, on_done=done)
    lines: list[dict[str, Any]] = []
    for lv, rounds in zip(levels, results, strict=True):
        m = median_round(rounds, key=lambda x: x.per_s)
        lines.append(
            {
                "benchmark": NAME,
                "stored_votes": lv.stored,
                "batch_size": 1,
                "batches": lv.batches,
                "batches_per_s": round_sig(m.per_s),
                "latency_ms": latency_summary(m.latencies),
                "rounds": len(rounds),
                "batches_per_s_rounds": [round_sig(x.per_s) for x in rounds],
                "executor": "opchain",
                "guarantees": "acid+ordered+exactly-once",
                "load_1m": m.extra.get("load_1m"),
                "matches_reference": all(checks[lv.stored]),
            }
        )
    rates = [x["batches_per_s"] for x in lines]
    slow, fast = min(lines, key=lambda x: x["batches_per_s"]), max(lines, key=lambda x: x["batches_per_s"])
    lines.append(
        ratio_line(
            NAME,
            min(rates) / max(rates),
            FLAT_TARGET,
            f"batches/s of the slowest level ({slow['stored_votes']:,} stored votes)",
            f"batches/s of the fastest level ({fast['stored_votes']:,} stored votes)",
            levels=[x["stored_votes"] for x in lines],
            batches_per_s=rates,
            matches_reference=all(x["matches_reference"] for x in lines),
        )
    )
    return lines


def plot(records: list[dict[str, Any]], path: str | Path) -> Path:
    lines = [r for r in records if "stored_votes" in r]
    return plot_bars(
        path,
        [f"{r['stored_votes']:,} stored votes" for r in lines],
        {"SQL voter dataflow, 1-vote batches": [r["batches_per_s"] for r in lines]},
        title="The SQL voter as its state grows: input batches/s (median round)",
        ylabel="batches/s",
    )
