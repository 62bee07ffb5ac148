"""`streamtx bench partitions`: the workload's batch builder, the flags, and `--quick` end to end (real servers)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from streamtx.bench import build_parser, main
from streamtx.bench.partitions import DEFAULT_SHARES, configurations
from streamtx.procedures.partitioned.app import BINS, expected_totals, sensor_batches, sensors_by_partition
from streamtx.server.partitioning import PartitionMap

RATIO_KEYS = {"benchmark", "ratio", "target", "numerator", "denominator", "met"}
CONFIG_KEYS = {
    "benchmark",
    "workload",
    "partitions",
    "batch_rows",
    "batches",
    "batches_per_s",
    "rows_per_s",
    "latency_ms",
    "rounds",
    "batches_per_s_rounds",
    "coordinated_batches",
    "cpu_ms_per_batch",
    "other_cores",
    "checked",
}


def test_batches_are_local_to_one_partition_or_span_two():
    pmap = PartitionMap.round_robin(2, BINS)
    batches = sensor_batches(40, 300, sensors=5_000, partitions=2, spanning_share=0.25, seed=3)
    owners = [np.unique(pmap.owners(b.column("sensor"))) for b in batches]
    spanning = [i for i, o in enumerate(owners) if len(o) > 1]
    assert len(spanning) == 10  # 25 % of 40, spread through the sequence
    assert spanning[0] == 0 and spanning[-1] == 39
    local = [int(o[0]) for o in owners if len(o) == 1]
    assert set(local) == {0, 1} and abs(local.count(0) - local.count(1)) <= 2  # both partitions get work
    assert all(b.num_rows == 300 for b in batches)
    ts = np.concatenate([b.column("ts").to_numpy() for b in batches])
    assert (np.diff(ts) > 0).all()


def test_sensors_by_partition_follows_the_partition_map():
    groups = sensors_by_partition(1_000, 2)
    assert sorted(np.concatenate(groups).tolist()) == list(range(1_000))
    pmap = PartitionMap.round_robin(2, BINS)
    for p, ids in enumerate(groups):
        assert (pmap.owners(pa.array(ids)) == p).all()


def test_expected_totals():
    a = pa.table({"sensor": [1, 2, 2], "ts": [0, 1, 2], "value": [0.5, 1.0, 2.0]})
    assert expected_totals([a, a]) == {"readings": 6, "value_sum": 7.0, "sensors": 2}


def test_flags_and_configurations():
    args = build_parser().parse_args(["partitions"])
    assert args.shares == DEFAULT_SHARES and args.batches is None and args.voter_batches is None
    args = build_parser().parse_args(["partitions", "--shares", "0.5,0.1", "--voter-batches", "0"])
    assert args.shares == (0.0, 0.1, 0.5)  # 0 % is always measured: the baseline of the sweep
    with pytest.raises(SystemExit):
        build_parser().parse_args(["partitions", "--shares", "2"])
    labels = [c.label for c in configurations(DEFAULT_SHARES, voter=True)]
    assert labels == [
        "sensors P=1",
        "sensors P=2 0% spanning",
        "sensors P=2 10% spanning",
        "sensors P=2 25% spanning",
        "sensors P=2 50% spanning",
        "voter P=1",
        "voter P=2",
    ]
    state = [c.label for c in configurations((0.0,), voter=False, state_voter=True, sql_voter=True)]
    assert state == [
        "sensors P=1",
        "sensors P=2 0% spanning",
        "voter-1 P=1",
        "voter-1 P=2",
        "voter-state P=1",
        "voter-state P=2",
    ]


@pytest.mark.slow  # ~40 s on an idle 2-core machine (eleven servers), 60 s+ when it is shared
def test_bench_partitions_quick(tmp_path, capsys):
    png = tmp_path / "p.png"
    assert main(["partitions", "--quick", "--quiet", "--plot", str(png), "--sql-votes", "400"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # every line is JSON
    assert lines and all(line["benchmark"] == "partitions" for line in lines)

    configs = [x for x in lines if "workload" in x and "batches_per_s" in x]
    found = [(c["workload"], c["partitions"], c.get("spanning_share")) for c in configs]
    assert found == [
        ("sensors", 1, 0.0),
        ("sensors", 2, 0.0),
        ("sensors", 2, 0.1),
        ("sensors", 2, 0.25),
        ("sensors", 2, 0.5),
        ("voter", 1, None),
        ("voter", 2, None),
        ("voter-1", 1, None),
        ("voter-1", 2, None),
        ("voter-state", 1, None),
        ("voter-state", 2, None),
    ]
    for c in configs:
        assert CONFIG_KEYS <= c.keys()
        assert c["checked"] is True  # the run's tables were verified (a wrong run fails the verb)
        assert c["rounds"] == 1 and len(c["batches_per_s_rounds"]) == 1
        assert c["batches_per_s"] > 0
        assert c["rows_per_s"] == pytest.approx(c["batches_per_s"] * c["batch_rows"], rel=0.01)
        assert 0 < c["latency_ms"]["p50"] <= c["latency_ms"]["p99"] <= c["latency_ms"]["max"]
        assert len(c["cpu_ms_per_batch"]["partitions"]) == c["partitions"]

    sensors = [c for c in configs if c["workload"] == "sensors"]
    for c in sensors:  # spanning batches, and only those, were coordinated
        assert c["coordinated_batches"] == round(c["batches"] * c["spanning_share"])
        if c["partitions"] == 2:
            assert c["vs_all_local"] > 0
    for workload in ("voter", "voter-1", "voter-state"):  # at P = 2 nearly all run in flows (100 votes: row by row)
        pair = {c["partitions"]: c for c in configs if c["workload"] == workload}
        assert pair[1]["batch_rows"] == (100 if workload == "voter" else 1)
        assert pair[1]["coordinated_batches"] == 0 and pair[1]["flow_batches"] == 0
        assert pair[2]["flow_batches"] > pair[2]["batches"] // 2 and pair[2]["flows"] > 0
        assert pair[2]["vs_p1"] > 0

    ratios = [x for x in lines if "ratio" in x]
    assert len(ratios) == 4 and lines[-4:] == ratios  # the ratio lines come last
    ratio, *voter_ratios = ratios
    assert [r["workload"] for r in voter_ratios] == ["voter", "voter-1", "voter-state"]
    for r in voter_ratios:
        pair = {c["partitions"]: c for c in configs if c["workload"] == r["workload"]}
        assert r["target"] == 1.0
        assert r["numerator_value"] == pair[2]["batches_per_s"]
        assert r["denominator_value"] == pair[1]["batches_per_s"]
    assert RATIO_KEYS <= ratio.keys()
    assert ratio["target"] == 1.6 and ratio["ratio"] > 0
    assert ratio["ratio"] == pytest.approx(ratio["ratio_rounds"][0], abs=0.002)  # one round: its own pair
    assert len(ratio["other_cores_rounds"]) == 1
    assert ratio["numerator_value"] == sensors[1]["batches_per_s"]
    assert ratio["denominator_value"] == sensors[0]["batches_per_s"]

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
