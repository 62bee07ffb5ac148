"""What an operator watches: Prometheus metrics (`--metrics-port`), equal to Status; JSON logs (`--log-format json`)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamtx.client import Client
from streamtx.server.embedded import EmbeddedServer

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
    assert metrics[("process_cpu_seconds_total", ())] > 0
    assert metrics[("streamtx_push_seconds_count", ())] == 4  # every push, committed or rejected
    assert 0 < metrics[("streamtx_push_seconds_sum", ())] < 60
    assert metrics[("streamtx_push_seconds_bucket", (("le", "+Inf"),))] == 4


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
    argv += ["--data-dir", str(tmp_path), "--log-format", "json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "port").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with Client(f"127.0.0.1:{int((tmp_path / 'port').read_text())}") as c:
            c.deploy(SCRIPT)
            c.push("ins", pa.table({"k": pa.array([1], pa.int64()), "v": pa.array([2], pa.int64())})).result()
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
