"""docker-compose.yml and the Dockerfile are valid, and build from this repository alone.

`docker-compose config` (Debian's docker-compose; no Docker engine needed)
parses and validates the compose file; `.ci/run` installs it. Without the
binary this test fails: it is not skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def compose(*args: str, file: str = "docker-compose.yml") -> str:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed: apt-get install docker-compose (.ci/run does it)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMTX_", "COMPOSE_", "DOCKER_"))}
    proc = subprocess.run([binary, "-f", str(ROOT / file), *args], capture_output=True, text=True, cwd=ROOT, env=env)
    assert proc.returncode == 0, f"docker-compose {' '.join(args)} failed:\n{proc.stderr}"
    return proc.stdout


def dockerfile_stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if m:
            current = stages.setdefault(m.group(1), [])
        current.append(line)
    return stages


def test_compose_file_is_valid_with_server_and_spark_job():
    assert set(compose("config", "--services").split()) == {"streamtx", "spark-job", "prometheus", "grafana"}
    config = compose("config")
    assert "target: spark-job" in config and "target: server" in config
    assert "condition: service_healthy" in config  # the job waits for the server's health check
    assert "127.0.0.1:7411:7411" in config or "published: 7411" in config
    assert "streamtx:7411" in config  # the job talks to the server by its service name


def test_the_cluster_compose_file_runs_three_nats_nodes_three_hosts_and_the_spark_job():
    file = "docker-compose.cluster.yml"
    services = set(compose("config", "--services", file=file).split())
    assert services == {"nats-1", "nats-2", "nats-3", "streamtx-a", "streamtx-b", "streamtx-c", "spark-job"}
    config = compose("config", file=file)
    urls = "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222"
    for host in "abc":
        assert re.search(rf"--host-id\s+- {host}\b", config), host
    assert config.count(urls) == 3 and config.count("--log-replicas") == 3
    assert config.count("--checkpoint-every") == 3  # shared checkpoints: the log is trimmed below them
    assert "streamtx-a:7411" in config  # the job pushes to a host by its service name
    for i in (1, 2, 3):  # every node's configuration fsyncs each append and routes to the other two
        conf = (ROOT / "deploy" / "nats" / f"nats-{i}.conf").read_text()
        assert "sync_interval: always" in conf and f"server_name: nats-{i}" in conf
        routes = set(re.findall(r"nats-route://[\w:-]+", conf))
        assert {f"nats-route://nats-{j}:6222" for j in (1, 2, 3) if j != i} <= routes


def test_prometheus_scrapes_the_server_s_metrics_port():
    config = compose("config")
    assert "--metrics-port" in config and "9464" in config
    scrape = (ROOT / "deploy" / "prometheus.yml").read_text()
    assert '"streamtx:9464"' in scrape  # the service name and the port the server's command gives
    assert "127.0.0.1:9090:9090" in config or "published: 9090" in config or 'published: "9090"' in config


def test_grafana_shows_the_dashboard_over_prometheus():
    config = compose("config")
    assert "127.0.0.1:3000:3000" in config or "published: 3000" in config or 'published: "3000"' in config
    for path in ("deploy/grafana/provisioning", "deploy/grafana/streamtx-dashboard.json"):
        assert (ROOT / path).exists() and path.split("/")[-1] in config
    source = (ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert "http://prometheus:9090" in source and "uid: prometheus" in source
    provider = (ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "streamtx.yml").read_text()
    assert "/var/lib/grafana/dashboards" in provider and "/var/lib/grafana/dashboards/streamtx-dashboard.json" in config
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "streamtx-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    assert all(panel["datasource"]["uid"] == "prometheus" for panel in dashboard["panels"])
    for family in (  # throughput, rejects/aborts, latency, queue depth, CPU busy, log size
        "streamtx_stream_batches_total",
        "streamtx_procedure_tes_total",
        "streamtx_te_seconds_bucket",
        "streamtx_push_seconds_bucket",
        "streamtx_partition_queued",
        "streamtx_partition_cpu_seconds_total",
        "streamtx_log_bytes",
    ):
        assert family in exprs, family
    assert "histogram_quantile(0.99" in exprs and "histogram_quantile(0.5" in exprs


def test_images_build_from_this_repository_alone():
    stages = dockerfile_stages()
    assert {"server", "spark-job"} <= set(stages)
    assert list(stages)[-1] == "server", "the server must stay the default (last) stage"
    for name, lines in stages.items():
        for line in lines:
            if line.upper().startswith("COPY"):
                sources = line.split()[1:-1]
                assert not any(s.startswith("--from") for s in sources), f"{name}: copies from outside the repo"
                for src in sources:
                    assert (ROOT / src).exists(), f"{name}: COPY {src}: no such path in the repository"
    job = " ".join(stages["spark-job"])
    assert "openjdk-17" in job and "'.[spark]'" in job
    entry = re.search(r'ENTRYPOINT \["python", "-m", "([\w.]+)"\]', job)
    assert entry, "the spark-job stage runs a module"
    module = entry.group(1).removeprefix("streamtx.").replace(".", "/")
    assert (ROOT / f"{module}.py").exists(), entry.group(1)
