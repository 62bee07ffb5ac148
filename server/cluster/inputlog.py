"""The input log of cluster mode: one JetStream stream that every host appends to and applies in order.

The stream's order is the cluster's order: a host never runs a push, call or
deploy it received itself; it appends the request to the log and runs it when
its own reading of the log reaches it, as every other host does
(cluster/replica.py). JetStream orders, stores and replicates the entries
(`--log-replicas` copies, a write acknowledged once a majority of them holds
it); nothing of that is done here.

An entry is the request as its client sent it (protobuf bytes) with two
headers: its kind and, for the host waiting to answer it, its origin. A
request larger than a NATS message (`max_payload`) goes beside the log: its
bytes are stored whole in a JetStream object store first (`ENTRIES_BUCKET`,
replicated like the log, SHA-256 checked on reading), then an entry naming
the object is appended, so it lands at one position like any other; every
host reads the object when it reaches the entry. Trimming the log deletes
the objects of the entries it drops.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.errors import OutboundBufferLimitError
from nats.js import api
from nats.js.errors import NotFoundError

from streamtx.errors import FailedPrecondition, Unavailable
from streamtx.server import log
from streamtx.server.cluster.snapshots import SnapshotInfo

KINDS = ("push", "call", "deploy", "verify", "migrate")
RECONNECT_WAIT = 30.0
"""Seconds an append waits for the log to be writable again (NATS reconnected, a leader elected) before its
request is UNAVAILABLE."""
ACK_TIMEOUT = 5.0
"""Seconds JetStream has to acknowledge an append; past that the append counts as failed."""
HEADROOM = 512
"""Bytes an entry's headers and subject may take beside its body."""
KIND, ORIGIN, BODY = "Streamtx-Kind", "Streamtx-Origin", "Streamtx-Body"
"""Headers of an entry: its kind, its origin, and the object holding its body when it is not in the entry."""
ENTRIES_BUCKET = "streamtx_entries"
"""A JetStream object store holding the bodies of entries too large for a NATS message, object
`<cluster>.<origin>`."""
HOSTS_BUCKET = "streamtx_hosts"
"""A KV bucket where each host says how far it has applied the log (`streamtx cluster status`), key
`<cluster>.<host>`."""
CHECKS_BUCKET = "streamtx_checks"
"""A KV bucket where each host puts its state's digest at a `verify` entry, key `<cluster>.<position>.<host>`;
entries expire after CHECKS_KEPT_S."""
CHECKS_KEPT_S = 24 * 3600.0
SNAPSHOTS_BUCKET = "streamtx_snapshots"
"""A JetStream object store where each host keeps its newest checkpoint (cluster/snapshots.py), object
`<cluster>.<host>`."""
LIVE_WITHIN_S = 10.0
"""A host heard from within this many seconds is live: it holds the log's trimming back, and is expected to put
its digest at a `verify` entry."""
QUIET_S = 5.0
"""Seconds without any host's announcement after which a watch of them is taken for stale and started again
(the watching host itself announces every second)."""


class Heard:
    """When this process last heard each host announce itself, on its own monotonic clock.

    How far the log may be trimmed depends on which hosts are live; counted
    so, it needs no two hosts' clocks to agree. Every host already announced
    when a watch starts counts as heard then, so none is taken for gone
    before it has had `LIVE_WITHIN_S` seconds to speak.
    """

    def __init__(self) -> None:
        self._at: dict[str, float] = {}

    def saw(self, host: str, at: float | None = None) -> None:
        self._at[host] = time.monotonic() if at is None else at

    def live(self, within: float = LIVE_WITHIN_S, now: float | None = None) -> set[str]:
        now = time.monotonic() if now is None else now
        return {h for h, at in self._at.items() if now - at < within}


class LogGap(Exception):
    """The log skipped entries this host has not applied, or lost a body beside it: it was trimmed past this
    host's position."""


@dataclass(frozen=True)
class Entry:
    seq: int  # the entry's position in the log, from 1
    kind: str
    origin: str  # "host:incarnation:n" of the host waiting for its answer; "" for none
    body: bytes


class InputLog:
    """The connection to the cluster's log: append, read in order from a position, and the hosts' registry."""

    def __init__(self, servers: str, name: str, replicas: int) -> None:
        self.servers = [s.strip() for s in servers.split(",") if s.strip()]
        self.name = name
        self.subject = f"streamtx.{name}.log"
        self.replicas = replicas
        self._nc: Any = None
        self._js: Any = None
        self._hosts: Any = None
        self._checks: Any = None
        self._snapshots: Any = None
        self._bodies: Any = None
        self._beside: dict[int, str] = {}  # position -> object, of the entries read whose body is beside the log
        self.created = ""  # when JetStream created the log: a log deleted and made anew has other positions
        self.on_disconnect: list[Callable[[], None]] = []
        """Called when the connection to NATS breaks: appends not yet acknowledged may be lost."""
        self._writable = asyncio.Event()
        self._writable.set()
        self._probing: asyncio.Task | None = None

    async def open(self, timeout: float = 30.0, create: bool = True) -> None:
        """Connects and makes sure the log exists (creating it with `replicas` copies if not and `create`)."""
        try:
            self._nc = await asyncio.wait_for(
                nats.connect(
                    servers=self.servers,
                    name=f"streamtx {self.name}",
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    allow_reconnect=True,
                    error_cb=self._error,
                    disconnected_cb=self._disconnected,
                    reconnected_cb=self._reconnected,
                ),
                timeout,
            )
        except Exception as e:
            raise Unavailable(f"cluster log {', '.join(self.servers)}: cannot connect to NATS: {e}") from None
        self._js = self._nc.jetstream(timeout=10.0)
        config = api.StreamConfig(
            name=self.stream_name,
            subjects=[self.subject],
            storage=api.StorageType.FILE,
            num_replicas=self.replicas,
            retention=api.RetentionPolicy.LIMITS,
            discard=api.DiscardPolicy.NEW,  # a full log refuses appends; it never drops entries not yet applied
        )
        deadline = asyncio.get_running_loop().time() + timeout
        while True:  # a cluster just started elects its JetStream leader first
            try:
                await self._ensure(config, create)
                break
            except FailedPrecondition:
                raise
            except Exception as e:
                if asyncio.get_running_loop().time() > deadline:
                    raise Unavailable(
                        f"cluster log {self.stream_name}: JetStream did not take it within {timeout:g} s: {e}"
                    ) from None
                await asyncio.sleep(0.5)

    async def _error(self, e: Exception) -> None:
        log.event("cluster_nats_error", f"NATS: {type(e).__name__}: {e}", level="warning")

    async def _disconnected(self) -> None:
        log.event("cluster_nats_disconnected", "disconnected from NATS; reconnecting", level="warning")
        self._suspect()
        for callback in self.on_disconnect:
            callback()

    async def _reconnected(self) -> None:
        url = self._nc.connected_url.netloc if self._nc and self._nc.connected_url else "?"
        log.event("cluster_nats_reconnected", f"reconnected to NATS at {url}")

    async def _ensure(self, config: api.StreamConfig, create: bool) -> None:
        try:
            info = await self._js.stream_info(self.stream_name)
            self.created = str(info.created)
        except NotFoundError:
            if not create:
                raise FailedPrecondition(
                    f"cluster log {self.stream_name}: no such JetStream stream on {', '.join(self.servers)}; no "
                    f"host of cluster {self.name!r} has started"
                ) from None
            made = await self._js.add_stream(config)  # refused while a new cluster places its peers: retried
            self.created = str(made.created)
        else:
            if create and info.config.num_replicas != self.replicas:
                raise FailedPrecondition(
                    f"--log-replicas {self.replicas}: the cluster's log {self.stream_name} exists with "
                    f"{info.config.num_replicas} replica(s); start every host with --log-replicas "
                    f"{info.config.num_replicas}"
                )
        self._hosts = await self._bucket(api.KeyValueConfig(bucket=HOSTS_BUCKET, history=1, replicas=self.replicas))
        self._checks = await self._bucket(
            api.KeyValueConfig(bucket=CHECKS_BUCKET, history=1, replicas=self.replicas, ttl=CHECKS_KEPT_S)
        )
        self._snapshots = await self._object_store(SNAPSHOTS_BUCKET)
        self._bodies = await self._object_store(ENTRIES_BUCKET)

    async def _object_store(self, bucket: str) -> Any:
        try:
            return await self._js.object_store(bucket)
        except Exception:
            config = api.ObjectStoreConfig(replicas=self.replicas, storage=api.StorageType.FILE)
            return await self._js.create_object_store(bucket, config=config)

    async def _bucket(self, config: api.KeyValueConfig) -> Any:
        try:
            return await self._js.key_value(config.bucket)
        except Exception:
            return await self._js.create_key_value(config)

    @property
    def stream_name(self) -> str:
        return f"STREAMTX_{self.name.upper()}"

    @property
    def max_entry_bytes(self) -> int:
        """The largest request body one entry holds (NATS's max_payload, less the headers' room)."""
        return int(self._nc.max_payload) - HEADROOM

    async def append(self, kind: str, body: bytes, origin: str) -> asyncio.Future:
        """Queues the entry on the connection (in call order); the future is JetStream's acknowledgement. A body
        too large for one entry is stored beside the log first (the call returns once it is)."""
        if kind not in KINDS:
            raise ValueError(f"cluster log: no entry kind {kind!r} (kinds: {', '.join(KINDS)})")
        headers = {KIND: kind, ORIGIN: origin}
        if len(body) > self.max_entry_bytes:
            headers[BODY] = await self._put_body(body, origin)
            body = b""
        try:
            return await self._publish(body, headers)
        except Unavailable:
            if BODY in headers:  # not appended: nothing will read it
                await self._drop_bodies([headers[BODY]])
            raise

    async def _put_body(self, body: bytes, origin: str) -> str:
        name = f"{self.name}.{origin or secrets.token_hex(8)}"
        try:
            await self._bodies.put(name, body)
        except Exception as e:
            raise Unavailable(
                f"cluster log {self.stream_name}: cannot store a body of {len(body):,} bytes beside the log: "
                f"{type(e).__name__}: {e}"
            ) from None
        return name

    async def _drop_bodies(self, names: list[str]) -> None:
        for name in names:
            try:
                await self._bodies.delete(name)
            except Exception as e:  # gone already (another host trimmed too), or NATS away: left behind
                log.event("cluster_body_kept", f"entry body {name} not deleted: {e}", level="debug")

    async def _publish(self, body: bytes, headers: dict[str, str]) -> asyncio.Future:
        deadline = time.monotonic() + RECONNECT_WAIT
        if not self._writable.is_set():
            try:
                await asyncio.wait_for(self._writable.wait(), RECONNECT_WAIT)
            except TimeoutError:
                raise Unavailable(
                    f"cluster log {self.stream_name}: not writable for {RECONNECT_WAIT:g} s (no NATS server "
                    "reachable, or no leader elected for the log)"
                ) from None
        while True:
            try:
                acked = await self._js.publish_async(self.subject, body, wait_stall=5.0, headers=headers)
            except OutboundBufferLimitError:  # reconnecting, its buffer full: nothing was sent, so wait and resend
                if time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    continue
                raise Unavailable(
                    f"cluster log {self.stream_name}: no NATS server reachable for {RECONNECT_WAIT:g} s"
                ) from None
            except Exception as e:
                raise Unavailable(f"cluster log {self.stream_name}: cannot append: {type(e).__name__}: {e}") from None
            timer = asyncio.get_running_loop().call_later(ACK_TIMEOUT, _expire, acked)
            acked.add_done_callback(lambda f, timer=timer: timer.cancel() or self._check(f))
            return acked

    def _check(self, acked: asyncio.Future) -> None:
        """A refused or unanswered append: the log may have lost its leader; new appends wait for a new one."""
        if acked.cancelled() or acked.exception() is not None:
            self._suspect()

    def _suspect(self) -> None:
        if not self._writable.is_set():
            return
        self._writable.clear()
        log.event("cluster_log_unwritable", f"cluster log {self.stream_name}: appends fail; waiting", level="warning")
        self._probing = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        """Until the log's leader answers again (a stream's info comes from its leader)."""
        quick = self._nc.jetstream(timeout=1.0)
        while True:
            try:
                await quick.stream_info(self.stream_name)
                break
            except Exception:
                await asyncio.sleep(0.2)
        log.event("cluster_log_writable", f"cluster log {self.stream_name}: writable again")
        self._writable.set()

    async def entries(self, start: int) -> AsyncIterator[Entry]:
        """Every entry from position `start`, in log order, waiting for new ones as they come."""
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
        sub = await self._js.subscribe(self.subject, ordered_consumer=True, config=config, idle_heartbeat=2.0)
        try:
            async for msg in sub.messages:
                headers, seq, body = msg.headers or {}, msg.metadata.sequence.stream, msg.data
                if BODY in headers:
                    body = await self._body(seq, headers[BODY])
                yield Entry(seq, headers.get(KIND, ""), headers.get(ORIGIN, ""), body)
        finally:
            await sub.unsubscribe()

    async def _body(self, seq: int, name: str) -> bytes:
        """The body of the entry at `seq`, stored beside the log (waiting while NATS is away)."""
        while True:
            try:
                body = (await self._bodies.get(name)).data
                self._beside[seq] = name
                return body
            except NotFoundError:
                raise LogGap(
                    f"the body of cluster log entry {seq} ({name}) is gone: the log was trimmed past it while this "
                    "host was not heard from; it starts again from the newest snapshot"
                ) from None
            except Exception as e:
                log.event("cluster_body_failed", f"reading the body of entry {seq}: {e}", level="warning")
                await asyncio.sleep(1.0)

    async def status(self) -> dict[str, Any]:
        """The log, every host that announced itself (with how far behind the log's end it is), and the hosts'
        shared snapshots."""
        info, hosts = await self.info(), await self.hosts()
        now = time.time()
        for record in hosts.values():
            record["lag"] = max(info["last"] - int(record.get("applied", 0)), 0)
            record["seen_seconds_ago"] = round(max(now - float(record.get("time", now)), 0.0), 1)
        snapshots = sorted(await self.snapshots(), key=lambda i: i.host)
        bodies = await self._objects(self._bodies)
        info["beside"] = {"bodies": len(bodies), "bytes": sum(o.size or 0 for o in bodies)}
        return {"log": info, "hosts": [hosts[h] for h in sorted(hosts)], "snapshots": [vars(i) for i in snapshots]}

    async def _objects(self, store: Any) -> list[Any]:
        """This cluster's objects in `store` (its names start `<cluster>.`)."""
        try:
            objects = await store.list()
        except Exception:  # nats-py raises NotFoundError for an empty store
            return []
        return [o for o in objects if o.name.startswith(f"{self.name}.") and not o.deleted]

    async def info(self) -> dict[str, Any]:
        """The log's position and its copies: last entry, bytes, leader and replicas with their lag."""
        info = await self._js.stream_info(self.stream_name)
        cluster = info.cluster
        copies = []
        if cluster is not None:
            copies.append({"name": cluster.leader, "leader": True, "current": True, "lag": 0})
            for r in cluster.replicas or []:
                copies.append({"name": r.name, "leader": False, "current": bool(r.current), "lag": r.lag or 0})
        return {
            "stream": self.stream_name,
            "entries": info.state.messages,
            "first": info.state.first_seq,
            "last": info.state.last_seq,
            "bytes": info.state.bytes,
            "replicas": info.config.num_replicas,
            "copies": copies,
        }

    async def first(self) -> int:
        """The position of the log's first entry (its last + 1 when it holds none: trimmed, or new)."""
        info = await self._js.stream_info(self.stream_name)
        return max(int(info.state.first_seq), 1)

    async def trim(self, through: int) -> None:
        """Drops every entry up to position `through` (a no-op for entries dropped already), and the bodies
        beside the log of those this host read."""
        await self._js.purge_stream(self.stream_name, seq=through + 1)
        dropped = sorted(seq for seq in self._beside if seq <= through)
        await self._drop_bodies([self._beside.pop(seq) for seq in dropped])

    async def put_snapshot(self, info: SnapshotInfo, path: Path) -> None:
        """Stores the file at `path` as `info.host`'s snapshot, replacing its previous one."""
        meta = api.ObjectMeta(name=f"{self.name}.{info.host}", description=info.to_json())
        with open(path, "rb") as f:
            await self._snapshots.put(meta.name, f, meta=meta)

    async def snapshots(self) -> list[SnapshotInfo]:
        """Every host's stored snapshot of this cluster."""
        return [SnapshotInfo.from_json(o.description) for o in await self._objects(self._snapshots) if o.description]

    async def fetch_snapshot(self, host: str, path: Path) -> None:
        """Writes `host`'s stored snapshot to `path` (its SHA-256 checked by the object store)."""
        with open(path, "wb") as f:
            await self._snapshots.get(f"{self.name}.{host}", writeinto=f)
            f.flush()
            os.fsync(f.fileno())

    async def announce(self, host: str, record: dict[str, Any]) -> None:
        await self._hosts.put(f"{self.name}.{host}", json.dumps(record).encode())

    async def hear_hosts(self, heard: Heard) -> None:
        """Tells `heard` of every host's announcement as it arrives, until cancelled; a watch that breaks, or
        hears nothing for QUIET_S seconds, is started again."""
        prefix = f"{self.name}."
        while True:
            watcher = None
            try:
                watcher = await self._hosts.watch(f"{prefix}>")
                while True:
                    entry = await watcher.updates(timeout=QUIET_S)
                    if entry is not None and entry.operation is None and entry.key.startswith(prefix):
                        heard.saw(entry.key[len(prefix) :])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # quiet (nats TimeoutError) or NATS away: watch again
                if not isinstance(e, nats.errors.TimeoutError):
                    log.event("cluster_watch_failed", f"watching the hosts' announcements: {e}", level="warning")
                await asyncio.sleep(1.0)
            finally:
                if watcher is not None:
                    try:
                        await watcher.stop()
                    except Exception:  # the connection is gone with it
                        pass

    async def hosts(self) -> dict[str, dict[str, Any]]:
        """What each host of this cluster last said of itself (`announce`), by host."""
        return await _records(self._hosts, f"{self.name}.")

    async def live_hosts(self, within: float = LIVE_WITHIN_S) -> set[str]:
        """The hosts that announced themselves within the last `within` seconds."""
        return {h for h, r in (await self.hosts()).items() if time.time() - float(r.get("time", 0)) < within}

    async def report(self, seq: int, host: str, record: dict[str, Any]) -> None:
        """A host's state digest at the `verify` entry at position `seq`."""
        await self._checks.put(f"{self.name}.{seq}.{host}", json.dumps(record).encode())

    async def reports(self, seq: int, wait: float, live_within: float = LIVE_WITHIN_S) -> dict[str, dict[str, Any]]:
        """The hosts' digests at the `verify` entry at `seq`, by host: once every host heard from within
        `live_within` seconds has put its own, or after `wait` seconds with those that came."""
        deadline = time.monotonic() + wait
        while True:
            live = await self.live_hosts(live_within)
            reports = await _records(self._checks, f"{self.name}.{seq}.")
            if live <= set(reports) or time.monotonic() > deadline:
                return reports
            await asyncio.sleep(0.25)

    async def delete(self) -> None:
        """Removes the log and every entry in it (a benchmark's scratch log; never a cluster's own)."""
        await self._js.delete_stream(self.stream_name)
        await self._drop_bodies([o.name for o in await self._objects(self._bodies)])

    async def close(self) -> None:
        if self._nc is not None:
            try:
                await self._nc.drain()
            except Exception:
                await self._nc.close()


def _expire(acked: asyncio.Future) -> None:
    if not acked.done():
        acked.set_exception(TimeoutError(f"no acknowledgement within {ACK_TIMEOUT:g} s"))


async def _records(bucket: Any, prefix: str) -> dict[str, dict[str, Any]]:
    """The JSON values of a KV bucket's keys under `prefix`, by the rest of the key."""
    try:
        keys = await bucket.keys()  # nats-py 2.16's `filters=` finds no keys: filtered here
    except Exception:  # nats-py raises NoKeysError for an empty bucket
        return {}
    out = {}
    for key in keys:
        if key.startswith(prefix):
            entry = await bucket.get(key)
            out[key[len(prefix) :]] = json.loads(entry.value)
    return out
