"""The settings table (server/config.py): flags, help, checks and the worker hand-off all come from `ServerConfig`."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from streamtx import cli
from streamtx.server.config import MAP_FILE, ServerConfig, flags, from_args, partitions_to_start, stored_layout
from streamtx.server.launch import spawn_worker
from streamtx.server.partition import worker
from streamtx.server.partitioning import PartitionMap

README = Path(__file__).resolve().parents[2] / "README.md"
SETTINGS = fields(ServerConfig)


def other_value(name: str) -> Any:
    """A valid value of setting `name` that is not its default."""
    default, kind = getattr(ServerConfig(), name), get_type_hints(ServerConfig)[name]
    choices = next(f.metadata["choices"] for f in SETTINGS if f.name == name)
    if choices:
        return next(c for c in choices if c != default)
    if kind is bool:
        return not default
    if kind in (Path, Path | None):
        return Path("/srv") / name
    if name == "log_replicas":  # an odd count: a majority of copies acknowledges
        return 3
    if kind is int:
        return default + 3
    if kind == int | None:  # a port that is off by default
        return 9100
    if kind is float:
        return default + 1.5
    return f"{name}-value"


NEEDS = {
    "tls_cert": ("tls_key",),
    "tls_key": ("tls_cert",),
    "tls_client_ca": ("tls_cert", "tls_key"),
    "cluster": ("host_id",),
    "host_id": ("cluster",),
}
"""Settings that are only valid along with others."""


def every_other() -> ServerConfig:
    return ServerConfig(**{f.name: other_value(f.name) for f in SETTINGS})


def vars_of(config: ServerConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in SETTINGS}


def serve(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamtx", "serve", "--data-dir", str(tmp / "data"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_setting_has_its_flag_and_help_and_is_in_serve_help(tmp_path: Path) -> None:
    out = serve("--help", tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for f in SETTINGS:
        flag, dashed = f.metadata["flag"], f.name.replace("_", "-")
        assert flag in (f"--{dashed}", f"--no-{dashed}"), f"{f.name}: flag {flag} is not its name"
        assert f.metadata["help"], f"{f.name} has no help"
        assert re.search(rf"(^|\s|\[){re.escape(flag)}\b", text), f"{flag} is missing from serve --help"


def test_no_flag_keeps_every_default_and_each_flag_sets_its_setting(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default data directory holds no partition map (see the test below)
    parser = cli.build_parser()
    assert from_args(parser.parse_args(["serve"])) == ServerConfig()
    for f in SETTINGS:
        value = other_value(f.name)
        argv = ["serve", *flags(**{f.name: value}, **{n: other_value(n) for n in NEEDS.get(f.name, ())})]
        assert getattr(from_args(parser.parse_args(argv)), f.name) == value, argv
    assert from_args(parser.parse_args(["serve", *flags(**vars_of(every_other()))])) == every_other()


def test_the_serve_token_wins_over_the_global_one() -> None:
    parser = cli.build_parser()
    assert from_args(parser.parse_args(["--token", "global", "serve"])).token == "global"
    assert from_args(parser.parse_args(["--token", "global", "serve", "--token", "own"])).token == "own"


def test_a_config_survives_the_json_round_trip() -> None:
    for config in (ServerConfig(), every_other()):
        assert ServerConfig.from_json(config.to_json()) == config


def test_a_worker_gets_the_front_s_config_but_not_its_token(tmp_path: Path) -> None:
    config = replace(every_other(), data_dir=tmp_path / "data", procedures_path=ServerConfig().procedures_path)
    spawned = spawn_worker(1, config)
    try:
        argv = [str(a) for a in spawned.proc.args]
        assert config.token not in " ".join(argv)
        args = worker.parse_args(argv[argv.index("streamtx.server.partition.worker") + 1 :])
        assert args.partition == 1
        assert args.config == replace(config, token=None)
    finally:
        spawned.sock.close()  # the worker's end of the socket ends: it stops
    assert spawned.proc.wait(timeout=60) == 0  # it built its Worker from the config, then saw the end
    assert (config.partition_dir(1) / "log").is_dir()  # --durability from the config: a command log


@pytest.mark.parametrize(
    "args, message",
    [
        (["--partitions", "0"], "--partitions 0: must be >= 1"),
        (["--partitions", "4", "--bins", "2"], "--bins 2: must be at least --partitions (4)"),
        (["--port", "70000"], "--port 70000: must be in 0..65535"),
        (["--metrics-port", "70000"], "--metrics-port 70000: must be in 0..65535"),
        (["--interval-size", "0"], "--interval-size 0: must be >= 1"),
        (["--group-commit-ms", "-1"], "--group-commit-ms -1.0: must be >= 0"),
        (["--staging-ttl", "0"], "--staging-ttl 0.0: must be > 0"),
        (["--durability", "sometimes"], "argument --durability: invalid choice: 'sometimes' (choose from"),
        (["--executor", "fast"], "argument --executor: invalid choice: 'fast' (choose from"),
        (["--max-in-flight", "many"], "argument --max-in-flight: invalid int value: 'many'"),
        (["--cluster", "nats://127.0.0.1:4222"], "--cluster nats://127.0.0.1:4222: cluster mode needs both"),
        (["--host-id", "a"], "--host-id a: cluster mode needs both --cluster and --host-id"),
        (["--cluster", "nats://x", "--host-id", "a", "--durability", "off"], "needs --durability strong or weak"),
        (["--log-replicas", "2"], "--log-replicas 2: must be 1, 3 or 5"),
        (["--cluster", "nats://x", "--host-id", "a.b"], "--host-id 'a.b': must be 1-64 letters, digits"),
    ],
)
def test_a_bad_value_stops_serve_with_a_message_naming_its_flag(tmp_path: Path, args: list[str], message: str) -> None:
    out = serve(*args, tmp=tmp_path)
    assert out.returncode == 2
    assert message in out.stderr, out.stderr
    if "choice" in message:
        flag = args[0]
        choices = next(f.metadata["choices"] for f in SETTINGS if f.metadata["flag"] == flag)
        assert all(repr(c) in out.stderr for c in choices), out.stderr
    assert not (tmp_path / "data").exists()  # refused before the data directory is locked or a worker started


def test_a_config_built_in_python_is_checked_as_the_flags_are() -> None:
    with pytest.raises(ValueError, match=r"--durability 'sometimes': must be one of strong, weak, off"):
        ServerConfig(durability="sometimes")
    with pytest.raises(ValueError, match=r"--executor 'fast': must be one of serial, opchain"):
        ServerConfig(executor="fast")
    with pytest.raises(TypeError, match="no setting 'retention'"):
        flags(retention=5)


def test_the_readme_lists_every_setting_with_its_default() -> None:
    rows = re.findall(r"^\| `(--[a-z-]+)` \| ([^|]+) \|", README.read_text(), re.M)
    documented = dict(rows)
    assert set(documented) == {f.metadata["flag"] for f in SETTINGS}
    defaults = ServerConfig()
    for f in SETTINGS:
        plain = re.fullmatch(r"`([^`]+)`", documented[f.metadata["flag"]].strip())
        if f.default is not MISSING and plain is not None:  # a value, not prose such as "one per core"
            value = getattr(defaults, f.name)
            assert type(value)(plain.group(1)) == value, f"README: {f.metadata['flag']} defaults to {value}"


def test_partitions_and_bins_left_out_follow_the_data_directory(tmp_path: Path) -> None:
    parser = cli.build_parser()
    data = tmp_path / "data"
    assert from_args(parser.parse_args(["serve", "--data-dir", str(data)])).partitions == ServerConfig().partitions
    data.mkdir()
    (data / MAP_FILE).write_text(PartitionMap.round_robin(3, 16).to_json())
    config = from_args(parser.parse_args(["serve", "--data-dir", str(data)]))
    assert (config.partitions, config.bins, config.layout_mismatch()) == (3, 16, None)
    config = from_args(parser.parse_args(["serve", "--data-dir", str(data), "--partitions", "2"]))
    assert (config.partitions, config.bins) == (2, 16)
    assert config.layout_mismatch() == (
        f"--partitions 2: data directory {data} holds 3 partition(s) over 16 bins ({MAP_FILE}); its rows are "
        "spread over them, so a server on it runs with the same: start it with --partitions 3 --bins 16, "
        "or leave both out"
    )


# --------------------------------------------------------------- --config FILE.toml


def test_a_config_file_sets_settings_and_flags_given_as_well_win(tmp_path: Path) -> None:
    file = tmp_path / "streamtx.toml"
    file.write_text(
        'data-dir = "/srv/streamtx"\npartitions = 1\ninterval_size = 7\ngroup-commit-ms = 1\n'
        "uvloop = false\nmetrics-port = 9100\n"
    )
    parser = cli.build_parser()
    config = from_args(parser.parse_args(["serve", "--config", str(file)]))
    assert (config.data_dir, config.partitions, config.interval_size) == (Path("/srv/streamtx"), 1, 7)
    assert (config.group_commit_ms, config.uvloop, config.metrics_port) == (1.0, False, 9100)
    config = from_args(parser.parse_args(["serve", "--config", str(file), "--interval-size", "9", "--partitions", "2"]))
    assert (config.interval_size, config.partitions, config.data_dir) == (9, 2, Path("/srv/streamtx"))


@pytest.mark.parametrize(
    "text, message",
    [
        ("partition = 2\n", "no setting 'partition'; the keys are the flags of `streamtx serve` without their dashes"),
        ('partitions = "two"\n', "partitions = 'two': must be an integer"),
        ("uvloop = 1\n", "uvloop = 1: must be true or false"),
        ("partitions = 0\n", "--partitions 0: must be >= 1"),
        ("partitions = \n", "not TOML"),
    ],
)
def test_a_bad_config_file_stops_serve_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    file = tmp_path / "bad.toml"
    file.write_text(text)
    out = serve("--config", str(file), tmp=tmp_path)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "data").exists()
    missing = serve("--config", str(tmp_path / "none.toml"), tmp=tmp_path)
    assert missing.returncode == 2 and "none.toml: No such file or directory" in missing.stderr


def test_config_show_prints_what_serve_would_run_with_and_reads_back(tmp_path: Path) -> None:
    def show(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "streamtx", "config", "show", *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = show(*flags(**{f.name: other_value(f.name) for f in SETTINGS if f.name != "token"}), "--token", "s3cret")
    assert "s3cret" not in first and "# token: set, not shown" in first
    file = tmp_path / "shown.toml"
    file.write_text(first)
    assert show("--config", str(file), "--token", "s3cret") == first
    parser = cli.build_parser()
    assert from_args(parser.parse_args(["serve", "--config", str(file)])) == replace(every_other(), token=None)


def test_a_server_runs_with_the_settings_of_its_config_file(tmp_path: Path) -> None:
    file = tmp_path / "streamtx.toml"
    file.write_text("partitions = 1\nmetrics-port = 0\n")  # the metrics port file shows the file was read
    from streamtx.server.embedded import EmbeddedServer

    with EmbeddedServer(tmp_path / "data", extra_args=["--config", str(file)]) as srv:
        assert int((srv.data_dir / "metrics-port").read_text()) > 0


def test_a_step_adding_partitions_left_pending_starts_their_workers_too(tmp_path: Path) -> None:
    """Recovery keeps or retires them once it knows whether the step finished (front.py)."""
    current = PartitionMap.round_robin(2, 16)
    current.save(tmp_path, (90, current.resized(3, 90)))
    assert stored_layout(tmp_path) == (2, 16)
    assert partitions_to_start(tmp_path, 2) == 3
    current.save(tmp_path)
    assert partitions_to_start(tmp_path, 2) == 2
