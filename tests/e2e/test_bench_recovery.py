"""`streamtx bench recovery --quick` end to end on real servers (small sizes): lines, ratios, plot."""

from __future__ import annotations

import json

import pytest

from streamtx.bench import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_bench_recovery_quick_measures_both_modes_and_recovers_every_batch(tmp_path, capsys):
    plot = tmp_path / "recovery.png"
    argv = ["recovery", "--quick", "--quiet", "--max-n", "2", "--batches", "20", "--recovery-batches", "40"]
    assert main([*argv, "--plot", str(plot)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    throughput = [x for x in lines if x.get("measure") == "throughput"]
    recovery = [x for x in lines if x.get("measure") == "recovery"]
    assert {(x["durability"], x["group_commit"], x["n"]) for x in throughput} == {
        (mode, group, 1) for mode in ("strong", "weak") for group in (True, False)
    }
    assert all(x["batches_per_s"] > 0 for x in throughput)
    # every mode replayed its log (the bench itself checks all 40 batches came back)
    assert {x["durability"]: x["records_replayed"] > 0 for x in recovery} == {"strong": True, "weak": True}
    ratios = {x["benchmark"]: x for x in lines if "ratio" in x}
    assert set(ratios) == {"recovery-throughput", "recovery-throughput-no-group-commit", "recovery-recovery"}
    assert plot.stat().st_size > 0
