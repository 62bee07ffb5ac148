"""The connector's options, read and checked once on the driver."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from streamtx.client.async_client import targets_of
from streamtx.client.spark.rpc import Conn
from streamtx.errors import FailedPrecondition, InvalidArgument

DEFAULT_TARGET = "127.0.0.1:7411"
KNOWN = {
    "target",
    "stream",
    "chunk_rows",
    "stage_copies",
    "batch_size",
    "producer_id",
    "first_batch_id",
    "on_rejected",
    "starting_ts",
    "timeout",
    "checkpointlocation",
    "path",
    "token",
    "tls_ca",
    "tls_cert",
    "tls_key",
}
ON_REJECTED = ("fail", "log")


@dataclass(frozen=True)
class Options:
    target: str
    stream: str
    chunk_rows: int = 65_536
    stage_copies: int = 1  # hosts each task stages its rows on (a commit needs one host holding every part)
    batch_size: int = 0  # batch sink: 0 = the whole DataFrame is one atomic batch
    producer_id: str = ""
    first_batch_id: int = 1
    on_rejected: str = "log"
    starting_ts: int = 0
    timeout_s: float = 60.0
    checkpoint: str = ""
    token: str | None = field(default=None, repr=False)
    # PEM, read from the options' paths on the driver: the executors need no copy of the files
    tls_ca: bytes | None = field(default=None, repr=False)
    tls_cert: bytes | None = field(default=None, repr=False)
    tls_key: bytes | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - KNOWN)
        if unknown:
            raise InvalidArgument(
                f"streamtx: unknown option(s) {', '.join(map(repr, unknown))} (options: {', '.join(sorted(KNOWN))})"
            )
        stream = opts.get("stream") or opts.get("path") or ""
        if not stream:
            raise InvalidArgument('streamtx: option "stream" is required: .option("stream", "<stream name>")')
        on_rejected = opts.get("on_rejected", "log")
        if on_rejected not in ON_REJECTED:
            raise InvalidArgument(f"streamtx: on_rejected must be one of {', '.join(ON_REJECTED)}, got {on_rejected!r}")
        target = opts.get("target") or os.environ.get("STREAMTX_TARGET") or DEFAULT_TARGET
        try:
            hosts = len(targets_of(target))
        except ValueError as e:
            raise InvalidArgument(f"streamtx: option 'target': {e}") from None
        return cls(
            target=target,
            stream=stream,
            chunk_rows=_int(opts, "chunk_rows", 65_536, 1),
            stage_copies=min(_int(opts, "stage_copies", 2, 1), hosts),
            batch_size=_int(opts, "batch_size", 0, 0),
            producer_id=opts.get("producer_id", ""),
            first_batch_id=_int(opts, "first_batch_id", 1, 1),
            on_rejected=on_rejected,
            starting_ts=_int(opts, "starting_ts", 0, 0),
            timeout_s=float(opts.get("timeout", 60.0)),
            checkpoint=opts.get("checkpointlocation", ""),
            token=opts.get("token") or os.environ.get("STREAMTX_TOKEN") or None,
            tls_ca=_pem(opts, "tls_ca"),
            tls_cert=_pem(opts, "tls_cert"),
            tls_key=_pem(opts, "tls_key"),
        )

    @property
    def targets(self) -> list[str]:
        return targets_of(self.target)

    def conn(self, target: str | None = None, **kwargs: float) -> Conn:
        """A connection to the server (or to one `target` of several) with these options' token and TLS files
        (`kwargs`: Conn's timeouts)."""
        return Conn(
            target or self.target,
            token=self.token,
            tls_ca=self.tls_ca,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            **kwargs,
        )


def _pem(opts: Mapping[str, str], name: str) -> bytes | None:
    """The PEM file an option names (default: env STREAMTX_<NAME>), read now; None if neither is given."""
    path = opts.get(name) or os.environ.get(f"STREAMTX_{name.upper()}")
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise InvalidArgument(f"streamtx: option {name!r}: cannot read {path}: {e.strerror or e}") from None


def _int(opts: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"streamtx: option {name!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise InvalidArgument(f"streamtx: option {name!r} must be >= {minimum}, got {value}")
    return value


def read_schema(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))


def query_id_from_checkpoint(checkpoint: str) -> str:
    """The streaming query's id, from its checkpoint (for a micro-batch no task wrote)."""
    if not checkpoint:
        raise FailedPrecondition(
            "streamtx: a micro-batch without tasks needs the query id; set the checkpointLocation option"
        )
    path = Path(checkpoint.removeprefix("file://").removeprefix("file:")) / "metadata"
    try:
        return json.loads(path.read_text().splitlines()[0])["id"]
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise FailedPrecondition(f"streamtx: cannot read the query id from {path}: {e}") from None


__all__ = ["Options", "query_id_from_checkpoint", "read_schema"]
