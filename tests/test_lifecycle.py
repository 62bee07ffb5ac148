"""Real processes: shutdown on signals, crashes of the front or a partition, restart, the data-dir lock.

Every test starts its own server (`python -m streamtx serve`) and looks at the
operating system's view of it: exit statuses, /proc, process command lines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamtx.server.embedded import EmbeddedServer
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import table_to_ipc

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 10.0  # deadline on every call: a dead partition must fail a call, never hang it
SC = grpc.StatusCode
_CODES = {code.value[0]: code for code in grpc.StatusCode}

APP = (
    "CREATE TABLE life_t (a BIGINT);\n"
    "CREATE STREAM life_s (a BIGINT);\n"
    "CREATE PROCEDURE life_p ON STREAM life_s AS BEGIN INSERT INTO life_t SELECT a FROM life_s; END;"
)


# --------------------------------------------------------------------------- processes


def proc_state(pid: int) -> str | None:
    """The /proc state letter of a process (R, S, Z, ...), or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def is_dead(pid: int) -> bool:
    return proc_state(pid) in (None, "Z", "X")


def wait_dead(pids: list[int], timeout: float) -> list[int]:
    """Waits until every pid is gone or a zombie; returns the ones still running."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if not is_dead(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def live_processes_mentioning(*texts: str) -> list[tuple[int, str]]:
    """Running (not zombie) processes whose command line contains every text."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        line = cmdline(pid)
        if line and all(t in line for t in texts) and not is_dead(pid):
            found.append((pid, line))
    return found


def workers_of(front_pid: int) -> list[tuple[int, str]]:
    return live_processes_mentioning("streamtx.server.partition.worker", f"--parent {front_pid} ")


class Launched:
    """`python -m streamtx serve` with its stderr kept in a file (EmbeddedServer lets it through)."""

    def __init__(self, data_dir: Path, partitions: int = 2) -> None:
        self.data_dir = data_dir
        self.stderr_path = data_dir.parent / f"{data_dir.name}.stderr"
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "port").unlink(missing_ok=True)
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamtx", "serve", "--port", "0", "--data-dir", str(data_dir)]
                + ["--partitions", str(partitions)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"server exited at start-up: {self.stderr()}"
            port = data_dir / "port"
            if port.exists() and port.read_text().strip():
                self.target = f"127.0.0.1:{port.read_text().strip()}"
                break
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        self.channel = grpc.insecure_channel(self.target)
        self.stub = pb_grpc.StreamTxStub(self.channel)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def launch(tmp_path):
    started: list[Launched] = []

    def start(name: str = "data", partitions: int = 2) -> Launched:
        srv = Launched(tmp_path / name, partitions)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.close()


def status(stub) -> pb.StatusResponse:
    return stub.Status(pb.StatusRequest(), timeout=TIMEOUT)


def push(stub, batch_id: int, values: list[int], producer: str = "life") -> pb.PushAck:
    req = pb.PushRequest(
        stream="life_s",
        producer_id=producer,
        batch_id=batch_id,
        data=pb.RowData(arrow_ipc=table_to_ipc(pa.table({"a": pa.array(values, pa.int64())}))),
    )
    return stub.Push(req, timeout=TIMEOUT)


def query(stub, sql: str) -> dict:
    resp = stub.Query(pb.QueryRequest(sql=sql), timeout=TIMEOUT)
    return pa.ipc.open_stream(resp.result.arrow_ipc).read_all().to_pydict()


def use(stub) -> None:
    """Deploys the app, pushes and queries, so the workers have state and work behind them."""
    stub.Deploy(pb.DeployRequest(sql=APP), timeout=TIMEOUT)
    assert push(stub, 1, [1, 2, 3]).outcome == pb.COMMITTED
    assert query(stub, "SELECT sum(a) AS s FROM life_t") == {"s": [6]}


# --------------------------------------------------------------------------- (a) orderly shutdown


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_the_server_and_every_worker(launch, sig):
    srv = launch(partitions=2)
    use(srv.stub)
    front = srv.proc.pid
    pids = [p.pid for p in status(srv.stub).partitions]
    assert len(pids) == 2 and all(p > 0 for p in pids)
    assert sorted(p for p, _ in workers_of(front)) == sorted(pids)
    assert all(p.alive for p in status(srv.stub).partitions)

    t0 = time.monotonic()
    srv.proc.send_signal(sig)
    rc = srv.proc.wait(timeout=15)
    took = time.monotonic() - t0
    assert rc == 0, srv.stderr()
    assert took < 5, took
    assert wait_dead(pids, 5) == []
    assert workers_of(front) == []
    assert live_processes_mentioning(str(srv.data_dir)) == []
    assert "Traceback" not in srv.stderr(), srv.stderr()
    # the data directory is free again: a new server starts on it
    again = launch(partitions=1)
    assert status(again.stub).tables == ["life_t"]


def test_sigterm_with_an_open_subscription_still_stops_promptly(launch):
    srv = launch(partitions=1)
    srv.stub.Deploy(pb.DeployRequest(sql="CREATE STREAM life_feed (a BIGINT);"), timeout=TIMEOUT)
    pids = [p.pid for p in status(srv.stub).partitions]
    sub = srv.stub.Subscribe(pb.SubscribeRequest(stream="life_feed"), timeout=60)
    ended: list[object] = []

    def drain() -> None:
        try:
            for batch in sub:
                ended.append(batch)
        except grpc.RpcError as e:
            ended.append(e.code())

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=15) == 0, srv.stderr()
    assert time.monotonic() - t0 < 8
    reader.join(10)
    assert not reader.is_alive()
    assert ended and ended[-1] in (SC.UNAVAILABLE, SC.CANCELLED), ended
    assert wait_dead(pids, 5) == []


# --------------------------------------------------------------------------- (b) the front crashes


def test_sigkill_of_the_front_kills_the_workers(tmp_path):
    srv = EmbeddedServer(tmp_path / "data", partitions=2).start()
    try:
        with grpc.insecure_channel(srv.target) as ch:
            stub = pb_grpc.StreamTxStub(ch)
            use(stub)
            pids = [p.pid for p in status(stub).partitions]
        front = srv.proc.pid
        assert len(pids) == 2 and not any(is_dead(p) for p in pids)
        srv.kill()
        assert wait_dead(pids, 5) == [], [(p, proc_state(p), cmdline(p)) for p in pids]
        assert workers_of(front) == []
        # the lock died with the front: a new server takes the data directory
        srv2 = EmbeddedServer(tmp_path / "data", partitions=1).start()
        try:
            with grpc.insecure_channel(srv2.target) as ch:
                assert status(pb_grpc.StreamTxStub(ch)).streams == ["life_s"]
        finally:
            assert srv2.stop() == 0
    finally:
        srv.close()


# --------------------------------------------------------------------------- (c) a worker crashes


def test_sigkill_of_a_worker_fails_calls_fast_and_the_server_stays_up(launch):
    srv = launch(partitions=2)
    use(srv.stub)
    parts = status(srv.stub).partitions
    victim = parts[0]
    survivor = parts[1].pid
    os.kill(victim.pid, signal.SIGKILL)
    assert wait_dead([victim.pid], 5) == []

    # Push: UNAVAILABLE naming the partition, quickly (as the call's status or as a REJECTED ack)
    t0 = time.monotonic()
    try:
        ack = push(srv.stub, 2, [4])
    except grpc.RpcError as e:
        code, message = e.code(), e.details()
    else:
        assert ack.outcome == pb.REJECTED, ack
        code, message = _CODES[ack.code], ack.reason
    assert code == SC.UNAVAILABLE, message
    assert "partition 0" in message, message
    assert time.monotonic() - t0 < 5

    # Query: UNAVAILABLE naming the partition
    with pytest.raises(grpc.RpcError) as info:
        srv.stub.Query(pb.QueryRequest(sql="SELECT * FROM life_t"), timeout=TIMEOUT)
    assert info.value.code() == SC.UNAVAILABLE
    assert "partition 0" in info.value.details()

    # Call and Deploy fail too, and Deploy changes nothing
    srv.stub.Status(pb.StatusRequest(), timeout=TIMEOUT)
    with pytest.raises(grpc.RpcError) as info:
        srv.stub.Deploy(pb.DeployRequest(sql="CREATE TABLE life_new (a INT);"), timeout=TIMEOUT)
    assert info.value.code() == SC.UNAVAILABLE
    assert "partition 0" in info.value.details()

    # Status still answers, and says which partition is dead and why
    st = status(srv.stub)
    assert "life_new" not in st.tables
    by_id = {p.id: p for p in st.partitions}
    assert not by_id[0].alive
    assert by_id[0].error and "partition 0" in by_id[0].error and str(victim.pid) in by_id[0].error
    assert by_id[1].alive and not by_id[1].error
    assert srv.proc.poll() is None

    # health reports the service NOT_SERVING (the front's watcher checks every 0.5 s)
    health = health_pb2_grpc.HealthStub(srv.channel)
    deadline = time.monotonic() + 5
    while True:
        resp = health.Check(health_pb2.HealthCheckRequest(service="streamtx.v1.StreamTx"), timeout=TIMEOUT)
        if resp.status == health_pb2.HealthCheckResponse.NOT_SERVING or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING

    # and it shuts down cleanly, taking the surviving worker with it
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=15) == 0, srv.stderr()
    assert wait_dead([survivor], 5) == []
    assert live_processes_mentioning(str(srv.data_dir)) == []


def test_pending_calls_fail_when_their_worker_dies(launch):
    """A call queued on a partition that dies gets UNAVAILABLE, not a hang."""
    srv = launch(partitions=1)
    srv.stub.Deploy(
        pb.DeployRequest(
            sql="CREATE PROCEDURE life_slow AS BEGIN SELECT count(*) AS n FROM range(3000000000) t(i) "
            "WHERE i % 7 = 3 AND hash(i) % 3 = 1; END;"
        ),
        timeout=TIMEOUT,
    )
    pid = status(srv.stub).partitions[0].pid
    fut = srv.stub.Call.future(pb.CallRequest(procedure="life_slow"), timeout=TIMEOUT)
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(grpc.RpcError) as info:
        fut.result()
    assert info.value.code() == SC.UNAVAILABLE, info.value.details()
    assert "partition 0" in info.value.details()


# --------------------------------------------------------------------------- (d) restart


def test_catalog_survives_a_restart(tmp_path):
    data = tmp_path / "data"
    with EmbeddedServer(data, partitions=1) as srv, grpc.insecure_channel(srv.target) as ch:
        stub = pb_grpc.StreamTxStub(ch)
        use(stub)
        stub.Deploy(
            pb.DeployRequest(
                sql="CREATE STREAM life_ws (x INTEGER);\nCREATE TABLE life_wt (n BIGINT);\n"
                "CREATE WINDOW life_w ON life_ws ROWS 2 SLIDE 1;\n"
                "CREATE PROCEDURE life_wp ON STREAM life_ws AS BEGIN "
                "INSERT INTO life_wt SELECT count(*) FROM life_w; END;\n"
                "CREATE PROCEDURE life_add (a BIGINT) AS BEGIN INSERT INTO life_t VALUES ($a); END;"
            ),
            timeout=TIMEOUT,
        )
        before = status(stub)
        assert srv.stop() == 0

    with EmbeddedServer(data, partitions=1) as srv, grpc.insecure_channel(srv.target) as ch:
        stub = pb_grpc.StreamTxStub(ch)
        after = status(stub)
        for field in ("tables", "streams", "windows", "procedures", "triggers"):
            assert list(getattr(after, field)) == list(getattr(before, field)), field
        assert list(after.tables) == ["life_t", "life_wt"]
        assert list(after.procedures) == ["life_add", "life_p", "life_wp"]
        assert all(p.alive for p in after.partitions)
        ack = push(stub, 1, [10, 20], producer="after-restart")
        assert ack.outcome == pb.COMMITTED, ack
        stub.Call(pb.CallRequest(procedure="life_add", params={"a": pb.Value(int_value=5)}), timeout=TIMEOUT)
        assert query(stub, "SELECT a FROM life_t WHERE a >= 5 ORDER BY a") == {"a": [5, 10, 20]}
        # and the new catalog can be changed again
        stub.Deploy(pb.DeployRequest(sql="DROP PROCEDURE life_add;"), timeout=TIMEOUT)
        assert "life_add" not in status(stub).procedures


# --------------------------------------------------------------------------- (e) the data-dir lock


def test_second_server_on_the_same_data_dir_exits_naming_it(launch):
    first = launch(partitions=1)
    use(first.stub)
    port_before = (first.data_dir / "port").read_text()
    second = subprocess.run(
        [sys.executable, "-m", "streamtx", "serve", "--port", "0", "--data-dir", str(first.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode != 0
    assert str(first.data_dir) in second.stderr, second.stderr
    assert "Traceback" not in second.stderr, second.stderr
    assert workers_of(first.proc.pid) != []  # the first server's workers are untouched
    # the first server is unharmed
    assert (first.data_dir / "port").read_text() == port_before
    assert first.proc.poll() is None
    assert push(first.stub, 2, [4]).outcome == pb.COMMITTED
    assert query(first.stub, "SELECT sum(a) AS s FROM life_t") == {"s": [10]}
    assert status(first.stub).tables == ["life_t"]
