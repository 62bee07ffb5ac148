"""What an operator watches: Prometheus metrics (`--metrics-port`), equal to Status; JSON logs (`--log-format json`);
`streamtx top`."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamtx.cli import quantile
from streamtx.client import Client
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.partition.meter import Hist

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
CREATE TABLE totals (k BIGINT PRIMARY KEY, n BIGINT NOT NULL) PARTITION BY (k);
CREATE STREAM ins (k BIGINT, v BIGINT) PARTITION BY (k);
CREATE PROCEDURE add ON STREAM ins AS BEGIN
    INSERT INTO totals SELECT k, sum(v) FROM ins GROUP BY k
        ON CONFLICT DO UPDATE SET n = totals.n + excluded.n;
    SELECT error('negative') FROM ins HAVING min(v) < 0;
END;
"""


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture(scope="module")
def server():
    with EmbeddedServer(partitions=2, extra_args=["--metrics-port", "0"]) as srv:
        port = int((srv.data_dir / "metrics-port").read_text())
        with Client(srv.target) as c:
            c.deploy(SCRIPT)
        yield srv, port


def test_scrapes_count_what_the_server_did(server):
    srv, port = server
    with Client(srv.target) as c:
        for k, v in [(1, 5), (2, 7), (3, -1), (4, 2)]:
            c.push("ins", pa.table({"k": pa.array([k], pa.int64()), "v": pa.array([v], pa.int64())})).result()
        status = c.status()
    metrics = scrape(port)
    front = {labels[0][1]: v for (name, labels), v in metrics.items() if name == "streamtx_front_events_total"}
    assert front["committed"] == status["counters"]["committed"] >= 3
    assert front["rejected"] == status["counters"]["rejected"] >= 1
    rows = {
        dict(labels)["partition"]: v
        for (name, labels), v in metrics.items()
        if name == "streamtx_table_rows" and dict(labels)["table"] == "totals"
    }
    assert set(rows) == {"0", "1"} and sum(rows.values()) == 3  # keys 1, 2, 4 committed, spread by the map
    for p in ("0", "1"):
        assert metrics[("streamtx_partition_up", (("partition", p),))] == 1.0
        committed = metrics[("streamtx_partition_events_total", (("event", "committed"), ("partition", p)))]
        assert committed == status["counters"][f"partition{p}.committed"]
    assert metrics[("streamtx_last_timestamp", ())] == status["last_timestamp"] > 0
    assert metrics[("streamtx_in_flight_batches", ())] == metrics[("streamtx_in_flight_bytes", ())] == 0  # all answered
    assert metrics[("streamtx_admission_waiting", ())] == 0
    assert metrics[("process_cpu_seconds_total", ())] > 0
    assert metrics[("streamtx_push_seconds_count", ())] == 4  # every push, committed or rejected
    assert 0 < metrics[("streamtx_push_seconds_sum", ())] < 60
    assert metrics[("streamtx_push_seconds_bucket", (("le", "+Inf"),))] == 4

    # per stream (the front's count) and per procedure (each partition's, summed): what was pushed
    def total(name: str, **match: str) -> float:
        return sum(v for (n, labels), v in metrics.items() if n == name and match.items() <= dict(labels).items())

    assert total("streamtx_stream_batches_total", stream="ins", outcome="committed") == 3
    assert total("streamtx_stream_batches_total", stream="ins", outcome="rejected") == 1
    assert total("streamtx_stream_batches_total", stream="ins", outcome="duplicate") == 0
    assert total("streamtx_stream_rows_total", stream="ins") == 3
    assert total("streamtx_procedure_tes_total", procedure="add", outcome="committed") == 3
    assert total("streamtx_procedure_tes_total", procedure="add", outcome="aborted") == 1  # the rejected batch's
    assert total("streamtx_te_seconds_count", procedure="add") == 3  # one run time per committed TE
    assert total("streamtx_te_seconds_bucket", procedure="add", le="+Inf") == 3
    assert 0 < total("streamtx_te_seconds_sum", procedure="add") < 30
    assert total("streamtx_interval_tes_count") == 3 and total("streamtx_interval_tes_sum") == 3  # 1 TE each
    assert total("streamtx_log_sync_seconds_count") >= 3  # the committed batches' records were synced
    assert total("streamtx_dedup_entries", table="marks") == 2  # the producer's mark on each partition it used
    for p in ("0", "1"):
        assert metrics[("streamtx_partition_cpu_seconds_total", (("partition", p),))] > 0
        assert metrics[("streamtx_log_bytes", (("partition", p),))] > 0
        assert metrics[("streamtx_partition_recovery_seconds", (("partition", p),))] >= 0
    parts = {p["id"]: p["metrics"] for p in status["partitions"]}
    add = [proc for m in parts.values() for proc in m["procedures"] if proc["procedure"] == "add"]
    assert sum(proc["tes_committed"] for proc in add) == 3 and sum(proc["te_seconds"]["count"] for proc in add) == 3
    assert status["stream_metrics"] == [{"stream": "ins", "committed": 3, "rejected": 1, "duplicate": 0, "rows": 3}]


def test_checkpoints_are_measured(server):
    srv, port = server
    with Client(srv.target) as c:
        c.checkpoint()
    metrics = scrape(port)
    for p in ("0", "1"):
        assert metrics[("streamtx_checkpoint_seconds_count", (("partition", p),))] == 1
        assert 0 < metrics[("streamtx_checkpoint_seconds_sum", (("partition", p),))] < 60
        assert metrics[("streamtx_checkpoint_bytes", (("partition", p),))] > 0


def test_top_once_prints_every_partition_and_the_numbers(server):
    srv, _ = server
    with Client(srv.target) as c:
        for k in range(10, 20):  # TEs on each partition, whichever tests ran before
            c.push("ins", pa.table({"k": pa.array([k], pa.int64()), "v": pa.array([1], pa.int64())})).result()
        status = c.status()
    argv = [sys.executable, "-m", "streamtx", "--target", srv.target, "top", "--once", "--interval", "0.2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "160"})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"last timestamp {status['last_timestamp']:,}" in out
    lines = out.splitlines()
    for p in status["partitions"]:
        committed = status["counters"].get(f"partition{p['id']}.committed", 0)
        row = next(line for line in lines if re.match(rf"\W*{p['id']}\W+yes\W", line))
        assert re.search(rf"\b{committed}\b", row) and " ms " in row and "%" in row, row
    rows = sum(n for name, n in status["counters"].items() if name.endswith(".rows.totals"))
    totals = next(line for line in lines if re.match(r"\W*totals\W", line))
    assert re.search(rf"\b{rows}\b", totals)  # table rows, summed over the partitions
    for s in status["stream_metrics"]:
        line = next(line for line in lines if re.match(rf"\W*{s['stream']}\W", line))
        numbers = [s["committed"], s["rejected"], s["duplicate"], s["rows"]]
        assert re.search(r".*".join(rf"\b{n}\b" for n in numbers), line), line


def test_histograms_and_their_quantiles():
    h = Hist((0.001, 0.01, 0.1))
    for v in (0.0005, 0.001, 0.005, 0.05, 5.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap["counts"] == [2, 1, 1, 1] and snap["count"] == 5 and snap["sum"] == pytest.approx(5.0565)
    assert quantile(0.4, snap["bounds"], snap["counts"]) == pytest.approx(0.001)  # the 2nd of 5: top of bucket 1
    assert quantile(0.5, snap["bounds"], snap["counts"]) == pytest.approx(0.001 + 0.009 * 0.5)
    assert quantile(0.99, snap["bounds"], snap["counts"]) == 0.1  # above every bound: the highest bound
    assert quantile(0.5, snap["bounds"], [0, 0, 0, 0]) is None


def test_the_endpoint_listens_on_loopback_only_by_default(server):
    _, port = server
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # sends nothing: picks the interface a packet would leave by
        address = probe.getsockname()[0]
    except OSError:
        address = "127.0.0.1"
    finally:
        probe.close()
    if address.startswith("127."):
        pytest.skip("this host has no address but loopback")
    with pytest.raises(OSError), socket.create_connection((address, port), timeout=2):
        pass


def _serve(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "streamtx", "serve", "--port", "0", "--data-dir", str(tmp_path), *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_a_metrics_port_in_use_stops_the_start_and_says_so(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve(tmp_path, "--partitions", "1", "--metrics-port", str(port))
    assert done.returncode != 0 and f"cannot serve metrics on 127.0.0.1:{port}" in done.stderr


def test_json_logs_are_one_object_per_line_with_their_event(tmp_path):
    argv = [sys.executable, "-m", "streamtx", "serve", "--port", "0", "--partitions", "2"]
    argv += ["--data-dir", str(tmp_path), "--log-format", "json", "--slow-te-ms", "0.001"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "port").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with Client(f"127.0.0.1:{int((tmp_path / 'port').read_text())}") as c:
            c.deploy(SCRIPT)
            c.push("ins", pa.table({"k": pa.array([1], pa.int64()), "v": pa.array([2], pa.int64())})).result()
            c.checkpoint()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    records = [json.loads(line) for line in err.splitlines() if line.strip()]  # every stderr line is JSON
    events = [r["event"] for r in records]
    assert "start" in events and events[-1] == "shutdown", events
    start = records[events.index("start")]
    assert start["partitions"] == 2 and start["port"] > 0 and start["level"] == "info"
    assert all({"time", "level", "event", "message"} <= r.keys() for r in records)
    assert "listening" not in out  # the start line went to the log, not to stdout
    deploy = records[events.index("deploy")]
    assert {"table totals", "stream ins", "procedure add"} <= set(deploy["created"]) and deploy["dropped"] == []
    slow = [r for r in records if r["event"] == "slow_te"]  # every TE takes longer than 1 µs
    assert len(slow) == 1 and slow[0]["level"] == "warning", slow
    assert slow[0]["procedure"] == "add" and slow[0]["partition"] in (0, 1) and slow[0]["ms"] > 0.001
    assert slow[0]["stream"] == "ins" and slow[0]["batch_id"] == 1 and slow[0]["ts"] > 0
    checkpoint = records[events.index("checkpoint")]
    assert checkpoint["bytes"] > 0 and checkpoint["seconds"] > 0 and checkpoint["ts"] > 0
