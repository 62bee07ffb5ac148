"""A Spark structured streaming job feeding the voter: raw vote files in, leaderboards out.

Spark does what it is good at — reading files, throwing away malformed
records, parsing and checking fields — and streamtx does the transactional
part: each micro-batch (one file) becomes one atomic batch of `votes_in`,
exactly once, and the voter dataflow keeps the leaderboards. The job prints
the leaderboard, read with Query, as it goes.

    python -m streamtx.procedures.voter.spark_pipeline --target 127.0.0.1:7411 \\
        --input votes-raw --generate 20000 --once

`--generate N` first writes N raw votes (JSON lines, some malformed) as files
into --input; without --once the job keeps watching --input for new files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from streamtx.client import Client
from streamtx.errors import StreamTxError
from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params

RAW_SCHEMA = "vote_id STRING, phone_number STRING, contestant_number STRING, _corrupt_record STRING"
LEADERBOARD_SQL = (
    "SELECT l.board, l.rank, l.contestant_number, l.num_votes FROM leaderboard l ORDER BY l.board DESC, l.rank"
)


def write_raw_files(
    directory: Path, votes: int, files: int, *, seed: int = 7, first_file: int = 0, malformed_share: float = 0.03
) -> int:
    """Writes `votes` raw votes as `files` JSON-lines files; returns how many lines are malformed.

    Malformed lines are what a real feed has: truncated JSON, a phone number
    that is not a number, a missing field. Valid lines carry numbers as JSON
    numbers or as strings with stray spaces, which the job must accept.
    """
    directory.mkdir(parents=True, exist_ok=True)
    table = generate_votes(votes, seed=seed, contestants=VoterConfig().contestants, first_id=first_file * 10**9 + 1)
    rng = np.random.default_rng(seed)
    rows = table.to_pylist()
    bad = 0
    for f, part in enumerate(np.array_split(np.arange(len(rows)), files)):
        lines = []
        for i in part:
            r = rows[int(i)]
            roll = rng.random()
            if roll < malformed_share / 3:
                lines.append(json.dumps(r)[:-7])  # truncated
                bad += 1
            elif roll < 2 * malformed_share / 3:
                lines.append(json.dumps({**r, "phone_number": "n/a"}))
                bad += 1
            elif roll < malformed_share:
                lines.append(json.dumps({"vote_id": r["vote_id"], "phone_number": r["phone_number"]}))
                bad += 1
            elif roll < 0.2:
                lines.append(json.dumps({k: f" {v} " for k, v in r.items()}))  # numbers as padded strings
            else:
                lines.append(json.dumps(r))
        name = f"votes-{first_file + f:05d}.json"
        tmp = directory / f".{name}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(directory / name)  # the file source must never see a half-written file
    return bad


def clean(raw):  # noqa: ANN001, ANN201 - pyspark DataFrames (pyspark is imported lazily)
    """Parsed, checked votes in the stream's schema; malformed records are dropped."""
    from pyspark.sql import functions as F

    def number(col: str, sql_type: str):  # noqa: ANN202
        return F.expr(f"try_cast(trim({col}) AS {sql_type})")

    return (
        raw.where(F.col("_corrupt_record").isNull())
        .select(
            number("vote_id", "BIGINT").alias("vote_id"),
            number("phone_number", "BIGINT").alias("phone_number"),
            number("contestant_number", "INT").alias("contestant_number"),
        )
        .where(
            F.col("vote_id").isNotNull()
            & F.col("phone_number").between(1_000_000_000, 9_999_999_999)
            & (F.col("contestant_number") > 0)
        )
    )


def ensure_voter(target: str, timeout_s: float = 60.0) -> bool:
    """Deploys the voter and runs its set-up unless the server has it already; True if deployed.

    Waits up to `timeout_s` for the server (in docker compose it may still be starting).
    Deploy is an admin verb: the token, if the server has one, comes from STREAMTX_TOKEN.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with Client(target, token=os.environ.get("STREAMTX_TOKEN") or None) as c:
                if "votes_in" in c.status()["streams"]:
                    return False
                c.deploy(deploy_script())
                c.call("setup", **setup_params())
                return True
        except StreamTxError as e:
            if time.monotonic() > deadline:
                raise
            print(f"waiting for the streamtx server at {target}: {e}", file=sys.stderr)
            time.sleep(1.0)


def leaderboard_text(target: str) -> str:
    with Client(target) as c:
        total = c.query("SELECT coalesce((SELECT total FROM vote_counter), 0)").fetchall()[0][0]
        rows = c.query(LEADERBOARD_SQL).fetchall()
    boards: dict[str, list[str]] = {}
    for board, rank, number, votes in rows:
        boards.setdefault(board, []).append(f"{rank}. #{number} ({votes:,})")
    text = "; ".join(f"{b}: {', '.join(items)}" for b, items in boards.items())
    return f"accepted votes {total:,} | {text}"


def spark_session(master: str):  # noqa: ANN201
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from streamtx.client.spark import register

    builder = (
        SparkSession.builder.master(master)
        .appName("streamtx-voter-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    if master.startswith("local"):  # everything in this process: no hostname lookups
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def run(
    spark,  # noqa: ANN001
    target: str,
    input_dir: Path,
    checkpoint: Path,
    *,
    once: bool = False,
    files_per_batch: int = 1,
    every_s: float = 0.5,
    out=sys.stdout,  # noqa: ANN001
) -> int:
    """Streams the files of `input_dir` into votes_in; prints the leaderboard after each batch.

    Returns the number of micro-batches that read input. With `once`, processes what is
    there and stops; otherwise runs until interrupted.
    """
    raw = (
        spark.readStream.schema(RAW_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .option("maxFilesPerTrigger", files_per_batch)
        .json(str(input_dir))
    )
    writer = (
        clean(raw)
        .writeStream.format("streamtx")
        .option("target", target)
        .option("stream", "votes_in")
        .option("checkpointLocation", str(checkpoint))
    )
    query = writer.trigger(availableNow=True).start() if once else writer.start()
    batches: set[int] = set()
    try:
        while query.isActive:
            query.awaitTermination(every_s)
            new = {p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0} - batches
            if new:
                batches |= new
                print(f"micro-batch {max(new)}: {leaderboard_text(target)}", file=out, flush=True)
        query.awaitTermination()  # raises the query's error, if it failed
        batches |= {p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0}
    finally:
        if query.isActive:
            query.stop()
    print(f"final: {leaderboard_text(target)}", file=out, flush=True)
    return len(batches)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m streamtx.procedures.voter.spark_pipeline",
        description="Spark structured streaming: raw vote files -> clean -> streamtx voter (exactly once).",
    )
    p.add_argument("--target", default=os.environ.get("STREAMTX_TARGET", "127.0.0.1:7411"), help="HOST:PORT")
    p.add_argument("--input", type=Path, default=Path("votes-raw"), help="directory of raw vote files")
    p.add_argument("--checkpoint", type=Path, default=Path("votes-checkpoint"), help="Spark checkpoint directory")
    p.add_argument("--generate", type=int, default=0, help="first write this many raw votes into --input")
    p.add_argument("--files", type=int, default=10, help="files to spread generated votes over (default 10)")
    p.add_argument("--once", action="store_true", help="process the files there, print the result, stop")
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"))
    args = p.parse_args(argv)
    if args.generate:
        first = len(list(args.input.glob("votes-*.json"))) if args.input.exists() else 0
        bad = write_raw_files(args.input, args.generate, args.files, seed=first + 7, first_file=first)
        print(f"wrote {args.generate} raw votes ({bad} malformed) to {args.input}")
    if ensure_voter(args.target):
        print(f"deployed the voter on {args.target}")
    spark = spark_session(args.master)
    try:
        batches = run(spark, args.target, args.input, args.checkpoint, once=args.once)
    finally:
        spark.stop()
    print(f"{batches} micro-batches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
