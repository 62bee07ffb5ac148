"""`streamtx bench spark`: its lines and ratios, and a small run end to end (real Spark, real server)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from streamtx.bench import main
from streamtx.bench.common import Measurement
from streamtx.bench.spark import Config, _line, ratios

pytestmark = pytest.mark.timeout(300)


def test_lines_and_ratio_lines():
    lines = [
        _line(Config("streamtx", 1000, 4), [Measurement(elapsed=2.0, count=4, extra={"rows": 4000})]),
        _line(Config("noop", 1000, 4), [Measurement(elapsed=1.0, count=4, extra={"rows": 4000})]),
        _line(Config("python_noop", 1000, 4), [Measurement(elapsed=1.6, count=4, extra={"rows": 4000})]),
    ]
    assert lines[0]["rows_per_s"] == 2000 and lines[0]["met"] is False and lines[0]["rows_per_s_target"] == 100_000
    assert lines[1]["rows_per_s"] == 4000 and "met" not in lines[1]
    ratio, python = ratios(lines)
    assert (ratio["ratio"], ratio["target"], ratio["met"], ratio["batch_rows"]) == (0.5, 0.5, True, 1000)
    assert "streamtx" in ratio["numerator"] and "noop sink" in ratio["denominator"]
    assert (python["ratio"], python["met"]) == (0.8, True) and "python_noop" in python["denominator"]


@pytest.mark.slow
def test_bench_spark_small_run(tmp_path, capsys):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    png = tmp_path / "spark.png"
    assert (
        main(
            [
                "spark",
                "--quick",
                "--quiet",
                "--batch-sizes",
                "500,2000",
                "--files",
                "3",
                "--rounds",
                "1",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    configs = [r for r in records if "sink" in r]
    assert {(r["sink"], r["batch_rows"]) for r in configs} == {
        (s, n) for s in ("streamtx", "noop", "python_noop") for n in (500, 2000)
    }
    assert all(r["rows_per_s"] > 0 and r["latency_ms"]["p50"] > 0 for r in configs)
    ratio_lines = [r for r in records if "ratio" in r]
    assert [r["batch_rows"] for r in ratio_lines] == [2000, 500, 2000]
    assert png.stat().st_size > 0
