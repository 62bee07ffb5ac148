"""`streamtx demo`: the voter leaderboard, end to end, on an embedded server.

Starts a real server (a child process on a free port of 127.0.0.1), deploys
procedures/voter, pushes generated votes as pipelined atomic batches with a
progress bar, then prints the standings read back with Query.

By default the voter runs as state procedures (`--app state`) with one vote
per atomic batch, the setting of the S-Store benchmark: the opchain executor
coalesces the batches into punctuation intervals. `--app dataflow` deploys
the SQL dataflow instead; its `vote` procedure takes a batch one vote at a
time (FOR EACH ROW), each vote about a dozen DuckDB statements, so it runs
about a hundred votes per second whatever the batch size.
"""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from streamtx.client import Client
from streamtx.procedures.voter import state
from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params
from streamtx.procedures.voter.reference import SERVER_QUERIES
from streamtx.server.config import EXECUTORS
from streamtx.server.embedded import EmbeddedServer

APPS = {"state": state.QUERIES, "dataflow": SERVER_QUERIES}
"""The voter's deploy modes the demo runs, with the queries that read each one's standings."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streamtx demo",
        description="Runs the voter-with-leaderboards application (S-Store's voter, section 4.1 of its paper) on an "
        "embedded server: deploy, push generated votes, print the standings.",
    )
    p.add_argument(
        "--app",
        choices=APPS,
        default="state",
        help="the voter as state procedures (fast: opchain intervals) or as the SQL dataflow (default %(default)s)",
    )
    p.add_argument("--votes", type=int, default=20_000, help="votes to push (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=1, help="votes per atomic batch (default %(default)s)")
    p.add_argument("--contestants", type=int, default=25, help="contestants (default %(default)s)")
    p.add_argument("--delete-every", type=int, default=5_000, help="votes between deletions (default %(default)s)")
    p.add_argument("--max-votes", type=int, default=1, help="votes allowed per phone (default %(default)s)")
    p.add_argument("--phones", type=int, default=15_000, help="distinct phones (default %(default)s)")
    p.add_argument("--executor", default="opchain", choices=EXECUTORS, help="server executor")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--target", help="use a running server at HOST:PORT instead of an embedded one")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(stderr=True)
    config = VoterConfig(contestants=args.contestants, max_votes=args.max_votes, delete_every=args.delete_every)
    votes = generate_votes(args.votes, seed=args.seed, contestants=args.contestants, phones=args.phones)
    if args.target:
        return _run(args.target, args.app, config, votes, args.batch_size, console)
    with console.status("starting an embedded streamtx server"):
        server = EmbeddedServer(executor=args.executor).start()
    try:
        console.print(f"[bold]streamtx[/] server on {server.target} ({args.executor} executor)")
        return _run(server.target, args.app, config, votes, args.batch_size, console)
    finally:
        server.close()


def _run(target: str, app: str, config: VoterConfig, votes, batch_size: int, console: Console) -> int:
    out = Console()
    with Client(target, max_in_flight=1024) as client:
        created = client.deploy(deploy_script(config, app))
        console.print(f"deployed procedures/voter ({app}): {len(created.created)} objects")
        client.call("setup", **setup_params(config))
        batches = [votes.slice(i, batch_size) for i in range(0, votes.num_rows, batch_size)]
        progress = Progress(
            TextColumn("pushing votes"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>8} batches/s"),
            TimeRemainingColumn(),
            console=console,
        )
        futures = []
        start = time.perf_counter()
        with progress:
            task = progress.add_task("push", total=len(batches), rate="")

            def done(_f) -> None:
                elapsed = time.perf_counter() - start
                finished = progress.tasks[0].completed + 1
                progress.update(task, advance=1, rate=f"{finished / elapsed:,.0f}")

            for batch in batches:
                fut = client.push("votes_in", batch)
                fut.add_done_callback(done)
                futures.append(fut)
            results = [f.result() for f in futures]
        elapsed = time.perf_counter() - start
        rejected = [r for r in results if not r.ok]
        console.print(
            f"{len(results)} batches ({votes.num_rows} votes) in {elapsed:.1f} s: "
            f"{len(results) / elapsed:,.0f} batches/s, {votes.num_rows / elapsed:,.0f} votes/s; "
            f"{len(rejected)} batch(es) rejected"
        )
        _print_standings(client, APPS[app]["leaderboard"], out)
    return 1 if rejected else 0


def _print_standings(client: Client, leaderboard: str, out: Console) -> None:
    totals = client.query(
        "SELECT (SELECT total FROM vote_counter) AS accepted, "
        "(SELECT count(*) FROM votes) AS standing, (SELECT count(*) FROM contestants) AS contestants"
    ).to_pylist()[0]
    boards = client.query(
        f"SELECT l.board, l.rank, l.contestant_number, c.contestant_name, l.num_votes FROM ({leaderboard}) l "
        "JOIN contestants c USING (contestant_number) ORDER BY l.board DESC, l.rank"
    )
    table = Table(title="Leaderboards")
    for col in ("board", "rank", "contestant", "name", "votes"):
        table.add_column(col, justify="right" if col in ("rank", "votes", "contestant") else "left")
    for board, rank, number, name, n in boards.fetchall():
        table.add_row(board, str(rank), str(number), name, f"{n:,}")
    out.print(table)
    deletions = client.query("SELECT count(*) FROM deletions").fetchall()[0][0]
    out.print(
        f"accepted votes: {totals['accepted']:,}; votes standing: {totals['standing']:,}; "
        f"contestants left: {totals['contestants']} ({deletions} removed)"
    )


if __name__ == "__main__":
    sys.exit(main())
