"""The `streamtx` command: run a server, deploy applications, push data, query state.

Client subcommands talk to a running server (`--target`, env STREAMTX_TARGET);
`serve` runs one. Server errors print one line, `error: <CODE>: <message>`, on
stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamtx.errors import StreamTxError

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.console import Console, Group
    from rich.table import Table

    from streamtx.client import Result

DEFAULT_TARGET = "127.0.0.1:7411"
EXIT_OK, EXIT_REJECTED, EXIT_ERROR = 0, 1, 2

_FILE_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    from streamtx.server.config import ServerConfig, add_arguments

    parser = argparse.ArgumentParser(
        prog="streamtx",
        description="A transactional stream-processing server (S-Store dataflows, "
        "TStream operation chains, exactly-once) and its command-line client.",
    )
    parser.add_argument("--version", action=_Version)
    parser.add_argument(
        "--target",
        metavar="HOST:PORT",
        default=os.environ.get("STREAMTX_TARGET") or DEFAULT_TARGET,
        help="server address for client commands (env STREAMTX_TARGET; default %(default)s)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("STREAMTX_TOKEN") or None,
        help="bearer token sent on every call (env STREAMTX_TOKEN)",
    )
    parser.add_argument(
        "--tls-ca",
        dest="client_tls_ca",
        metavar="PATH",
        default=os.environ.get("STREAMTX_TLS_CA") or None,
        help="connect over TLS, trusting the server certificate this PEM CA signed (env STREAMTX_TLS_CA)",
    )
    parser.add_argument(
        "--tls-cert",
        dest="client_tls_cert",
        metavar="PATH",
        default=os.environ.get("STREAMTX_TLS_CERT") or None,
        help="client certificate (PEM) for a server that asks for one, mutual TLS; with --tls-key "
        "(env STREAMTX_TLS_CERT)",
    )
    parser.add_argument(
        "--tls-key",
        dest="client_tls_key",
        metavar="PATH",
        default=os.environ.get("STREAMTX_TLS_KEY") or None,
        help="the PEM private key of --tls-cert (env STREAMTX_TLS_KEY)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "deploy",
        help="deploy a SQL script (tables, streams, windows, procedures, triggers, DROPs)",
        description="Deploys a script atomically: every statement or none. Prints what "
        "was created and dropped. FILE may be '-' for standard input.",
    )
    p.add_argument("file", metavar="FILE", help="the SQL script ('-' reads stdin)")

    p = sub.add_parser(
        "sql",
        help="run a read-only query and print the result",
        description="Runs read-only SQL over the current committed state (Query RPC) and prints the result as a table.",
    )
    p.add_argument("query", metavar="SQL", help='the query, e.g. "SELECT * FROM votes"')
    p.add_argument(
        "param",
        nargs="*",
        metavar="NAME=VALUE",
        help="parameters bound as $NAME (values parsed as int, float, else string)",
    )
    p.add_argument("--max-rows", type=int, default=1000, help="rows to print (default %(default)s)")

    p = sub.add_parser(
        "call",
        help="call an OLTP stored procedure",
        description="Runs one OLTP transaction: calls PROC with the given parameters and "
        "prints every result table it returns.",
    )
    p.add_argument("procedure", metavar="PROC", help="procedure name")
    p.add_argument(
        "param",
        nargs="*",
        metavar="NAME=VALUE",
        help="procedure parameters (values parsed as int, then float, else string)",
    )
    p.add_argument("--max-rows", type=int, default=1000, help="rows to print per result")

    p = sub.add_parser(
        "explain",
        help="how each SQL statement of a procedure or trigger runs: compiled, or in DuckDB and why",
        description="Prints, for each SQL statement of the procedure (or EE trigger) NAME, whether it "
        "runs compiled over the partitions' in-memory state, and how (its sources, key lookups, scans, "
        "grouping), or in DuckDB, and why: what to rewrite for it to compile.",
    )
    p.add_argument("name", metavar="NAME", help="a procedure or an EE trigger")

    p = sub.add_parser(
        "push",
        help="push a CSV, Parquet or JSON-lines file onto a stream in atomic batches",
        description="Reads FILE with pyarrow and pushes it onto STREAM in atomic batches of "
        "--batch-size rows, pipelined over one PushStream call. Prints how many batches "
        "were committed, duplicate or rejected; exits 1 if any batch was rejected. "
        "Re-running with the same --producer-id re-sends the same batch ids, which the "
        "server acknowledges as duplicates (exactly-once).",
    )
    p.add_argument("stream", metavar="STREAM", help="target stream")
    p.add_argument(
        "--file",
        "-f",
        required=True,
        type=Path,
        help="input file: .csv, .tsv, .parquet, .jsonl/.ndjson/.json",
    )
    p.add_argument(
        "--format",
        choices=sorted(set(_FILE_FORMATS.values())),
        help="file format (default: from the file extension)",
    )
    p.add_argument("--batch-size", "-n", type=int, default=1000, help="rows per batch (default %(default)s)")
    p.add_argument("--producer-id", help="producer id for exactly-once dedup (default: a random uuid)")
    p.add_argument(
        "--first-batch-id",
        type=int,
        default=1,
        help="batch id of the first batch (default %(default)s)",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        help="unacknowledged batches allowed at once (default %(default)s)",
    )
    p.add_argument(
        "--protobuf",
        action="store_true",
        help="send typed protobuf rows instead of Arrow IPC",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    p = sub.add_parser(
        "subscribe",
        help="follow a stream no procedure consumes: its batches as JSON lines",
        description="Prints the committed batches of STREAM in timestamp order, one JSON object per line, "
        '{"ts": T, "rows": [{column: value, ...}, ...]} (T: the timestamp of the command that emitted them), '
        "and follows the stream live until --batches were printed or Ctrl-C. Resume after the last T "
        "printed with --from-ts T+1.",
    )
    p.add_argument("stream", metavar="STREAM", help="a stream no procedure consumes")
    p.add_argument(
        "--from-ts", type=int, default=0, help="first timestamp to print (default 0: the oldest the server keeps)"
    )
    p.add_argument(
        "--batches", "-n", type=int, default=0, help="stop after this many batches (default 0: follow until Ctrl-C)"
    )

    sub.add_parser(
        "status",
        help="show server version, partitions, catalog and counters",
        description="Prints the server status: version, executor, partitions, catalog objects and counters.",
    )

    p = sub.add_parser(
        "cluster",
        help="cluster mode: the hosts, the input log's position and copies, and each host's lag",
        description="Reads the cluster's state from NATS itself (not from a host, so it answers while hosts are "
        "down): the JetStream stream holding the input log (entries, first and last position, copies and their "
        "lag), every host that announced itself (the last entry it applied, how far behind the log it is, when "
        "it was last heard from), and the snapshots the hosts shared (a host behind the log's start installs the "
        "newest).",
    )
    p.add_argument(
        "verb",
        choices=["status", "verify"],
        help="status: print the cluster's state; verify: append a `verify` entry to the log, at which every host "
        "puts a digest of its tables, and compare them (exit 1 if hosts differ, 2 if a live host did not answer)",
    )
    p.add_argument("--wait", type=float, default=30.0, help="verify: seconds to wait for the hosts (default 30)")
    p.add_argument("--cluster", required=True, metavar="URLS", help="the NATS servers, as `serve --cluster`")
    p.add_argument("--cluster-log", default="main", metavar="NAME", help="the cluster's name (default: main)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")

    sub.add_parser(
        "checkpoint",
        help="take an online checkpoint of every partition now (admin)",
        description="Asks the server for a consistent checkpoint of all partitions at one point of the command "
        "order, written while it keeps serving; log records it covers are deleted. Prints where each went.",
    )

    p = sub.add_parser(
        "rebalance",
        help="move bins between partitions, or add or retire partitions, while the server runs (admin)",
        description="Moves bins (bin = hash(key) mod --bins of the server) to other partitions in steps at "
        "logical times, each atomic and durable, while the server keeps serving: commands behind a step wait "
        "for that step only; --to-partitions adds or retires partition workers the same way. Shows progress on "
        "stderr and prints the final map as a JSON line.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--move",
        action="append",
        default=[],
        metavar="FIRST[-LAST]:P",
        help="bins FIRST..LAST (inclusive) go to partition P; repeatable",
    )
    what.add_argument("--even", action="store_true", help="as many bins on every partition as can be")
    what.add_argument(
        "--to-partitions",
        type=int,
        metavar="N",
        help="grow or shrink the server to N partitions (worker processes), bins spread evenly over them",
    )
    what.add_argument(
        "--resume",
        action="store_true",
        help="finish the migration that stopped before its target (status shows it), with its strategy "
        "unless --strategy is given",
    )
    p.add_argument(
        "--strategy",
        choices=("all-at-once", "fluid", "batched"),
        help="one step; one bin per step; --bins-per-step bins per step (default all-at-once)",
    )
    p.add_argument("--bins-per-step", type=int, help="bins a batched step moves (default 16)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    sub.add_parser(
        "health",
        help="exit 0 if the server reports SERVING on the standard gRPC health service",
        description="Asks the grpc.health.v1 service for streamtx.v1.StreamTx (for container health checks): "
        "prints the status; exit 0 when SERVING, 1 otherwise or when unreachable.",
    )

    p = sub.add_parser(
        "top",
        help="a live view of the server: per partition, rates, TE latency, CPU busy, queues",
        description="Polls Status every --interval seconds and shows, per partition, whether it serves, its "
        "queued commands, batches committed and rejected and TEs aborted per second, TE run time p50/p99 "
        "over the last interval, CPU busy; then the streams, and the rows of each table. Ctrl-C quits.",
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default %(default)s)")
    p.add_argument(
        "--once", action="store_true", help="print one frame (rates over one --interval) and exit, no live view"
    )

    defaults = ServerConfig()
    p = sub.add_parser(
        "serve",
        help="run a server (one partition per core by default)",
        description="Runs a streamtx server in the foreground until interrupted. With no "
        f"flags: {defaults.partitions} partition(s) (one per core) on {defaults.host}:{defaults.port}, data in "
        f"./{defaults.data_dir}.",
    )
    add_arguments(p)
    p = sub.add_parser(
        "config",
        help="print the settings a `streamtx serve` with these flags would run with",
        description="Prints the effective server settings as TOML (the format of `serve --config`): the "
        "defaults, over them a --config file, over it the flags given. The token is never printed.",
    )
    p.add_argument("action", choices=["show"], help="show: print the settings")
    add_arguments(p)

    for name, helptext in (
        ("demo", "run the voter leaderboard demo (arguments are passed on; try 'demo --help')"),
        ("bench", "run benchmarks (arguments are passed on; try 'bench --help')"),
    ):
        sub.add_parser(name, help=helptext, description=helptext, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `streamtx` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    split = _forwarded_split(argv)
    if split is not None:  # demo/bench: their arguments go through untouched, in order
        parser.parse_args(argv[: split + 1])
        return _run_forwarded(argv[split], argv[split + 1 :])
    args = parser.parse_args(argv)
    handler = _COMMANDS[args.command]
    try:
        return handler(args)
    except StreamTxError as e:
        print(f"error: {e.code.name}: {e.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# -- helpers -----------------------------------------------------------------------

_FORWARDED = ("demo", "bench")
_GLOBAL_WITH_VALUE = ("--target", "--token", "--tls-ca", "--tls-cert", "--tls-key")


def _forwarded_split(argv: Sequence[str]) -> int | None:
    """Index of a demo/bench subcommand in argv (after the global options), else None."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _GLOBAL_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return i if arg in _FORWARDED else None
    return None


class _Version(argparse.Action):
    """`--version`: reads the package's metadata only when asked, not on every start of the server."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **_: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from streamtx import __version__

        print(f"streamtx {__version__}")
        parser.exit()


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The global --token and --tls-* options, as the clients take them; unreadable files are InvalidArgument."""
    from streamtx.client.async_client import channel_credentials
    from streamtx.errors import InvalidArgument

    tls = {"tls_ca": args.client_tls_ca, "tls_cert": args.client_tls_cert, "tls_key": args.client_tls_key}
    try:
        channel_credentials(**tls)
    except ValueError as e:
        raise InvalidArgument(f"{e} (--tls-ca, --tls-cert, --tls-key)") from None
    return {"token": args.token, **tls}


def parse_value(text: str) -> int | float | str:
    """A command-line parameter value: int if it parses, then float, else the string."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_params(items: Sequence[str]) -> dict[str, int | float | str]:
    """NAME=VALUE pairs into a dict; a malformed pair is an InvalidArgument."""
    from streamtx.errors import InvalidArgument

    params: dict[str, int | float | str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidArgument(f"parameter {item!r} is not NAME=VALUE")
        params[name] = parse_value(value)
    return params


def result_table(result: Result, title: str | None = None, max_rows: int = 1000) -> Table:
    """A rich Table for a Result (NULLs shown as NULL, long results truncated)."""
    from rich.table import Table

    arrow = result.arrow()
    table = Table(title=title, show_lines=False)
    for field in arrow.schema:
        justify = "right" if _is_numeric(field.type) else "left"
        table.add_column(f"{field.name}\n[dim]{field.type}[/dim]", justify=justify)
    shown = arrow.slice(0, max(0, max_rows))
    for row in zip(*(col.to_pylist() for col in shown.columns), strict=True):
        table.add_row(*("[dim]NULL[/dim]" if v is None else _escape(str(v)) for v in row))
    n = arrow.num_rows
    more = n - shown.num_rows
    caption = f"{n} row{'s' if n != 1 else ''}"
    table.caption = f"{caption} ({more} not shown)" if more else caption
    return table


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _is_numeric(t: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def read_table(path: Path, fmt: str | None = None) -> pa.Table:
    """Reads a CSV/TSV, Parquet or JSON-lines file into an Arrow table."""
    from streamtx.errors import InvalidArgument

    fmt = fmt or _FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InvalidArgument(f"{path}: unknown file type {path.suffix!r}; use --format csv|tsv|parquet|json")
    if not path.exists():
        raise InvalidArgument(f"{path}: no such file")
    try:
        if fmt in ("csv", "tsv"):
            import pyarrow.csv as pacsv

            parse = pacsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",")
            return pacsv.read_csv(path, parse_options=parse)
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
        import pyarrow.json as pajson

        return pajson.read_json(path)
    except (OSError, ValueError) as e:  # ArrowInvalid is a ValueError
        raise InvalidArgument(f"{path}: cannot read as {fmt}: {e}") from None


# -- commands ------------------------------------------------------------------------


def _cmd_deploy(args: argparse.Namespace) -> int:
    from streamtx.client import Client
    from streamtx.errors import InvalidArgument

    try:
        sql = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except OSError as e:
        raise InvalidArgument(f"{args.file}: {e.strerror or e}") from None
    with Client(args.target, **_client_kwargs(args)) as c:
        result = c.deploy(sql)
    console = _console()
    for kind, name in result.created:
        console.print(f"[green]created[/green] {kind} {_escape(name)}")
    for kind, name in result.dropped:
        console.print(f"[red]dropped[/red] {kind} {_escape(name)}")
    if not result.created and not result.dropped:
        console.print("nothing changed")
    return EXIT_OK


def _cmd_sql(args: argparse.Namespace) -> int:
    from streamtx.client import Client

    params = parse_params(args.param)
    with Client(args.target, **_client_kwargs(args)) as c:
        result = c.query(args.query, params or None)
    _console().print(result_table(result, max_rows=args.max_rows))
    return EXIT_OK


def _cmd_call(args: argparse.Namespace) -> int:
    from streamtx.client import Client

    params = parse_params(args.param)
    with Client(args.target, **_client_kwargs(args)) as c:
        results = c.call(args.procedure, **params)
    console = _console()
    if not results:
        console.print(f"{args.procedure}: ok (no results)")
    for i, result in enumerate(results):
        title = f"result {i + 1}" if len(results) > 1 else None
        console.print(result_table(result, title=title, max_rows=args.max_rows))
    return EXIT_OK


def _cmd_subscribe(args: argparse.Namespace) -> int:
    from streamtx.client import Client

    printed = 0
    with (
        Client(args.target, **_client_kwargs(args)) as c,
        contextlib.closing(c.subscribe(args.stream, from_ts=args.from_ts)) as batches,
    ):
        for ts, rows in batches:  # values JSON has no type for (dates, decimals, ...) print as text
            print(json.dumps({"ts": ts, "rows": rows.to_pylist()}, default=str), flush=True)
            printed += 1
            if printed == args.batches:
                break
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace) -> int:
    from streamtx.client import Client

    with Client(args.target, **_client_kwargs(args)) as c:
        plans = c.explain(args.name)
    console = _console()
    for p in plans:
        how = "[green]compiled[/green]" if p.compiled else "[yellow]DuckDB[/yellow]"
        console.print(f"[bold]{p.unit} statement {p.index + 1}[/bold] ({how}): {p.sql}", highlight=False)
        detail = p.plan if p.compiled else p.reason
        for line in detail.splitlines():
            console.print(f"    {line}", highlight=False, markup=False)
    return EXIT_OK


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    from streamtx.client import Client

    with Client(args.target, **_client_kwargs(args)) as c:
        done = c.checkpoint()
    print(f"checkpoint at timestamp {done.get('timestamp', 0)}:")
    for part in done.get("partitions", []):
        print(f"  partition {part.get('partition', 0)}: {part['path']} (log records through lsn {part.get('lsn', 0)})")
    return EXIT_OK


def parse_moves(specs: list[str]) -> list[tuple[int, int, int]]:
    """`FIRST[-LAST]:P` bin moves as (first, last, partition); a malformed one is InvalidArgument naming it."""
    from streamtx.errors import InvalidArgument

    moves = []
    for spec in specs:
        bins, _, partition = spec.partition(":")
        first, _, last = bins.partition("-")
        try:
            moves.append((int(first), int(last or first), int(partition)))
        except ValueError:
            raise InvalidArgument(f"--move {spec!r}: expected FIRST[-LAST]:PARTITION, e.g. 0-255:1") from None
    return moves


def _cmd_rebalance(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from streamtx.client import Client

    moves = parse_moves(args.move)
    progress = Progress(
        TextColumn("[bold]rebalance"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("bins, step {task.fields[step]}/{task.fields[steps]}, {task.fields[rows]:,} rows moved"),
        TimeElapsedColumn(),
        console=_console(stderr=True),
        disable=args.quiet,
    )
    last: dict[str, Any] = {}
    with Client(args.target, **_client_kwargs(args)) as c, progress:
        task = None
        steps = c.rebalance(
            moves,
            even=args.even,
            strategy=args.strategy,
            bins_per_step=args.bins_per_step,
            resume=args.resume,
            partitions=args.to_partitions,
        )
        for last in steps:
            if task is None:
                task = progress.add_task("rebalance", total=last.get("bins_total", 0), step=0, steps=0, rows=0)
            progress.update(
                task,
                completed=last.get("bins_moved", 0),
                step=last.get("step", 0),
                steps=last.get("steps", 0),
                rows=last.get("rows_moved", 0),
            )
    keys = ("steps", "bins_moved", "rows_moved", "elapsed_seconds", "timestamp", "bins_per_partition")
    print(json.dumps({k: last.get(k, 0) for k in keys}))
    return EXIT_OK


def _cmd_cluster(args: argparse.Namespace) -> int:
    from rich.table import Table

    from streamtx.errors import StreamTxError
    from streamtx.server.cluster.inputlog import InputLog

    async def read() -> dict:
        inputlog = InputLog(args.cluster, args.cluster_log, 1)
        try:
            await inputlog.open(timeout=10.0, create=False)
            if args.verb == "verify":
                seq = (await (await inputlog.append("verify", b"", ""))).seq
                reports = await inputlog.reports(seq, args.wait)
                missing = sorted(await inputlog.live_hosts() - set(reports))
                return {"position": seq, "hosts": reports, "missing": missing}
            return await inputlog.status()
        finally:
            await inputlog.close()

    try:
        status = asyncio.run(read())
    except StreamTxError as e:
        print(f"streamtx cluster: {e.message}", file=sys.stderr)
        return 1
    if args.verb == "verify":
        return _cluster_verified(status, args.json)
    if args.json:
        print(json.dumps(status))
        return 0
    console = _console()
    info = status["log"]
    summary = Table(title=f"cluster log {info['stream']}", show_header=False)
    summary.add_column("key", style="bold")
    summary.add_column("value")
    if info["entries"]:
        held = f"{info['entries']:,} (positions {info['first']:,} to {info['last']:,}, {info['bytes']:,} bytes)"
    else:
        held = f"0 (the {info['last']:,} so far trimmed)" if info["last"] else "0"
    summary.add_row("entries", held)
    beside = info.get("beside", {})
    if beside.get("bodies"):
        summary.add_row("bodies beside the log", f"{beside['bodies']:,} ({beside['bytes']:,} bytes)")
    copies = ", ".join(
        f"{c['name']}{' (leader)' if c['leader'] else ''}{'' if c['current'] else ' behind'}" for c in info["copies"]
    )
    summary.add_row("replicas", f"{info['replicas']}: {copies or '-'}")
    console.print(summary)
    hosts = Table(title="hosts")
    for column in ("host", "address", "applied", "lag", "partitions", "serving", "last heard"):
        hosts.add_column(column, justify="right" if column in ("applied", "lag", "partitions") else "left")
    for h in status["hosts"]:
        hosts.add_row(
            _escape(h["host"]),
            _escape(h.get("address", "")),
            f"{h.get('applied', 0):,}",
            f"{h['lag']:,}",
            str(h.get("partitions", "")),
            "yes" if h.get("serving") else "no",
            f"{h['seen_seconds_ago']:g} s ago",
        )
    console.print(hosts)
    if status["snapshots"]:
        shots = Table(title="snapshots (a host behind the log's start installs the newest)")
        for column in ("host", "position", "partitions", "bytes", "taken"):
            shots.add_column(column, justify="left" if column in ("host", "taken") else "right")
        for s in status["snapshots"]:
            taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["time"]))
            shots.add_row(_escape(s["host"]), f"{s['position']:,}", str(s["partitions"]), f"{s['bytes']:,}", taken)
        console.print(shots)
    return 0


def _cluster_verified(result: dict, as_json: bool) -> int:
    """Prints the hosts' digests at one log position; 0 all equal, 1 some differ, 2 none or some missing."""
    from streamtx.server.cluster.digest import differences

    reports, seq = result["hosts"], result["position"]
    different = differences(reports)
    if as_json:
        print(json.dumps({**result, "differences": different}))
    else:
        for host, r in sorted(reports.items()):
            tables = ", ".join(f"{t} {n:,}" for t, (n, _) in sorted(r["tables"].items()))
            print(f"{host}: state {r['state']} at log position {seq} (rows: {tables or 'no tables'})")
        for line in different:
            print(f"DIFFERENT: {line}", file=sys.stderr)
        for host in result["missing"]:
            print(f"NO ANSWER: host {host} is live but put no digest at {seq}", file=sys.stderr)
    if different:
        return 1
    return 2 if result["missing"] or not reports else 0


def _cmd_status(args: argparse.Namespace) -> int:
    from rich.table import Table

    from streamtx.client import Client

    with Client(args.target, **_client_kwargs(args)) as c:
        status = c.status()
    console = _console()

    summary = Table(title="server", show_header=False)
    summary.add_column("key", style="bold")
    summary.add_column("value")
    summary.add_row("target", _escape(args.target))
    summary.add_row("version", str(status.get("version", "")))
    summary.add_row("executor", str(status.get("executor", "")))
    summary.add_row("last timestamp", str(status.get("last_timestamp", "")))
    owned = status.get("bins_per_partition") or []
    summary.add_row("bins per partition", " ".join(f"{i}:{n}" for i, n in enumerate(owned)) or "[dim]-[/dim]")
    routed = status.get("keys_per_partition") or []
    if routed:
        summary.add_row("keys per partition", " ".join(f"{i}:{n:,}" for i, n in enumerate(routed)) + " (last window)")
    moving = status.get("rebalancing") or {}
    if moving.get("steps"):
        summary.add_row(
            "rebalancing",
            f"step {moving.get('step', 0)}/{moving.get('steps', 0)}, {moving.get('bins_moved', 0)}/"
            f"{moving.get('bins_total', 0)} bins, {moving.get('rows_moved', 0):,} rows moved",
        )
    stopped = status.get("rebalance_interrupted") or {}
    if stopped.get("bins_left"):
        summary.add_row(
            "rebalance interrupted",
            f"{stopped['bins_left']} bins still to move ({stopped.get('strategy', '')}); "
            "`streamtx rebalance --resume` finishes it",
        )
    for kind in ("tables", "views", "indexes", "streams", "windows", "procedures", "triggers", "groups"):
        names = status.get(kind) or []
        summary.add_row(kind, _escape(", ".join(names)) if names else "[dim]-[/dim]")
    console.print(summary)

    partitions = status.get("partitions") or []
    if partitions:
        pt = Table(title="partitions")
        for col in ("id", "pid", "alive", "queued", "error"):
            pt.add_column(col, justify="right" if col in ("id", "pid", "queued") else "left")
        for p in partitions:
            alive = "[green]yes[/green]" if p.get("alive") else "[red]no[/red]"
            pt.add_row(
                str(p.get("id", "")),
                str(p.get("pid", "")),
                alive,
                str(p.get("queued", "")),
                _escape(str(p.get("error", ""))),
            )
        console.print(pt)

    counters = status.get("counters") or {}
    if counters:
        ct = Table(title="counters")
        ct.add_column("counter")
        ct.add_column("value", justify="right")
        for name in sorted(counters):
            ct.add_row(_escape(name), f"{counters[name]:,}")
        console.print(ct)
    return EXIT_OK


def _cmd_top(args: argparse.Namespace) -> int:
    from streamtx.client import Client
    from streamtx.errors import InvalidArgument

    if args.interval <= 0:
        raise InvalidArgument("--interval must be > 0")
    with Client(args.target, **_client_kwargs(args)) as c:
        before = c.status()
        at = time.monotonic()
        if args.once:
            time.sleep(args.interval)
            now = c.status()
            _console().print(top_view(args.target, now, before, time.monotonic() - at))
            return EXIT_OK
        from rich.live import Live

        try:
            with Live(top_view(args.target, before, None, 0.0), console=_console(), auto_refresh=False) as live:
                while True:
                    time.sleep(args.interval)
                    now, taken = c.status(), time.monotonic()
                    live.update(top_view(args.target, now, before, taken - at), refresh=True)
                    before, at = now, taken
        except KeyboardInterrupt:  # how one leaves it
            return EXIT_OK


def quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float | None:
    """The `q` quantile of a histogram (per-bucket counts, the last above every bound), as Prometheus'
    histogram_quantile estimates it: linear within the bucket; None without observations."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(bounds):
                return float(bounds[-1]) if bounds else None
            low = bounds[i - 1] if i else 0.0
            return low + (bounds[i] - low) * (rank - seen) / n
        seen += n
    return float(bounds[-1]) if bounds else None


def _te_counts(partition: dict[str, Any]) -> tuple[list[float], list[int]]:
    """A partition's TE run-time histogram over all its procedures: bounds, per-bucket counts."""
    bounds: list[float] = []
    counts: list[int] = []
    for proc in (partition.get("metrics") or {}).get("procedures") or []:
        h = proc.get("te_seconds") or {}
        if not bounds:
            bounds, counts = list(h.get("bounds") or []), [0] * len(h.get("counts") or [])
        for i, n in enumerate(h.get("counts") or []):
            if i < len(counts):
                counts[i] += n
    return bounds, counts


def top_view(target: str, now: dict[str, Any], before: dict[str, Any] | None, seconds: float) -> Group:
    """One frame of `streamtx top`: `now`, with rates over the `seconds` since `before` (None: totals only)."""
    from rich.console import Group
    from rich.table import Table

    counters = now.get("counters") or {}
    old_counters = (before or {}).get("counters") or {}
    old_parts = {p.get("id", 0): p for p in (before or {}).get("partitions") or []}

    def rate(new: float, old: float | None) -> str:
        if before is None or seconds <= 0 or old is None:
            return "[dim]-[/dim]"
        return f"{max(new - old, 0) / seconds:,.1f}"

    def ms(value: float | None) -> str:
        return "[dim]-[/dim]" if value is None else f"{value * 1000:,.3g} ms"

    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"[bold]streamtx top[/bold] {_escape(target)}",
        f"version {_escape(str(now.get('version', '')))}",
        f"executor {_escape(str(now.get('executor', '')))}",
        f"last timestamp [bold]{now.get('last_timestamp', 0):,}[/bold]",
        f"every {seconds:.1f} s" if before is not None else "",
    )

    parts = Table(title="partitions", title_justify="left")
    columns = ("partition", "alive", "queued", "committed/s", "rejected/s", "aborted/s", "TE p50", "TE p99")
    for col in (*columns, "CPU busy", "committed", "log"):
        parts.add_column(col, justify="left" if col == "alive" else "right")
    for p in now.get("partitions") or []:
        i = p.get("id", 0)
        m = p.get("metrics") or {}
        old = old_parts.get(i)
        old_m = (old or {}).get("metrics") or {}
        alive = "[green]yes[/green]" if p.get("alive") and not p.get("error") else "[red]no[/red]"
        if p.get("error"):
            alive += f" [dim]{_escape(str(p['error']))}[/dim]"
        committed = counters.get(f"partition{i}.committed", 0)
        rejected = counters.get(f"partition{i}.rejected", 0)
        aborted = sum(x.get("tes_aborted", 0) for x in m.get("procedures") or [])
        old_aborted = sum(x.get("tes_aborted", 0) for x in old_m.get("procedures") or []) if old else None
        bounds, counts = _te_counts(p)
        if old is not None:  # the TEs of the last interval, when there were some; else since the start
            _, old_counts = _te_counts(old)
            recent = [n - o for n, o in zip(counts, old_counts, strict=False)] if old_counts else counts
            if len(recent) == len(counts) and sum(recent) > 0 and min(recent) >= 0:
                counts = recent
        cpu = m.get("cpu_seconds", 0.0)
        busy = "[dim]-[/dim]"
        if old is not None and seconds > 0 and "cpu_seconds" in old_m:
            busy = f"{max(cpu - old_m['cpu_seconds'], 0) / seconds:.0%}"
        parts.add_row(
            str(i),
            alive,
            f"{p.get('queued', 0):,}",
            rate(committed, old_counters.get(f"partition{i}.committed", 0) if old is not None else None),
            rate(rejected, old_counters.get(f"partition{i}.rejected", 0) if old is not None else None),
            rate(aborted, old_aborted),
            ms(quantile(0.5, bounds, counts)),
            ms(quantile(0.99, bounds, counts)),
            busy,
            f"{committed:,}",
            _size(m.get("log_bytes", 0)),
        )

    tables: dict[str, int] = {}
    for name, n in counters.items():
        head_, _, rest = name.partition(".")
        if head_.startswith("partition") and rest.startswith("rows."):
            tables[rest[len("rows.") :]] = tables.get(rest[len("rows.") :], 0) + n
    rows = Table(title="tables", title_justify="left")
    rows.add_column("table")
    rows.add_column("rows", justify="right")
    for name in sorted(tables):
        rows.add_row(_escape(name), f"{tables[name]:,}")

    streams = Table(title="streams", title_justify="left")
    for col in ("stream", "committed/s", "committed", "rejected", "duplicate", "rows"):
        streams.add_column(col, justify="left" if col == "stream" else "right")
    old_streams = {s.get("stream"): s for s in (before or {}).get("stream_metrics") or []}
    for s in now.get("stream_metrics") or []:
        old_s = old_streams.get(s.get("stream"))
        streams.add_row(
            _escape(str(s.get("stream", ""))),
            rate(s.get("committed", 0), old_s.get("committed", 0) if old_s else (0 if before else None)),
            f"{s.get('committed', 0):,}",
            f"{s.get('rejected', 0):,}",
            f"{s.get('duplicate', 0):,}",
            f"{s.get('rows', 0):,}",
        )
    return Group(head, parts, rows, streams)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GiB"


def _cmd_push(args: argparse.Namespace) -> int:
    from streamtx.errors import InvalidArgument

    if args.batch_size < 1:
        raise InvalidArgument("--batch-size must be >= 1")
    if args.max_in_flight < 1:
        raise InvalidArgument("--max-in-flight must be >= 1")
    table = read_table(args.file, args.format)
    counts, rejected = asyncio.run(_push_table(args, table))
    console = _console()
    total = sum(counts.values())
    console.print(
        f"{args.stream}: {total} batch(es), {table.num_rows} row(s): "
        f"[green]{counts['committed']} committed[/green], "
        f"[yellow]{counts['duplicate']} duplicate[/yellow], "
        f"[red]{counts['rejected']} rejected[/red]"
    )
    for r in rejected[:5]:
        code = r.code.name if r.code is not None else "UNKNOWN"
        console.print(f"  batch {r.batch_id} rejected: {code}: {_escape(r.reason)}")
    if len(rejected) > 5:
        console.print(f"  ... and {len(rejected) - 5} more rejected batch(es)")
    return EXIT_REJECTED if counts["rejected"] else EXIT_OK


async def _push_table(args: argparse.Namespace, table: pa.Table) -> tuple[Counter[str], list[Any]]:
    """Pushes `table` in slices over one pipelined stream, updating a progress bar."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from streamtx.client import AsyncClient, PushResult

    counts: Counter[str] = Counter({"committed": 0, "duplicate": 0, "rejected": 0})
    rejected: list[PushResult] = []
    n = table.num_rows
    size = args.batch_size
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rows"),
        TextColumn("{task.fields[batches]} batches, {task.fields[rate]} batches/s"),
        TimeElapsedColumn(),
        console=_console(stderr=True),
        disable=args.quiet,
    )
    started = time.perf_counter()
    futures: list[asyncio.Future[PushResult]] = []
    async with AsyncClient(
        args.target,
        **_client_kwargs(args),
        producer_id=args.producer_id,
        max_in_flight=args.max_in_flight,
        arrow=not args.protobuf,
    ) as client:
        with progress:
            task = progress.add_task(args.stream, total=n, batches=0, rate="0")

            def on_ack(fut: asyncio.Future[PushResult], rows: int) -> None:
                if fut.cancelled() or fut.exception() is not None:
                    return
                result = fut.result()
                counts[result.outcome] += 1
                if result.outcome == "rejected":
                    rejected.append(result)
                done = sum(counts.values())
                elapsed = max(time.perf_counter() - started, 1e-9)
                progress.update(task, advance=rows, batches=done, rate=f"{done / elapsed:,.0f}")

            for i, offset in enumerate(range(0, n, size)):
                chunk = table.slice(offset, size)
                fut = await client.push(args.stream, chunk, batch_id=args.first_batch_id + i)
                fut.add_done_callback(lambda f, rows=chunk.num_rows: on_ack(f, rows))
                futures.append(fut)
            settled = await asyncio.gather(*futures, return_exceptions=True)
    for r in settled:
        if isinstance(r, BaseException):
            raise r
    return counts, rejected


def _cmd_serve(args: argparse.Namespace) -> int:
    from streamtx.errors import InvalidArgument
    from streamtx.server import security
    from streamtx.server.config import from_args

    try:
        config = from_args(args)
        security.check(config)  # the TLS files and tokens, before the data directory is touched
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
    from streamtx.server.launch import launch

    # the workers start importing while this process imports the front; in cluster mode the host may have to
    # install a snapshot first (server/cluster/snapshots.py), so they start later
    launched = launch(config) if config.cluster is None else None
    from streamtx.server.serve import Behind, serve

    try:
        serve(config, launched)
    except Behind as e:
        # everything is stopped and the data directory unlocked: the same command again installs a snapshot
        print(f"streamtx: {e}; starting again", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "streamtx", *sys.argv[1:]])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_OK)  # everything is stopped and closed; skips ≈ 0.2 s of interpreter teardown


def _cmd_config(args: argparse.Namespace) -> int:
    from streamtx.errors import InvalidArgument
    from streamtx.server.config import from_args, to_toml

    try:
        config = from_args(args)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
    sys.stdout.write(to_toml(config))
    return EXIT_OK


def _run_forwarded(command: str, argv: list[str]) -> int:
    """Runs `streamtx demo|bench ...` by handing the remaining arguments to their main()."""
    module = "streamtx.procedures.voter.demo" if command == "demo" else "streamtx.bench"
    try:
        sub_main = importlib.import_module(module).main
    except (ImportError, AttributeError) as e:
        print(f"error: UNIMPLEMENTED: streamtx {command} is not available ({e})", file=sys.stderr)
        return EXIT_ERROR
    try:
        code = sub_main(argv)
    except StreamTxError as e:
        print(f"error: {e.code.name}: {e.message}", file=sys.stderr)
        return EXIT_ERROR
    return int(code or 0)


def _cmd_health(args: argparse.Namespace) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from streamtx.client.async_client import channel_credentials

    try:
        credentials = channel_credentials(args.client_tls_ca, args.client_tls_cert, args.client_tls_key)
    except (OSError, ValueError) as e:
        print(f"{args.target}: {e}", file=sys.stderr)
        return 1
    if credentials is None:
        channel = grpc.insecure_channel(args.target)
    else:
        channel = grpc.secure_channel(args.target, credentials)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="streamtx.v1.StreamTx"), timeout=5
            )
        except grpc.RpcError as e:
            print(f"{args.target}: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    state = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.target}: {state}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


_COMMANDS = {
    "deploy": _cmd_deploy,
    "sql": _cmd_sql,
    "call": _cmd_call,
    "explain": _cmd_explain,
    "subscribe": _cmd_subscribe,
    "push": _cmd_push,
    "status": _cmd_status,
    "checkpoint": _cmd_checkpoint,
    "cluster": _cmd_cluster,
    "rebalance": _cmd_rebalance,
    "health": _cmd_health,
    "top": _cmd_top,
    "serve": _cmd_serve,
    "config": _cmd_config,
}


if __name__ == "__main__":
    sys.exit(main())
