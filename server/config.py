"""Server settings: `ServerConfig`, the one table of everything `streamtx serve` can be told.

Each setting is a field that carries its flag, help text and bounds
(`setting`). `streamtx serve`'s flags and `--help` (`add_arguments`,
`from_args`), the checks with their messages (`__post_init__`) and the
partition workers' settings (`to_json`, `from_json`) all come from it, so a
setting is named, defaulted and checked in one place.

Standard library only: `streamtx serve` reads its flags before it imports
the server.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

DEFAULT_PORT = 7411
EXECUTORS = ("serial", "opchain")
"""`serial`: S-Store's way, every TE alone with its own state access. `opchain`: TStream's
way, state procedures' events coalesced into punctuation intervals with set-based state access."""
LOG_FORMATS = ("text", "json")
"""`text`: `streamtx: ...` lines; `json`: one JSON object per line (server/log.py)."""
DURABILITIES = ("strong", "weak", "off")
"""What the command log holds (server/partition/journal.py)."""
MAP_FILE = "partition_map.json"
"""The data directory's partition map: which partition owns each bin (server/partitioning.py)."""
CATALOG_FILE = "catalog.json"
"""The data directory's deployed catalog (server/front/front.py writes it at each deploy)."""


@dataclass(frozen=True)
class Bound:
    """What a setting's value must satisfy; `wants` completes "--flag VALUE: must be ..."."""

    ok: Callable[[Any], bool]
    wants: str


AT_LEAST_ONE = Bound(lambda v: v >= 1, ">= 1")
NOT_NEGATIVE = Bound(lambda v: v >= 0, ">= 0")
POSITIVE = Bound(lambda v: v > 0, "> 0")
PORT = Bound(lambda v: 0 <= v < 65536, "in 0..65535")
PORT_OR_OFF = Bound(lambda v: v is None or 0 <= v < 65536, "in 0..65535")


def setting(
    default: Any = dataclasses.MISSING,
    *,
    flag: str,
    help: str,
    factory: Callable[[], Any] | Any = dataclasses.MISSING,
    choices: tuple[str, ...] = (),
    bound: Bound | None = None,
    shown: str | None = None,
    metavar: str | None = None,
) -> Any:
    """A field of `ServerConfig` with its flag; `shown` stands for the default in `--help` where the value won't do."""
    meta = {"flag": flag, "help": help, "choices": choices, "bound": bound, "shown": shown, "metavar": metavar}
    return field(default=default, default_factory=factory, metadata=meta)


def default_procedures_path() -> Path:
    """The applications that ship with streamtx (the repository's procedures/)."""
    return Path(__file__).resolve().parent.parent / "procedures"


@dataclass(frozen=True)
class ServerConfig:
    """Everything `streamtx serve` can be told; a config that exists is valid.

    Defaults give a server on 127.0.0.1 with one partition per core that works
    on a laptop with nothing else installed.
    """

    host: str = setting("127.0.0.1", flag="--host", help="interface to listen on")
    port: int = setting(
        DEFAULT_PORT,
        flag="--port",
        help="port; 0 picks a free one, printed and written to DATA_DIR/port",
        bound=PORT,
    )
    data_dir: Path = setting(
        flag="--data-dir",
        factory=lambda: Path("streamtx-data"),
        help="directory for snapshots and command logs",
    )
    partitions: int = setting(
        flag="--partitions",
        factory=lambda: os.cpu_count() or 1,
        help="partition processes, each one thread with its own DuckDB; left out: the data directory's own, if it "
        "has partitions already",
        bound=AT_LEAST_ONE,
        shown=f"one per core, {os.cpu_count() or 1} here",
    )
    executor: str = setting(
        "opchain",
        flag="--executor",
        help="batch executor: opchain coalesces state procedures' events into punctuation intervals (TStream); "
        "serial runs each TE's state access by itself, S-Store style",
        choices=EXECUTORS,
    )
    procedures_path: Path = setting(
        flag="--procedures-path",
        factory=default_procedures_path,
        help="directory of Python procedures loaded at start-up",
    )
    token: str | None = setting(
        flag="--token",
        factory=lambda: os.environ.get("STREAMTX_TOKEN") or None,
        help="an admin bearer token; once any token is set (here or in --tokens-file), every verb but Health "
        "needs one whose role covers it (docs/operations.md); none at all: no authentication",
        shown="the global --token, else env STREAMTX_TOKEN",
        metavar="TOKEN",
    )
    tokens_file: Path | None = setting(
        None,
        flag="--tokens-file",
        help="more bearer tokens, one 'ROLE TOKEN' per line (roles: read, write, admin; '#' comments); "
        "read at start-up",
        shown="none",
        metavar="PATH",
    )
    tls_cert: Path | None = setting(
        None,
        flag="--tls-cert",
        help="serve over TLS with this PEM certificate (chain); needs --tls-key",
        shown="none: plaintext",
        metavar="PATH",
    )
    tls_key: Path | None = setting(
        None, flag="--tls-key", help="the PEM private key of --tls-cert (unencrypted)", shown="none", metavar="PATH"
    )
    tls_client_ca: Path | None = setting(
        None,
        flag="--tls-client-ca",
        help="mutual TLS: clients must present a certificate signed by a CA of this PEM bundle; needs --tls-cert",
        shown="none: no client certificate asked",
        metavar="PATH",
    )
    uvloop: bool = setting(True, flag="--no-uvloop", help="run on the default asyncio loop, not uvloop")
    max_batch_rows: int = setting(
        1_000_000, flag="--max-batch-rows", help="largest atomic batch accepted, in rows", bound=AT_LEAST_ONE
    )
    max_message_bytes: int = setting(
        64 * 1024 * 1024, flag="--max-message-bytes", help="largest gRPC message accepted", bound=AT_LEAST_ONE
    )
    max_in_flight: int = setting(
        1024,
        flag="--max-in-flight",
        help="pushed batches admitted but not yet answered, per server; beyond it a PushStream producer "
        "waits (flow control) and a unary Push waits up to --push-wait, then gets RESOURCE_EXHAUSTED",
        bound=AT_LEAST_ONE,
    )
    max_in_flight_bytes: int = setting(
        128 * 1024 * 1024,
        flag="--max-in-flight-bytes",
        help="bytes of pushed messages (as received) admitted but not yet answered, per server; "
        "beyond it pushes wait as for --max-in-flight",
        bound=AT_LEAST_ONE,
    )
    push_wait: float = setting(
        0.5,
        flag="--push-wait",
        help="seconds a unary Push waits for room under --max-in-flight before it is refused with "
        "RESOURCE_EXHAUSTED and a retry hint (trailing metadata retry-after-ms)",
        bound=NOT_NEGATIVE,
    )
    stream_retention: int = setting(
        10_000,
        flag="--stream-retention",
        help="batches kept on a stream no procedure consumes, for Subscribe; trimmed in steps of a tenth, "
        "so between N and 1.1 N of the latest batches are held",
        bound=NOT_NEGATIVE,
    )
    staging_max_bytes: int = setting(
        512 * 1024 * 1024,
        flag="--staging-max-bytes",
        help="bytes of rows staged for two-phase pushes (Spark), in all; beyond it Stage is RESOURCE_EXHAUSTED",
        bound=AT_LEAST_ONE,
    )
    staging_ttl: float = setting(
        900.0,
        flag="--staging-ttl",
        help="seconds after which staged rows never committed are dropped",
        bound=POSITIVE,
    )
    max_restarts: int = setting(
        5,
        flag="--max-restarts",
        help="restarts of the partition workers (after one died) allowed within --restart-window; "
        "one more stops the server",
        bound=NOT_NEGATIVE,
    )
    restart_window: float = setting(
        60.0, flag="--restart-window", help="seconds over which --max-restarts counts", bound=POSITIVE
    )
    order_timeout: float = setting(
        10.0,
        flag="--order-timeout",
        help="seconds a batch waits for a missing earlier batch id",
        bound=NOT_NEGATIVE,
    )
    query_timeout: float = setting(
        30.0,
        flag="--query-timeout",
        help="seconds a Query may run (on a partition, which it holds meanwhile, and on the front over "
        "gathered tables) before it is stopped with DEADLINE_EXCEEDED; 0: no limit",
        bound=NOT_NEGATIVE,
    )
    bins: int = setting(
        1024,
        flag="--bins",
        help="partitioning bins: bin = hash(key) mod BINS; at least --partitions; left out: the data "
        "directory's own, if it has partitions already",
        bound=AT_LEAST_ONE,
    )
    durability: str = setting(
        "strong",
        flag="--durability",
        help="command log: strong logs every committed TE, weak only batches from outside and calls "
        "(interior TEs are re-derived on recovery), off nothing",
        choices=DURABILITIES,
    )
    group_commit_ms: float = setting(
        2.0,
        flag="--group-commit-ms",
        help="log records are fsynced together at most this long after the first; 0: no group commit, "
        "each record is fsynced alone before the partition goes on",
        bound=NOT_NEGATIVE,
    )
    checkpoint_every: float = setting(
        0.0,
        flag="--checkpoint-every",
        help="take an online checkpoint this often, in seconds; 0: only on demand",
        bound=NOT_NEGATIVE,
        metavar="SECONDS",
    )
    auto_rebalance: float = setting(
        0.0,
        flag="--auto-rebalance",
        help="every SECONDS, if a partition's bins received more keys than their share (by more than "
        "--auto-rebalance-tolerance), move bins from the most loaded partitions to the least, batched; 0: off",
        bound=NOT_NEGATIVE,
        metavar="SECONDS",
    )
    auto_rebalance_tolerance: float = setting(
        0.25,
        flag="--auto-rebalance-tolerance",
        help="how far above the mean a partition's keys may be before --auto-rebalance moves bins (0.25: 25%%)",
        bound=POSITIVE,
    )
    cluster: str | None = setting(
        None,
        flag="--cluster",
        help="cluster mode: the NATS servers (nats://HOST:PORT, comma-separated) whose JetStream holds the "
        "cluster's input log; every host runs every request in the log's order (docs/cluster.md)",
        shown="off: one host, its own command log",
        metavar="URLS",
    )
    host_id: str | None = setting(
        None,
        flag="--host-id",
        help="this host's name in the cluster (needs --cluster); unique per host",
        shown="none",
        metavar="NAME",
    )
    cluster_log: str = setting(
        "main",
        flag="--cluster-log",
        help="the cluster's name: its log is the JetStream stream STREAMTX_<NAME>; hosts with the same one "
        "form one cluster",
        metavar="NAME",
    )
    log_replicas: int = setting(
        1,
        flag="--log-replicas",
        help="copies JetStream keeps of the cluster's log (1, 3 or 5; at most the NATS servers); an append "
        "is acknowledged once a majority holds it",
        bound=Bound(lambda v: v in (1, 3, 5), "1, 3 or 5"),
    )
    sql_compiler: str = setting(
        "on",
        flag="--sql-compiler",
        help="run SQL statements compiled over the partitions' in-memory state where they can be "
        "(streamtx explain shows which); off: every statement runs in DuckDB",
        choices=("on", "off"),
    )
    interval_size: int = setting(
        500,
        flag="--interval-size",
        help="punctuation interval: at most this many queued batches (and the TEs they trigger) are "
        "executed and committed together",
        bound=AT_LEAST_ONE,
    )
    log_format: str = setting(
        "text",
        flag="--log-format",
        help="stderr log lines: text, or json (one object per line: time, level, event, message, fields)",
        choices=LOG_FORMATS,
    )
    metrics_port: int | None = setting(
        None,
        flag="--metrics-port",
        help="serve Prometheus metrics over HTTP on this port of --host (docs/operations.md); "
        "0 picks a free one, written to DATA_DIR/metrics-port",
        bound=PORT_OR_OFF,
        shown="off",
    )
    interval_ms: float = setting(
        0.0,
        flag="--interval-ms",
        help="latency budget: how long a partition waits for an interval to fill before it runs what "
        "is queued; 0: never waits",
        bound=NOT_NEGATIVE,
    )
    slow_te_ms: float = setting(
        1000.0,
        flag="--slow-te-ms",
        help="log a slow_te event for each committed TE that ran longer than this many milliseconds "
        "(fractions allowed); 0: never",
        bound=NOT_NEGATIVE,
        metavar="MS",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if meta["choices"] and value not in meta["choices"]:
                raise ValueError(f"{meta['flag']} {value!r}: must be one of {', '.join(meta['choices'])}")
            if meta["bound"] is not None and not meta["bound"].ok(value):
                raise ValueError(f"{meta['flag']} {value!r}: must be {meta['bound'].wants}")
        if self.bins < self.partitions:
            raise ValueError(f"--bins {self.bins}: must be at least --partitions ({self.partitions})")
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("--tls-cert", "--tls-key") if self.tls_key is None else ("--tls-key", "--tls-cert")
            raise ValueError(f"{given} {self.tls_cert or self.tls_key}: needs {missing} as well (both or neither)")
        if (self.cluster is None) != (self.host_id is None):
            given = f"--cluster {self.cluster}" if self.host_id is None else f"--host-id {self.host_id}"
            raise ValueError(f"{given}: cluster mode needs both --cluster and --host-id")
        if self.host_id is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", self.host_id):
            raise ValueError(f"--host-id {self.host_id!r}: must be 1-64 letters, digits, '-' or '_'")
        if self.cluster is not None and self.durability == "off":
            raise ValueError(
                f"--cluster {self.cluster}: needs --durability strong or weak: a host that restarts recovers from its "
                "own command log and reads the cluster's log on from where that leaves it"
            )
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError(
                f"--tls-client-ca {self.tls_client_ca}: needs --tls-cert and --tls-key (mutual TLS is TLS first)"
            )

    def partition_dir(self, index: int) -> Path:
        """Where partition `index` keeps its command log and checkpoints."""
        return Path(self.data_dir) / f"partition-{index}"

    def layout_mismatch(self) -> str | None:
        """Why this config cannot serve its data directory's partitions; None when it can.

        A data directory's rows are spread over the partitions it was created
        with, by its bins: a server with another count would miss the rows of
        the partitions it does not start and route new keys away from their
        existing rows.
        """
        stored = stored_layout(Path(self.data_dir))
        if stored is None or stored == (self.partitions, self.bins):
            return None
        partitions, bins = stored
        given = f"--partitions {self.partitions}" if partitions != self.partitions else f"--bins {self.bins}"
        return (
            f"{given}: data directory {self.data_dir} holds {partitions} partition(s) over {bins} bins "
            f"({MAP_FILE}); its rows are spread over them, so a server on it runs with the same: "
            f"start it with --partitions {partitions} --bins {bins}, or leave both out"
        )

    def to_json(self) -> str:
        """The config as a partition worker receives it (`from_json` gives it back, equal)."""
        return json.dumps({f.name: _plain(getattr(self, f.name)) for f in fields(self)})

    @classmethod
    def from_json(cls, text: str) -> ServerConfig:
        types = get_type_hints(cls)
        paths = {name for name, kind in types.items() if kind in (Path, Path | None)}
        return cls(**{name: Path(v) if name in paths and v is not None else v for name, v in json.loads(text).items()})


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, its help ending with the default.

    A flag not given sets nothing (`SUPPRESS`), so the setting keeps its one
    default, the field's. `--token` shares its name with the global
    `streamtx --token`: given to `serve`, it wins; else the global one does.
    """
    parser.add_argument(
        "--config",
        dest="config_file",
        type=Path,
        metavar="FILE.toml",
        default=argparse.SUPPRESS,
        help='settings from a TOML file, one key per flag without its dashes (data-dir = "/srv/streamtx", '
        "partitions = 2); flags given as well win",
    )
    defaults = ServerConfig()
    types = get_type_hints(ServerConfig)
    for f in fields(ServerConfig):
        meta, kind = f.metadata, types[f.name]
        if kind is bool:
            action = "store_false" if getattr(defaults, f.name) else "store_true"
            parser.add_argument(meta["flag"], dest=f.name, action=action, default=argparse.SUPPRESS, help=meta["help"])
            continue
        shown = meta["shown"] or getattr(defaults, f.name)
        if kind == int | None:
            kind = int
        if kind == Path | None:
            kind = Path
        parser.add_argument(
            meta["flag"],
            dest=f.name,
            type=kind if kind in (int, float, Path) else str,
            choices=meta["choices"] or None,
            metavar=meta["metavar"],
            default=argparse.SUPPRESS,
            help=f"{meta['help']} (default: {shown})".replace("%", "%%"),
        )


def stored_layout(data_dir: Path) -> tuple[int, int] | None:
    """(partitions, bins) of the partition map a server wrote in `data_dir`; None for a new directory."""
    data = _stored_map(data_dir)
    return None if data is None else (_partition_count(data), int(data["bins"]))


def partitions_to_start(data_dir: Path, partitions: int) -> int:
    """How many workers a server on `data_dir` starts: its partitions, or more if a step adding partitions
    was under way at a crash (recovery keeps them if the step finished, else retires them: front.py)."""
    data = _stored_map(data_dir)
    pending = data.get("pending") if data is not None else None
    return max(partitions, _partition_count(pending)) if pending else partitions


def _stored_map(data_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((data_dir / MAP_FILE).read_text())
    except FileNotFoundError:
        return None


def _partition_count(record: dict[str, Any]) -> int:
    """`PartitionMap.partitions` of a map as the data directory records it (restated here: `streamtx serve`
    reads it before it imports NumPy, which server/partitioning.py needs; launch.py)."""
    return len(record["born"]) if record.get("born") else max(record["owner"]) + 1


def from_args(args: argparse.Namespace) -> ServerConfig:
    """The config of the flags `add_arguments` parsed, over `--config`'s file; a bad value is a ValueError naming it.

    `--partitions` and `--bins` left out follow the data directory when it
    has partitions already (one per core and 1,024 for a new one).
    """
    given = vars(args)
    settings = read_toml(given["config_file"]) if "config_file" in given else {}
    settings.update({f.name: given[f.name] for f in fields(ServerConfig) if f.name in given})
    data_dir = Path(settings.get("data_dir", ServerConfig.__dataclass_fields__["data_dir"].default_factory()))
    stored = stored_layout(data_dir)
    if stored is not None:
        settings.setdefault("partitions", stored[0])
        settings.setdefault("bins", stored[1])
    return ServerConfig(**settings)


def read_toml(path: Path) -> dict[str, Any]:
    """The settings a TOML file gives, by field name: keys are the flags without their dashes.

    A key no flag has, or a value of the wrong type, is a ValueError naming
    the file and the key (the bounds are `ServerConfig`'s own checks).
    """
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--config {path}: not TOML: {e}") from None
    by_key = {_key(f): f for f in fields(ServerConfig)}
    types = get_type_hints(ServerConfig)
    settings: dict[str, Any] = {}
    for key, value in data.items():
        f = by_key.get(key.replace("_", "-"))
        if f is None:
            raise ValueError(
                f"--config {path}: no setting {key!r}; the keys are the flags of `streamtx serve` "
                f"without their dashes ({', '.join(sorted(by_key))})"
            )
        settings[f.name] = _typed(value, types[f.name], f"--config {path}: {key} = {value!r}")
    return settings


def _key(f: dataclasses.Field) -> str:
    """A setting's key in a TOML file: its flag without the dashes (`--no-uvloop`: `uvloop`)."""
    return f.metadata["flag"].removeprefix("--no-").removeprefix("--")


def _typed(value: Any, kind: Any, where: str) -> Any:
    """`value` from TOML as a setting of type `kind` (ints for floats, strings for paths), else a ValueError."""
    plain_int = isinstance(value, int) and not isinstance(value, bool)
    if kind is bool and isinstance(value, bool):
        return value
    if kind in (int, int | None) and plain_int:
        return value
    if kind is float and (plain_int or isinstance(value, float)):
        return float(value)
    if kind in (Path, Path | None) and isinstance(value, str):
        return Path(value)
    if kind == Path | None:
        kind = Path
    if kind in (str, str | None) and isinstance(value, str):
        return value
    wanted = {bool: "true or false", float: "a number", Path: "a path (a string)"}.get(kind, "")
    wanted = wanted or ("an integer" if kind in (int, int | None) else "a string")
    raise ValueError(f"{where}: must be {wanted}")


def to_toml(config: ServerConfig) -> str:
    """The config as the TOML `--config` reads (`streamtx config show`); the token is never written out."""
    lines = []
    for f in fields(config):
        key, value = _key(f), getattr(config, f.name)
        if f.name == "token":
            lines.append(f"# {key}: {'set, not shown' if value else 'none'}")
        elif value is None:
            lines.append(f"# {key}: off")
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, int | float):
            lines.append(f"{key} = {value!r}")
        else:
            lines.append(f"{key} = {json.dumps(str(value))}")
    return "\n".join(lines) + "\n"


def flags(**settings: Any) -> list[str]:
    """`streamtx serve` arguments for settings given by field name (None: left out), for servers started as a child."""
    by_name = {f.name: f for f in fields(ServerConfig)}
    argv: list[str] = []
    for name, value in settings.items():
        if name not in by_name:
            raise TypeError(f"flags: ServerConfig has no setting {name!r}")
        f = by_name[name]
        if value is None:
            continue
        if isinstance(value, bool):
            if value != f.default:
                argv.append(f.metadata["flag"])
            continue
        argv += [f.metadata["flag"], str(value)]
    return argv
