"""`streamtx bench`: the shared helpers, and `bench push --quick` end to end (a real server)."""

from __future__ import annotations

import json
import math

import pytest

from streamtx.bench import build_parser, main
from streamtx.bench.common import (
    Measurement,
    Stopwatch,
    emit,
    interleave,
    latency_summary,
    median_round,
    plot_bars,
    plot_lines,
    ratio_line,
)

RATIO_KEYS = {"benchmark", "ratio", "target", "numerator", "denominator"}
CONFIG_KEYS = {
    "benchmark",
    "encoding",
    "rpc",
    "batch_rows",
    "batches",
    "rows_per_s",
    "batches_per_s",
    "latency_ms",
}


# -- common helpers ----------------------------------------------------------------------


def test_emit_writes_one_json_line_per_record(capsys):
    import numpy as np

    emit({"benchmark": "x", "n": np.int64(3), "v": np.float64(0.5), "bad": float("nan")})
    emit({"benchmark": "y"})
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x) for x in lines] == [
        {"benchmark": "x", "n": 3, "v": 0.5, "bad": None},
        {"benchmark": "y"},
    ]


def test_ratio_line_has_the_documented_keys():
    line = ratio_line("push", 2.5, 2, "arrow rows/s", "protobuf rows/s", batch_rows=10)
    assert line == {
        "benchmark": "push",
        "ratio": 2.5,
        "target": 2,
        "numerator": "arrow rows/s",
        "denominator": "protobuf rows/s",
        "met": True,
        "batch_rows": 10,
    }
    assert ratio_line("push", 1.0, 5, "a", "b")["met"] is False


def test_latency_summary_in_milliseconds():
    s = latency_summary([0.001] * 98 + [0.010, 0.020])
    assert s["p50"] == pytest.approx(1.0)
    assert 1.0 < s["p99"] <= 20.0
    assert s["max"] == pytest.approx(20.0)
    assert latency_summary([]) == {"p50": None, "p99": None, "max": None}


def test_stopwatch_and_measurement():
    with Stopwatch() as sw:
        pass
    assert sw.elapsed >= 0
    assert Measurement(elapsed=2.0, count=10).per_s == 5.0
    assert math.isinf(Measurement(elapsed=0.0, count=1).per_s)


def test_interleave_alternates_and_median_round_picks_a_whole_round():
    order = []

    def run(config, r):
        order.append((config, r))
        return {"a": [3, 1, 2], "b": [10, 30, 20]}[config][r]

    results = interleave(["a", "b"], run, rounds=3)
    assert order == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert results == [[3, 1, 2], [10, 30, 20]]
    assert median_round(results[0], key=float) == 2
    assert median_round([4, 1, 3, 2], key=float) == 2  # the lower median for an even count
    with pytest.raises(ValueError):
        interleave(["a"], run, rounds=0)


def test_plots_write_png(tmp_path):
    bars = plot_bars(tmp_path / "b.png", ["1", "100"], {"x": [1.0, 1e4], "y": [2.0, None]}, log=True)
    lines = plot_lines(tmp_path / "l.png", [1, 2, 3], {"x": [1, 2, 3]}, logy=True)
    for path in (bars, lines):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_verb_has_the_common_flags():
    parser = build_parser()
    args = parser.parse_args(["push", "--quick", "--plot", "x.png", "--quiet", "--rounds", "1"])
    assert (args.verb, args.quick, str(args.plot), args.quiet, args.rounds) == (
        "push",
        True,
        "x.png",
        True,
        1,
    )


def test_cli_forwards_bench_arguments(capsys):
    from streamtx.cli import main as cli_main

    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "push", "--help"])
    assert exc.value.code == 0
    assert "--quick" in capsys.readouterr().out


def test_bench_help_lists_every_verb(capsys):
    """argparse formats each verb's one-line help with %: a literal percent sign in one broke them all."""
    from streamtx.bench import VERBS
    from streamtx.cli import main as cli_main

    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(verb in out for verb in VERBS)


# -- bench push --quick, end to end --------------------------------------------------------


@pytest.mark.slow  # ~12 s on an idle 2-core machine, 20 s+ when it is shared
def test_bench_push_quick(tmp_path, capsys):
    png = tmp_path / "p.png"
    assert main(["push", "--quick", "--quiet", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    lines = [json.loads(line) for line in out.splitlines()]  # every line is JSON
    assert lines and all(line["benchmark"] == "push" for line in lines)

    configs = [line for line in lines if "encoding" in line]
    found = {(c["encoding"], c["rpc"], c["batch_rows"]) for c in configs}
    expected = {(e, r, n) for e in ("arrow", "protobuf") for r in ("stream", "unary") for n in (1, 100, 10_000)}
    assert found == expected
    assert len(configs) == len(expected)
    for c in configs:
        assert CONFIG_KEYS <= c.keys()
        assert c["rows_per_s"] > 0
        assert c["batches_per_s"] > 0
        assert c["rows_per_s"] == pytest.approx(c["batches_per_s"] * c["batch_rows"], rel=0.01)
        assert set(c["latency_ms"]) == {"p50", "p99", "max"}
        assert 0 < c["latency_ms"]["p50"] <= c["latency_ms"]["p99"] <= c["latency_ms"]["max"]

    ratios = [line for line in lines if "ratio" in line]
    assert len(ratios) == 2
    assert lines[-2:] == ratios  # the ratio lines come last
    for r in ratios:
        assert RATIO_KEYS <= r.keys()
        assert r["ratio"] > 0
    assert {r["batch_rows"] for r in ratios} == {1, 10_000}

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_voter_small_run_checks_every_server_against_the_reference(capsys):
    """Warm-up and timed rounds of all five servers, each checked against the reference after every run.

    A deletion every 7 votes falls inside 4-vote batches, so a server that took
    a batch's votes together rather than one at a time would fail the verb.
    """
    args = ["voter", "--quick", "--quiet", "--batch-sizes", "1,4", "--rounds", "1", "--batches", "10"]
    assert main([*args, "--state-batches", "150", "--delete-every", "7"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    measured = [x for x in lines if "mode" in x]
    assert {(x["mode"], x["batch_size"]) for x in measured} == {
        ("dataflow", 1),
        ("dataflow", 4),
        ("dataflow_duckdb", 1),
        ("dataflow_duckdb", 4),
        ("client_ordered", 1),
        ("client_ordered", 4),
        ("state", 1),
    }
    assert all(x["matches_reference"] and x["batches_per_s"] > 0 for x in measured)
    state = {x["executor"]: x for x in measured if x["mode"] == "state"}
    assert set(state) == {"serial", "opchain"} and all(x["batches"] == 150 for x in state.values())
    assert any(x.get("states_equal") for x in lines)
    last = lines[-1]
    assert RATIO_KEYS <= last.keys() and last["target"] == 5300.0 and last["matches_reference"]


def test_bench_growth_small_run_checks_each_level_against_the_reference(capsys):
    """Loaded votes, warm-up and a timed round per level, each checked net of what was loaded."""
    args = ["growth", "--quick", "--quiet", "--levels", "100,2000", "--batches", "40", "--rounds", "1"]
    assert main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    measured = [x for x in lines if "stored_votes" in x]
    assert [x["stored_votes"] for x in measured] == [100, 2000]
    assert all(x["matches_reference"] and x["batches_per_s"] > 0 and x["batches"] == 40 for x in measured)
    last = lines[-1]
    assert RATIO_KEYS <= last.keys() and last["target"] == 0.8 and last["levels"] == [100, 2000]


def test_bench_migration_small_run_moves_a_quarter_out_and_back_resizes_and_checks_every_count(tmp_path, capsys):
    png = tmp_path / "migration.png"
    args = ["migration", "--quick", "--quiet", "--keys", "3000", "--bins", "32", "--steady", "0.3", "--rate", "100"]
    assert main([*args, "--bins-per-step", "4", "--plot", str(png)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    runs = {line["strategy"]: line for line in lines if "strategy" in line}
    assert sorted(runs) == ["all-at-once", "batched", "fluid", "resize"]
    # resize: 16 bins each way, 4 steps of 4 and the step retiring (or adding) partition 1
    assert {s: r["steps"] for s, r in runs.items()} == {"all-at-once": 2, "fluid": 16, "batched": 4, "resize": 10}
    assert {s: r["bins_moved"] for s, r in runs.items()} == {"all-at-once": 8, "fluid": 8, "batched": 8, "resize": 16}
    assert all(r["matches_reference"] for r in runs.values())
    assert all(r["rows_moved"] > 0 for r in runs.values())
    assert all(0 < r["step_ms"]["p50"] <= r["step_ms"]["max"] for r in runs.values())  # each step's hold, timed
    ratios = [line for line in lines if "ratio" in line]
    assert [r["numerator"].split(",")[0] for r in ratios] == [
        "max ack latency while migrating",
        "batches/s acked while migrating",
    ]
    assert png.stat().st_size > 0


def test_a_broken_verb_does_not_take_the_others_down(monkeypatch, capsys):
    import streamtx.bench as bench

    monkeypatch.setitem(bench.VERBS, "broken", "streamtx.bench.no_such_module")
    args = bench.build_parser().parse_args(["push", "--quick"])
    assert args.verb == "push"
    assert bench.main(["broken", "--whatever"]) == 2
    assert "streamtx bench broken is not available" in capsys.readouterr().err


def test_bench_ipc_quick_echoes_every_row(tmp_path, capsys):
    plot = tmp_path / "ipc.png"
    assert main(["ipc", "--quick", "--quiet", "--messages", "500", "--plot", str(plot)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    configs, ratio = lines[:-1], lines[-1]
    assert {(r["rows"], r["mode"]) for r in configs} == {
        (rows, mode) for rows in (0, 1, 100, 10_000, 100_000) for mode in ("round trip", "pipelined")
    }
    assert all(r["messages_per_s"] > 0 for r in configs)
    assert RATIO_KEYS <= set(ratio) and ratio["benchmark"] == "ipc" and ratio["ratio"] > 0
    assert plot.stat().st_size > 0


def test_bench_skew_small_run_rebalances_the_hot_bins_and_checks_every_count(tmp_path, capsys):
    png = tmp_path / "skew.png"
    args = ["skew", "--quick", "--quiet", "--rounds", "1", "--batches", "60", "--rows", "50", "--hot-bins", "8"]
    assert main([*args, "--plot", str(png)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    runs = {line["placement"]: line for line in lines if "placement" in line}
    assert sorted(runs) == ["auto", "balanced", "skewed"]
    assert all(r["matches_reference"] and r["batches_per_s"] > 0 for r in runs.values())
    assert runs["skewed"]["hot_bins_on_partition_1"] == 0 and runs["balanced"]["hot_bins_on_partition_1"] == 4
    assert runs["auto"]["auto_rebalances"] >= 1 and 0 < runs["auto"]["hot_bins_on_partition_1"] < 8
    ratios = [line for line in lines if "ratio" in line]
    assert [(r["target"], RATIO_KEYS <= r.keys()) for r in ratios] == [(0.9, True), (1.0, True)]
    assert png.stat().st_size > 0


def test_bench_cluster_small_run_checks_every_host_against_the_reference(tmp_path, capsys):
    png = tmp_path / "cluster.png"
    args = ["cluster", "--quick", "--quiet", "--rounds", "1", "--batches", "100", "--appends", "200"]
    assert main([*args, "--plot", str(png)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    runs = {line["setup"]: line for line in lines if "votes_per_s" in line}
    assert list(runs) == ["standalone", "R1", "R3", "R3, 2 hosts"]
    assert all(r["matches_reference"] and r["votes_per_s"] > 0 for r in runs.values())
    assert len(runs["R3, 2 hosts"]["second_host_behind_s"]) == 1
    appends = [(a["log_replicas"], a["entry_bytes"]) for a in lines if a.get("setup") == "log appends"]
    assert appends == [(1, 64), (1, 6400), (3, 64), (3, 6400)]
    (catch_up,) = [line for line in lines if line.get("setup") == "catch-up"]  # both new hosts matched the reference
    assert set(catch_up["catch_up_s"]) == {"whole log", "snapshot + rest of the log"}
    assert catch_up["log_first_after_trim"] > 1 and catch_up["snapshot_bytes"] > 0
    ratios = [line for line in lines if "ratio" in line]
    assert [(r["target"], RATIO_KEYS <= r.keys()) for r in ratios] == [(0.8, True), (0.8, True)]
    assert png.stat().st_size > 0
