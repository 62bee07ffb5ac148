"""`streamtx bench VERB`: the benchmarks, one sub-command per verb.

Every verb prints JSON lines on stdout (one per configuration, then the ratio
lines) and progress on stderr; see docs/benchmarks.md. Adding a verb means
adding a module with

- `add_arguments(parser)`: its own flags (the common ones are added here),
- `run(args) -> list[dict]`: runs it and returns the lines to print,
- optionally `plot(records, path)`: draws the result for `--plot`,
- optionally `DEFAULT_ROUNDS`, `QUICK_ROUNDS`: interleaved rounds per run,

and one entry in `VERBS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from .common import emit, note

#: verb -> module implementing it (imported only when the verb runs or --help is built).
VERBS: dict[str, str] = {
    "push": "streamtx.bench.push",
    "voter": "streamtx.bench.voter",
    "growth": "streamtx.bench.growth",
    "triggers": "streamtx.bench.triggers",
    "tstream": "streamtx.bench.tstream",
    "partitions": "streamtx.bench.partitions",
    "spark": "streamtx.bench.spark",
    "ipc": "streamtx.bench.ipc",
    "recovery": "streamtx.bench.recovery",
    "overload": "streamtx.bench.overload",
    "migration": "streamtx.bench.migration",
    "skew": "streamtx.bench.skew",
    "cluster": "streamtx.bench.cluster",
}


def load(verb: str) -> ModuleType:
    """The module implementing `verb`."""
    return importlib.import_module(VERBS[verb])


def _summary(module: ModuleType) -> str:
    doc = (module.__doc__ or "").strip()
    return doc.splitlines()[0].rstrip(".") if doc else ""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_common_arguments(parser: argparse.ArgumentParser, module: ModuleType) -> None:
    """The flags every verb has."""
    group = parser.add_argument_group("common benchmark options")
    group.add_argument(
        "--quick",
        action="store_true",
        help="reduced run (under a minute) that prints the same lines",
    )
    group.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="draw the result into a PNG file",
    )
    default_rounds = getattr(module, "DEFAULT_ROUNDS", 3)
    quick_rounds = getattr(module, "QUICK_ROUNDS", 2)
    group.add_argument(
        "--rounds",
        type=_positive_int,
        default=None,
        help="interleaved rounds (A,B,A,B,...); each configuration reports its median round "
        f"(default {default_rounds}, {quick_rounds} with --quick)",
    )
    group.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress or notes on stderr (stdout carries only JSON lines either way)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamtx bench",
        description="Benchmarks. Each verb prints one JSON object per line on stdout: one per "
        "configuration (throughput, latency p50/p99/max, the configuration), then ratio lines "
        '{"benchmark", "ratio", "target", "numerator", "denominator", ...}. Progress goes to stderr.',
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        try:
            module = load(verb)
        except Exception as e:  # one broken verb must not take the others down
            sub.add_parser(verb, help=f"(unavailable: {type(e).__name__}: {e})")
            continue
        summary = _summary(module)
        p = sub.add_parser(verb, help=summary, description=(module.__doc__ or "").strip() or None)
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        module.add_arguments(p)
        add_common_arguments(p, module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one benchmark verb; returns the exit status (0 unless the arguments are wrong)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = next((a for a in argv if not a.startswith("-")), None)
    if verb in VERBS:
        try:
            load(verb)
        except Exception as e:
            print(
                f"error: UNIMPLEMENTED: streamtx bench {verb} is not available ({type(e).__name__}: {e})",
                file=sys.stderr,
            )
            return 2
    args = build_parser().parse_args(argv)
    module = load(args.verb)
    if args.rounds is None:
        args.rounds = getattr(module, "QUICK_ROUNDS" if args.quick else "DEFAULT_ROUNDS", 2 if args.quick else 3)
    records = module.run(args)
    for record in records:
        emit(record)
    if args.plot is not None:
        draw = getattr(module, "plot", None)
        if draw is None:
            note(f"bench {args.verb}: no plot for this verb", args.quiet)
        else:
            path = draw(records, args.plot)
            note(f"bench {args.verb}: plot written to {path}", args.quiet)
    return 0


__all__ = ["VERBS", "add_common_arguments", "build_parser", "load", "main"]
