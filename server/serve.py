"""`streamtx serve`: the front process with its gRPC server and partition workers.

Shutdown on SIGTERM or SIGINT is orderly: stop accepting calls, let in-flight
calls finish (a short grace period), stop every partition worker, release
the data directory. Workers also die with the front if it is killed, so no
process is ever left behind.
"""

from __future__ import annotations

import asyncio
import gc
import signal
from pathlib import Path
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from streamtx.errors import StreamTxError
from streamtx.server import log, pandas_probe, reflection, security
from streamtx.server.collector import Collector
from streamtx.server.config import ServerConfig
from streamtx.server.front import decoding
from streamtx.server.front.auth import TokenInterceptor
from streamtx.server.front.front import Front
from streamtx.server.front.metrics import serve_metrics
from streamtx.server.front.service import StreamTxService
from streamtx.server.launch import Launch, launch, lock_data_dir
from streamtx.v1 import streamtx_pb2 as pb

if TYPE_CHECKING:
    from streamtx.server.cluster.inputlog import InputLog
    from streamtx.server.cluster.replica import Replica, StartingHost

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["StreamTx"].full_name


class Behind(Exception):
    """A cluster host found the log trimmed past what it applied: it stopped, and starts again from the newest
    snapshot (`streamtx serve` runs itself anew)."""


class Server:
    """A running streamtx server (front + partitions), for the CLI and tests."""

    def __init__(self, config: ServerConfig, launched: Launch | None = None) -> None:
        self.config = config
        log.configure(config.log_format)
        self.front = Front(config, launched)
        self.port = 0
        self._grpc: grpc.aio.Server | None = None
        self._metrics: WSGIServer | None = None
        self.metrics_port: int | None = None
        self._health = health.aio.HealthServicer()
        self._stop = asyncio.Event()
        self.replica: Replica | None = None  # cluster mode (server/cluster/)
        self._cluster_tasks: list[asyncio.Task] = []
        self._starting: StartingHost | None = None
        self.front.supervisor.on_health = self._serving
        self.front.supervisor.on_fatal = lambda _: self._stop.set()

    async def start(self) -> None:
        try:
            tls, tokens = security.load_tls(self.config), security.load_tokens(self.config)
        except ValueError as e:  # `streamtx serve` checked them already: changed since
            raise SystemExit(f"streamtx: {e}") from None
        inputlog = await self._open_cluster_log() if self.config.cluster is not None else None
        await self.front.start()
        limit = self.config.max_message_bytes
        self._grpc = grpc.aio.server(
            interceptors=[TokenInterceptor(tokens)] if tokens else None,
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
            ],
        )
        service = StreamTxService(self.front)
        if inputlog is not None:
            self._join_cluster(service, inputlog)
        decoding.add_service(service, self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        reflection.enable(self._grpc, (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name))
        address = f"{self.config.host}:{self.config.port}"
        if tls is None:
            self.port = self._grpc.add_insecure_port(address)
        else:
            credentials = grpc.ssl_server_credentials(
                [(tls.private_key, tls.cert_chain)],
                root_certificates=tls.client_ca,
                require_client_auth=tls.client_ca is not None,
            )
            self.port = self._grpc.add_secure_port(address, credentials)
        if self.port == 0:
            raise SystemExit(f"streamtx: cannot listen on {self.config.host}:{self.config.port}")
        await self._grpc.start()
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.config.metrics_port is not None:
            try:
                self._metrics, self.metrics_port = serve_metrics(self.front, self.config.host, self.config.metrics_port)
            except OSError as e:
                raise SystemExit(
                    f"streamtx: cannot serve metrics on {self.config.host}:{self.config.metrics_port}: {e}"
                ) from None
            (Path(self.config.data_dir) / "metrics-port").write_text(f"{self.metrics_port}\n")
        if self.replica is not None:
            if self._starting is not None:
                self._starting.stop()  # the replica says where it is from now on
            address = f"{self.config.host}:{self.port}"
            self._cluster_tasks = [
                asyncio.create_task(self.replica.run()),
                asyncio.create_task(self.replica.keep_position(address)),
                asyncio.create_task(self.replica.log.hear_hosts(self.replica.heard)),
            ]
        (Path(self.config.data_dir) / "port").write_text(f"{self.port}\n")  # last: the server is up

    async def _open_cluster_log(self) -> InputLog:
        """Opens the cluster's log; installs the newest shared snapshot first if this host's own state cannot
        go on with it (cluster/snapshots.py), which needs the data directory locked and no partition started."""
        from streamtx.server.cluster.inputlog import InputLog  # nats-py: only in cluster mode
        from streamtx.server.cluster.replica import StartingHost
        from streamtx.server.cluster.snapshots import catch_up

        assert self.config.cluster is not None and self.config.host_id is not None
        inputlog = InputLog(self.config.cluster, self.config.cluster_log, self.config.log_replicas)
        host, data_dir = self.config.host_id, Path(self.config.data_dir)
        self._starting = starting = StartingHost(inputlog, host)
        try:
            await inputlog.open()
            if self.front.launched is None:
                lock = lock_data_dir(data_dir)
                try:
                    await catch_up(
                        inputlog, data_dir, self.config.host_id, self.config.partitions, self._starting.announce
                    )
                except BaseException:
                    lock.close()
                    raise
                self.front.launched = launch(self.config, lock)
        except StreamTxError as e:
            starting.stop()
            await inputlog.close()
            raise SystemExit(f"streamtx: {e.message}") from None
        return inputlog

    def _join_cluster(self, service: StreamTxService, inputlog: InputLog) -> None:
        """The service then sends every request that changes state through the log."""
        from streamtx.server.cluster.replica import Replica

        assert self.config.host_id is not None
        try:
            self.replica = Replica(service, inputlog, self.config.host_id, Path(self.config.data_dir))
        except StreamTxError as e:
            raise SystemExit(f"streamtx: {e.message}") from None
        self.replica.on_fatal = self._stop.set
        service.replica = self.replica

    async def stop(self, grace: float = 2.0) -> None:
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.shutdown)
            self._metrics.server_close()
        if self._grpc is not None:
            await self._grpc.stop(grace)
        for task in self._cluster_tasks:
            task.cancel()
        if self.replica is not None:
            await asyncio.gather(*self._cluster_tasks, return_exceptions=True)
            self.replica.save()
            await self.replica.log.close()
        await self.front.stop()

    def _serving(self, serving: bool) -> None:
        """Health follows the partitions: NOT_SERVING while they are restarted (front/supervisor.py)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            asyncio.ensure_future(self._health.set(name, status))

    async def run_until_signalled(self) -> None:
        """Serves until SIGTERM/SIGINT, or until the partitions cannot be kept running (SystemExit then)."""
        stop = self._stop
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        transport = "plaintext" if self.config.tls_cert is None else "TLS"
        if self.config.tls_client_ca is not None:
            transport = "mutual TLS"
        listening = (
            f"{self.config.executor} server listening on {self.config.host}:{self.port} "
            f"({self.config.partitions} partition(s), data in {self.config.data_dir}, {transport}, "
            f"{'tokens required' if self.config.token or self.config.tokens_file else 'no token required'})"
        )
        if self.config.log_format == "json":
            log.event(
                "start",
                listening,
                host=self.config.host,
                port=self.port,
                partitions=self.config.partitions,
                data_dir=self.config.data_dir,
                metrics_port=self.metrics_port,
                transport=transport,
                tokens=bool(self.config.token or self.config.tokens_file),
            )
        else:
            print(f"streamtx {listening}", flush=True)
        periodic = asyncio.create_task(self.front.checkpoint_periodically())
        collecting = asyncio.create_task(Collector().run_on_loop())
        balancing = asyncio.create_task(self.front.rebalance_automatically())
        await stop.wait()
        periodic.cancel()
        balancing.cancel()
        collecting.cancel()
        log.event("shutdown", "shutting down")
        await self.stop()
        failure = self.front.supervisor.failure or (self.replica.failure if self.replica is not None else None)
        if self.replica is not None and self.replica.behind:
            raise Behind(failure or "behind the cluster log")
        if failure is not None:
            raise SystemExit(f"streamtx: stopped: {failure}")


def serve(config: ServerConfig, launched: Launch | None = None) -> None:
    """Runs a server until SIGTERM/SIGINT; uses uvloop unless told not to."""
    pandas_probe.skip()
    try:
        _run(Server(config, launched), config.uvloop)
    finally:
        gc.collect()  # release DuckDB objects before interpreter teardown


def _run(server: Server, use_uvloop: bool) -> None:
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            uvloop = None
        if uvloop is not None:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(server.run_until_signalled())
            return
    asyncio.run(server.run_until_signalled())
