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

import grpc
import pyarrow as pa
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import Launched, cmdline, is_dead, live_processes_mentioning, proc_state, wait_dead, workers_of

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


@pytest.fixture
def launch(tmp_path):
    started: list[Launched] = []

    def start(name: str = "data", partitions: int = 2, extra: list[str] | None = None) -> Launched:
        srv = Launched(tmp_path / name, partitions, extra)
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
    again = launch(partitions=2)
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
        srv2 = EmbeddedServer(tmp_path / "data", partitions=2).start()
        try:
            with grpc.insecure_channel(srv2.target) as ch:
                assert status(pb_grpc.StreamTxStub(ch)).streams == ["life_s"]
        finally:
            assert srv2.stop() == 0
    finally:
        srv.close()


# --------------------------------------------------------------------------- (c) a worker crashes


def test_sigkill_of_a_worker_restarts_the_workers_and_nothing_fails(launch):
    srv = launch(partitions=2)
    use(srv.stub)
    parts = status(srv.stub).partitions
    victim = parts[0]
    os.kill(victim.pid, signal.SIGKILL)
    assert wait_dead([victim.pid], 5) == []

    # the next push, query, call and deploy are served (they wait while the workers restart)
    assert push(srv.stub, 2, [4]).outcome == pb.COMMITTED
    assert query(srv.stub, "SELECT sum(a) AS s FROM life_t") == {"s": [10]}
    srv.stub.Deploy(pb.DeployRequest(sql="CREATE TABLE life_new (a INT);"), timeout=TIMEOUT)

    st = status(srv.stub)
    assert "life_new" in st.tables
    assert all(p.alive and not p.error for p in st.partitions)
    assert victim.pid not in {p.pid for p in st.partitions}
    assert st.counters["restarts"] == 1
    log = srv.stderr()
    assert f"partition 0 (pid {victim.pid}) died: killed by signal 9; restarting the partition workers" in log
    assert "partitions recovered" in log
    health = health_pb2_grpc.HealthStub(srv.channel)
    resp = health.Check(health_pb2.HealthCheckRequest(service="streamtx.v1.StreamTx"), timeout=TIMEOUT)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING

    # and it shuts down cleanly, taking the new workers with it
    workers = [p.pid for p in st.partitions]
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=15) == 0, srv.stderr()
    assert wait_dead(workers, 5) == []
    assert live_processes_mentioning(str(srv.data_dir)) == []


def test_a_pending_call_is_run_by_the_restarted_worker(launch):
    """A call queued on a worker that dies before committing it is run by its successor, once."""
    srv = launch(partitions=1)
    srv.stub.Deploy(
        pb.DeployRequest(
            sql=APP + "\nCREATE PROCEDURE life_slow AS BEGIN INSERT INTO life_t "
            "SELECT count(*) FROM range(60000000) t(i) WHERE hash(i) % 3 = 1; END;"
        ),
        timeout=TIMEOUT,
    )
    pid = status(srv.stub).partitions[0].pid
    fut = srv.stub.Call.future(pb.CallRequest(procedure="life_slow"), timeout=120)
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    assert fut.result().timestamp > 0
    rows = query(srv.stub, "SELECT a FROM life_t")["a"]
    assert len(rows) == 1 and rows[0] > 0
    assert "1 request(s) sent again" in srv.stderr()


def test_a_worker_that_keeps_dying_stops_the_server_with_the_reason(launch):
    srv = launch(partitions=2, extra=["--max-restarts", "2"])
    use(srv.stub)
    for _ in range(3):
        deadline = time.monotonic() + 60
        while not all(p.alive and not p.error for p in status(srv.stub).partitions):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(status(srv.stub).partitions[1].pid, signal.SIGKILL)
    assert srv.proc.wait(timeout=60) == 1
    log = srv.stderr()
    assert "restarted 2 times in the last 60 s (--max-restarts 2), so the server stops" in log
    assert "streamtx: stopped: partition 1" in log
    assert live_processes_mentioning(str(srv.data_dir)) == []


def test_with_durability_off_a_dead_worker_stops_the_server(launch):
    srv = launch(partitions=2, extra=["--durability", "off"])
    use(srv.stub)
    os.kill(status(srv.stub).partitions[0].pid, signal.SIGKILL)
    with pytest.raises(grpc.RpcError) as info:
        for batch_id in range(2, 200):
            push(srv.stub, batch_id, [1])
            time.sleep(0.02)
    assert info.value.code() == SC.UNAVAILABLE
    assert srv.proc.wait(timeout=60) == 1
    assert "with --durability off no log holds its state, so the server stops" in srv.stderr()


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


def test_a_data_dir_keeps_its_partitions_another_count_is_refused_and_none_given_follows_it(tmp_path):
    data = tmp_path / "data"
    keyed = (
        "CREATE TABLE life_kt (k BIGINT PRIMARY KEY, v BIGINT) PARTITION BY k;\n"
        "CREATE STREAM life_ks (k BIGINT, v BIGINT) PARTITION BY k;\n"
        "CREATE PROCEDURE life_kp ON STREAM life_ks AS BEGIN INSERT INTO life_kt SELECT k, v FROM life_ks; END;"
    )
    with EmbeddedServer(data, partitions=2) as srv, grpc.insecure_channel(srv.target) as ch:
        stub = pb_grpc.StreamTxStub(ch)
        stub.Deploy(pb.DeployRequest(sql=keyed), timeout=TIMEOUT)
        for k in range(20):
            rows = pb.RowData(arrow_ipc=table_to_ipc(pa.table({"k": [k], "v": [k]})))
            req = pb.PushRequest(stream="life_ks", producer_id="keys", batch_id=k + 1, data=rows)
            assert stub.Push(req, timeout=TIMEOUT).outcome == pb.COMMITTED
    logs = sorted((p.name, p.stat().st_size) for p in data.rglob("*") if p.is_file() and p.name != "LOCK")
    for argv in (["--partitions", "1"], ["--partitions", "3"], ["--partitions", "2", "--bins", "64"]):
        other = subprocess.run(
            [sys.executable, "-m", "streamtx", "serve", "--port", "0", "--data-dir", str(data), *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.returncode != 0, argv
        assert f"{' '.join(argv[-2:])}: data directory {data} holds 2 partition(s) over 1024 bins" in other.stderr
        assert "Traceback" not in other.stderr, other.stderr
    # refused before anything was touched
    assert sorted((p.name, p.stat().st_size) for p in data.rglob("*") if p.is_file() and p.name != "LOCK") == logs
    with EmbeddedServer(data, partitions=None) as srv, grpc.insecure_channel(srv.target) as ch:
        stub = pb_grpc.StreamTxStub(ch)
        assert len(status(stub).partitions) == 2
        assert query(stub, "SELECT count(*) AS n, sum(v) AS s FROM life_kt") == {"n": [20], "s": [190]}


# --------------------------------------------------------------------------- user code in the processes
PANDAS_PROCS = """
import pandas as pd
from streamtx.procedure import Tx, procedure


@procedure(emits=["halved"])
def halves(tx: Tx) -> None:
    x = pd.Series(tx.batch.column("a").to_pylist(), dtype="Int64")
    tx.emit("halved", {"a": x, "half": (x // 2).where(x % 2 == 0)})
"""


def test_a_procedure_emitting_pandas_series_keeps_their_nulls(tmp_path):
    """Server processes keep pyarrow from importing pandas for their own use (server/pandas_probe.py); a
    procedure module gets pyarrow's pandas conversions back, so <NA> in a Series is a NULL, not an error."""
    procs = tmp_path / "procs"
    procs.mkdir()
    (procs / "frames.py").write_text(PANDAS_PROCS)
    script = (
        "CREATE STREAM nums (a BIGINT);\n"
        "CREATE STREAM halved (a BIGINT, half BIGINT);\n"
        "CREATE TABLE kept (a BIGINT, half BIGINT);\n"
        "CREATE PROCEDURE halve ON STREAM nums AS PYTHON 'frames:halves';\n"
        "CREATE PROCEDURE keep ON STREAM halved AS BEGIN INSERT INTO kept SELECT a, half FROM halved; END;"
    )
    from streamtx.client import Client

    with EmbeddedServer(tmp_path / "data", extra_args=["--procedures-path", str(procs)]) as srv:
        with Client(srv.target) as c:
            c.deploy(script)
            assert c.push("nums", {"a": [4, 7, None]}).result().outcome == "committed"
            assert c.query("SELECT a, half FROM kept ORDER BY a NULLS LAST").fetchall() == [
                (4, 2),
                (7, None),
                (None, None),
            ]
