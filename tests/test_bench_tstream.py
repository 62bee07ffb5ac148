"""`streamtx bench tstream`: flags, and `--quick` end to end (real servers, every workload module present)."""

from __future__ import annotations

import json

import pytest

from streamtx.bench import build_parser, main
from streamtx.bench.tstream import QUICK_INTERVALS, WORKLOADS, _first_difference, load_workload, sweep_path

RATIO_KEYS = {"benchmark", "ratio", "target", "numerator", "denominator", "met"}
CONFIG_KEYS = {
    "benchmark",
    "workload",
    "executor",
    "partitions",
    "events",
    "events_per_s",
    "batches_per_s",
    "latency_ms",
    "rounds",
    "events_per_s_rounds",
    "interval_size",
}


def present() -> list[str]:
    return [w for w in WORKLOADS if load_workload(w)[0] is not None]


def test_flags_and_defaults():
    args = build_parser().parse_args(["tstream"])
    assert args.workloads == WORKLOADS
    assert args.executors == ("serial", "opchain")
    assert args.partitions == (1,)
    assert (args.records, args.theta, args.max_in_flight) == (None, None, 512)  # None: the workload's own
    assert args.sweep is True and args.sweep_workload == ("sl",)
    args = build_parser().parse_args(
        ["tstream", "--workloads", "SL,gs", "--partitions", "2,1", "--no-sweep", "--intervals", "10,1"]
    )
    assert (args.workloads, args.partitions, args.sweep, args.intervals) == (("sl", "gs"), (1, 2), False, (1, 10))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tstream", "--workloads", "gs,nope"])


def test_first_difference_names_the_row():
    assert _first_difference({"t": [(1, 2)]}, {"t": [(1, 2)]}) == ""
    assert (
        _first_difference({"t": [(1, 2), (2, 3)]}, {"t": [(1, 2), (2, 4)]}) == "t[1]: server (2, 3), reference (2, 4)"
    )
    assert "rows" in _first_difference({"t": [(1, 2)]}, {"t": []})


@pytest.mark.slow  # ~40 s on an idle 2-core machine, 75 s at load 7: 4 workloads x 2 executors x 2 rounds + sweep
def test_bench_tstream_quick(tmp_path, capsys):
    workloads = present()
    if not workloads:
        pytest.skip("no TStream workload module is complete yet")
    png = tmp_path / "t.png"
    assert main(["tstream", "--quick", "--quiet", "--plot", str(png)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # every line is JSON
    assert lines and all(line["benchmark"] == "tstream" for line in lines)

    configs = [x for x in lines if "executor" in x and not x.get("sweep")]
    assert sorted((c["workload"], c["executor"]) for c in configs) == sorted(
        (w, e) for w in workloads for e in ("serial", "opchain")
    )
    for c in configs:
        assert CONFIG_KEYS <= c.keys()
        assert c["partitions"] == 1 and c["events"] > 0 and c["rounds"] == 2
        assert c["events_per_s"] > 0 and c["events_per_s"] == c["batches_per_s"]
        assert len(c["events_per_s_rounds"]) == 2
        assert 0 < c["latency_ms"]["p50"] <= c["latency_ms"]["p99"] <= c["latency_ms"]["max"]

    checks = [x for x in lines if "states_equal" in x]
    assert {x["workload"] for x in checks if not x.get("sweep")} == set(workloads)
    assert all(x["states_equal"] is True and x["outputs_equal"] is True for x in checks)

    sweep = [x for x in lines if x.get("sweep") and "executor" in x]
    if "sl" in workloads:
        assert sorted(x["interval_size"] for x in sweep) == list(QUICK_INTERVALS)
        assert all(x["workload"] == "sl" and x["executor"] == "opchain" and x["events_per_s"] > 0 for x in sweep)
        assert any(x.get("sweep") for x in checks)
        assert sweep_path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    ratios = [x for x in lines if "ratio" in x]
    assert sorted(r["workload"] for r in ratios) == sorted(workloads)
    assert lines[-len(ratios) :] == ratios  # the ratio lines come last
    for r in ratios:
        assert RATIO_KEYS <= r.keys()
        assert r["target"] == 5.0 and r["ratio"] > 0
        assert "opchain" in r["numerator"] and "serial" in r["denominator"]

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
