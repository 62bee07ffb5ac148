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
    assert args.partitions == (1, 2)
    assert (args.mp_ratio, args.mp_length) == (0.25, 4)  # WORKLOADS.md: 25% of transactions touch 4 partitions
    assert (args.records, args.theta, args.max_in_flight) == (None, None, 512)  # None: the workload's own
    assert args.sweep is True and args.sweep_workload == ("sl",)
    args = build_parser().parse_args(
        ["tstream", "--workloads", "SL,gs", "--partitions", "2,1", "--no-sweep", "--intervals", "10,1"]
    )
    assert (args.workloads, args.partitions, args.sweep, args.intervals) == (("sl", "gs"), (1, 2), False, (1, 10))
    assert build_parser().parse_args(["tstream", "--mp-ratio", "1"]).mp_ratio == 1.0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tstream", "--workloads", "gs,nope"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tstream", "--mp-ratio", "1.5"])


def test_first_difference_names_the_row():
    assert _first_difference({"t": [(1, 2)]}, {"t": [(1, 2)]}) == ""
    assert (
        _first_difference({"t": [(1, 2), (2, 3)]}, {"t": [(1, 2), (2, 4)]}) == "t[1]: server (2, 3), reference (2, 4)"
    )
    assert "rows" in _first_difference({"t": [(1, 2)]}, {"t": []})


@pytest.mark.slow  # 4 workloads x 2 executors x P = 1, 2 x 2 rounds of 120 events + sweep
def test_bench_tstream_quick(tmp_path, capsys):
    workloads = present()
    if not workloads:
        pytest.skip("no TStream workload module is complete yet")
    png = tmp_path / "t.png"
    assert main(["tstream", "--quick", "--events", "120", "--quiet", "--plot", str(png)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # every line is JSON
    assert lines and all(line["benchmark"] == "tstream" for line in lines)

    configs = [x for x in lines if "executor" in x and not x.get("sweep")]
    assert sorted((c["workload"], c["executor"], c["partitions"]) for c in configs) == sorted(
        (w, e, p) for w in workloads for e in ("serial", "opchain") for p in (1, 2)
    )
    for c in configs:
        assert CONFIG_KEYS <= c.keys()
        assert c["events"] > 0 and c["rounds"] == 2
        assert c["mp_ratio"] == (0.25 if c["partitions"] == 2 else 0.0)
        assert c["events_per_s"] > 0 and c["events_per_s"] == c["batches_per_s"]
        assert len(c["events_per_s_rounds"]) == 2
        assert 0 < c["latency_ms"]["p50"] <= c["latency_ms"]["p99"] <= c["latency_ms"]["max"]

    checks = [x for x in lines if "states_equal" in x]
    assert sorted((x["workload"], x["partitions"]) for x in checks if not x.get("sweep")) == sorted(
        (w, p) for w in workloads for p in (1, 2)
    )
    assert all(x["states_equal"] is True and x["outputs_equal"] is True for x in checks)
    for x in checks:  # at P = 2 about a quarter of GS and SL events span both partitions; TP reports never do
        spanning = sum(x["coordinated_batches"].values())
        if x["partitions"] == 1 or x["workload"] == "tp":
            assert spanning == 0, x
        elif x["workload"] in ("gs", "sl"):
            assert spanning > 0.1 * sum(x["events"].values()), x

    sweep = [x for x in lines if x.get("sweep") and "executor" in x]
    if "sl" in workloads:
        assert sorted(x["interval_size"] for x in sweep) == list(QUICK_INTERVALS)
        assert all(x["workload"] == "sl" and x["executor"] == "opchain" and x["events_per_s"] > 0 for x in sweep)
        assert any(x.get("sweep") for x in checks)
        assert sweep_path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    ratios = [x for x in lines if "ratio" in x]
    assert sorted((r["workload"], r["partitions"]) for r in ratios) == sorted((w, p) for w in workloads for p in (1, 2))
    assert lines[-len(ratios) :] == ratios  # the ratio lines come last
    for r in ratios:
        assert RATIO_KEYS <= r.keys()
        assert r["target"] == 5.0 and r["ratio"] > 0
        assert "opchain" in r["numerator"] and "serial" in r["denominator"]

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
