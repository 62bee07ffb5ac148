"""Pushing batches to a real server over raw gRPC: encodings, pipelining, ordering, Subscribe.

- Arrow IPC and typed protobuf rows (any column order) give identical state.
- PushStream: one ack per batch, in send order, timestamps increasing; a
  re-sent batch is DUPLICATE and changes nothing.
- A producer's batches are applied in batch-id order even when they arrive out
  of order; a batch whose predecessor never arrives is rejected after
  --order-timeout.
- Subscribe delivers an output stream's committed batches in order and resumes
  from a batch id.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pyarrow as pa
import pytest
from support.acks import expand

from streamtx.server.embedded import EmbeddedServer
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import py_to_value, table_to_ipc

pytestmark = pytest.mark.timeout(120)

CALL_TIMEOUT = 20.0
SC = grpc.StatusCode
_CODES = {code.value[0]: code for code in grpc.StatusCode}


@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("push") / "data") as s:
        yield s


@pytest.fixture(scope="module")
def stub(srv) -> Iterator[pb_grpc.StreamTxStub]:
    with grpc.insecure_channel(srv.target) as channel:
        yield pb_grpc.StreamTxStub(channel)


_names = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


def deploy(stub, sql: str) -> None:
    stub.Deploy(pb.DeployRequest(sql=sql), timeout=CALL_TIMEOUT)


def query(stub, sql: str) -> pa.Table:
    resp = stub.Query(pb.QueryRequest(sql=sql), timeout=CALL_TIMEOUT)
    return pa.ipc.open_stream(resp.result.arrow_ipc).read_all()


def arrow(table: pa.Table) -> pb.RowData:
    return pb.RowData(arrow_ipc=table_to_ipc(table))


def pbrows(columns: list[str], values: list[list[Any]]) -> pb.RowData:
    return pb.RowData(rows=pb.Rows(columns=columns, rows=[pb.Row(values=[py_to_value(v) for v in r]) for r in values]))


def request(stream: str, batch_id: int, data: pb.RowData, producer: str = "prod") -> pb.PushRequest:
    return pb.PushRequest(stream=stream, producer_id=producer, batch_id=batch_id, data=data)


def push(stub, stream: str, batch_id: int, data: pb.RowData, producer: str = "prod") -> pb.PushAck:
    return stub.Push(request(stream, batch_id, data, producer), timeout=CALL_TIMEOUT)


def copier(stub, columns: str, prefix: str = "c") -> tuple[str, str]:
    """A stream and a table its procedure copies every tuple into; returns (stream, table)."""
    name = unique(prefix)
    names = ", ".join(c.split()[0] for c in columns.split(","))
    deploy(
        stub,
        f"CREATE TABLE {name}_t ({columns});\n"
        f"CREATE STREAM {name}_s ({columns});\n"
        f"CREATE PROCEDURE {name}_p ON STREAM {name}_s AS BEGIN\n"
        f"  INSERT INTO {name}_t SELECT {names} FROM {name}_s;\n"
        "END;",
    )
    return f"{name}_s", f"{name}_t"


# --------------------------------------------------------------------------- encodings

COLUMNS = "id BIGINT, small INTEGER, name VARCHAR, score DOUBLE, ok BOOLEAN, raw BLOB"
ROWS = [
    (1, 10, "ann", 1.5, True, b"\x00\x01"),
    (2, -20, "bob", -0.25, False, b""),
    (3, None, None, None, None, None),
    (4, 2**31 - 1, "ünïcødé ✓", 1e300, True, b"\xff" * 16),
    (2**62, -(2**31), "", 0.0, False, b"z"),
]


def test_arrow_and_protobuf_rows_give_identical_state(stub):
    names = ["id", "small", "name", "score", "ok", "raw"]
    streams, tables = zip(*(copier(stub, COLUMNS, "enc") for _ in range(4)), strict=True)
    cols = list(zip(*ROWS, strict=True))
    # 1. Arrow in the stream's own types and column order
    exact = pa.table(
        [
            pa.array(cols[0], pa.int64()),
            pa.array(cols[1], pa.int32()),
            pa.array(cols[2], pa.string()),
            pa.array(cols[3], pa.float64()),
            pa.array(cols[4], pa.bool_()),
            pa.array(cols[5], pa.binary()),
        ],
        names=names,
    )
    # 2. Arrow with the columns in another order and narrower/other types, cast safely by the server
    other = pa.table(
        {
            "raw": pa.array(cols[5], pa.large_binary()),
            "ok": pa.array(cols[4], pa.bool_()),
            "small": pa.array(cols[1], pa.int64()),
            "name": pa.array(cols[2], pa.large_string()),
            "id": pa.array(cols[0], pa.int64()),
            "score": pa.array(cols[3], pa.float64()),
        }
    )
    # 3. protobuf rows with the columns in another order
    order = ["score", "raw", "id", "name", "ok", "small"]
    named = pbrows(order, [[r[names.index(c)] for c in order] for r in ROWS])
    # 4. protobuf rows without column names: the stream's declared order
    positional = pbrows([], [list(r) for r in ROWS])
    for stream, data in zip(streams, [arrow(exact), arrow(other), named, positional], strict=True):
        ack = push(stub, stream, 1, data)
        assert ack.outcome == pb.COMMITTED, ack
    results = [query(stub, f"SELECT * FROM {t} ORDER BY id") for t in tables]
    for r in results:
        assert r.column_names == names
        assert r.schema == results[0].schema
        assert r.equals(results[0]), (r, results[0])
    got = list(zip(*(results[0].column(i).to_pylist() for i in range(len(names))), strict=True))
    assert got == sorted(ROWS)


def test_empty_batch_commits_and_changes_nothing(stub):
    stream, table = copier(stub, "a BIGINT", "empty")
    for i, data in enumerate([arrow(pa.table({"a": pa.array([], pa.int64())})), pbrows(["a"], [])], start=1):
        ack = push(stub, stream, i, data)
        assert ack.outcome == pb.COMMITTED, ack
    assert query(stub, f"SELECT count(*) AS n FROM {table}").to_pydict() == {"n": [0]}


# --------------------------------------------------------------------------- PushStream


def test_push_stream_200_pipelined_batches_then_all_duplicates(stub):
    stream, table = copier(stub, "batch BIGINT, k BIGINT", "pipe")
    n = 200

    def requests() -> Iterator[pb.PushRequest]:
        for i in range(1, n + 1):
            yield request(stream, i, arrow(pa.table({"batch": [i, i], "k": [2 * i, 2 * i + 1]})), "pipeline")

    t0 = time.monotonic()
    acks = list(stub.PushStream(requests(), timeout=60))
    elapsed = time.monotonic() - t0
    assert len(acks) == n
    assert [a.batch_id for a in acks] == list(range(1, n + 1))
    assert all(a.stream == stream and a.producer_id == "pipeline" for a in acks)
    assert [a.outcome for a in acks] == [pb.COMMITTED] * n, [(a.batch_id, a.reason) for a in acks[:5]]
    stamps = [a.timestamp for a in acks]
    assert all(b > a for a, b in itertools.pairwise(stamps)), stamps
    assert stamps[0] > 0
    assert elapsed < 30
    state = query(stub, f"SELECT count(*) AS n, sum(k) AS s, count(DISTINCT batch) AS b FROM {table}")
    assert state.to_pydict() == {"n": [2 * n], "s": [sum(range(2, 2 * n + 2))], "b": [n]}

    again = expand(list(stub.PushStream(requests(), timeout=60)))  # duplicates may share acks
    assert again == [(i, pb.DUPLICATE, pb.COMMITTED, stamps[i - 1]) for i in range(1, n + 1)]  # the original's times
    assert query(stub, f"SELECT count(*) AS n, sum(k) AS s, count(DISTINCT batch) AS b FROM {table}") == state


def test_producers_are_independent(stub):
    stream, table = copier(stub, "who VARCHAR, n BIGINT", "prods")
    for producer in ("alpha", "beta"):
        for i in (1, 2):
            ack = push(stub, stream, i, pbrows(["who", "n"], [[producer, i]]), producer)
            assert ack.outcome == pb.COMMITTED, ack
    dup = push(stub, stream, 2, pbrows(["who", "n"], [["alpha", 99]]), "alpha")
    assert dup.outcome == pb.DUPLICATE and dup.original == pb.COMMITTED
    assert query(stub, f"SELECT who, n FROM {table} ORDER BY who, n").to_pydict() == {
        "who": ["alpha", "alpha", "beta", "beta"],
        "n": [1, 2, 1, 2],
    }


# --------------------------------------------------------------------------- ordering


def sequenced_log(stub) -> tuple[str, str]:
    """A stream whose procedure appends each tuple to a log with a sequence number (its position)."""
    name = unique("ord")
    deploy(
        stub,
        f"CREATE TABLE {name}_log (seq BIGINT, v BIGINT);\n"
        f"CREATE STREAM {name}_s (v BIGINT);\n"
        f"CREATE PROCEDURE {name}_p ON STREAM {name}_s AS BEGIN\n"
        f"  INSERT INTO {name}_log SELECT (SELECT count(*) FROM {name}_log), v FROM {name}_s;\n"
        "END;",
    )
    return f"{name}_s", f"{name}_log"


def test_out_of_order_batches_are_applied_in_batch_id_order(stub):
    stream, log = sequenced_log(stub)
    acks: dict[int, pb.PushAck] = {}
    errors: list[BaseException] = []

    def send(batch_id: int) -> None:
        try:
            acks[batch_id] = push(stub, stream, batch_id, arrow(pa.table({"v": [batch_id]})), "ooo")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = []
    for batch_id in (3, 2, 1):  # 3 arrives first, then 2, then 1
        t = threading.Thread(target=send, args=(batch_id,))
        t.start()
        threads.append(t)
        time.sleep(0.3)
    for t in threads:
        t.join(CALL_TIMEOUT)
    assert not errors, errors
    assert sorted(acks) == [1, 2, 3]
    assert [acks[i].outcome for i in (1, 2, 3)] == [pb.COMMITTED] * 3, acks
    assert acks[1].timestamp < acks[2].timestamp < acks[3].timestamp
    assert query(stub, f"SELECT seq, v FROM {log} ORDER BY seq").to_pydict() == {
        "seq": [0, 1, 2],
        "v": [1, 2, 3],
    }


@pytest.fixture(scope="module")
def short(tmp_path_factory) -> Iterator[pb_grpc.StreamTxStub]:
    """A server that waits 1 s for a missing batch."""
    data = tmp_path_factory.mktemp("short") / "data"
    with (
        EmbeddedServer(data, extra_args=["--order-timeout", "1"]) as s,
        grpc.insecure_channel(s.target) as channel,
    ):
        yield pb_grpc.StreamTxStub(channel)


def test_batch_whose_predecessor_never_arrives_is_rejected_after_order_timeout(short):
    stream, log = sequenced_log(short)
    assert push(short, stream, 1, arrow(pa.table({"v": [1]})), "gap").outcome == pb.COMMITTED
    t0 = time.monotonic()
    try:
        ack = push(short, stream, 3, arrow(pa.table({"v": [3]})), "gap")
    except grpc.RpcError as e:
        code, message = e.code(), e.details()
    else:
        assert ack.outcome == pb.REJECTED, ack
        code, message = _CODES[ack.code], ack.reason
    waited = time.monotonic() - t0
    assert code == SC.FAILED_PRECONDITION
    assert "batch 3" in message and "batch 2" in message and stream in message, message
    assert 0.8 <= waited < 8, waited
    assert query(short, f"SELECT v FROM {log} ORDER BY seq").to_pydict() == {"v": [1]}
    # batch 3 was not taken: once 2 arrives, 3 can be sent again and both commit in order
    assert push(short, stream, 2, arrow(pa.table({"v": [2]})), "gap").outcome == pb.COMMITTED
    assert push(short, stream, 3, arrow(pa.table({"v": [3]})), "gap").outcome == pb.COMMITTED
    assert query(short, f"SELECT seq, v FROM {log} ORDER BY seq").to_pydict() == {
        "seq": [0, 1, 2],
        "v": [1, 2, 3],
    }


def test_first_batch_must_be_one(short):
    stream, log = sequenced_log(short)
    ack = push(short, stream, 2, arrow(pa.table({"v": [2]})), "late-start")
    assert ack.outcome == pb.REJECTED and ack.code == SC.FAILED_PRECONDITION.value[0], ack
    assert "batch 1" in ack.reason
    assert query(short, f"SELECT count(*) AS n FROM {log}").to_pydict() == {"n": [0]}


# --------------------------------------------------------------------------- Subscribe


class Subscription:
    """Collects a Subscribe call's batches on a thread."""

    def __init__(self, stub, stream: str, from_ts: int) -> None:
        self.call = stub.Subscribe(pb.SubscribeRequest(stream=stream, from_ts=from_ts), timeout=60)
        self.items: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for batch in self.call:
                table = pa.ipc.open_stream(batch.data.arrow_ipc).read_all()
                self.items.put((batch.stream, batch.ts, table.to_pydict()))
        except grpc.RpcError as e:
            self.items.put(e)

    def take(self, n: int, timeout: float = 10.0) -> list[tuple[str, int, dict]]:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            item = self.items.get(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(item, BaseException):
                raise item
            out.append(item)
        return out

    def nothing_for(self, seconds: float) -> bool:
        try:
            self.items.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(5)


def test_subscribe_delivers_committed_batches_in_order_and_resumes(stub):
    name = unique("sub")
    deploy(
        stub,
        f"CREATE STREAM {name}_in (v BIGINT);\n"
        f"CREATE STREAM {name}_out (v BIGINT, doubled BIGINT);\n"
        f"CREATE PROCEDURE {name}_p ON STREAM {name}_in AS BEGIN\n"
        f"  INSERT INTO {name}_out SELECT v, v * 2 FROM {name}_in WHERE v >= 0;\n"
        "END;",
    )
    out = f"{name}_out"
    live = Subscription(stub, out, 0)
    try:
        assert live.nothing_for(0.3)
        acks = []
        for i, values in enumerate([[1, 2], [3], [-1], [4, 5, 6]], start=1):
            ack = push(stub, f"{name}_in", i, arrow(pa.table({"v": values})), "subp")
            assert ack.outcome == pb.COMMITTED, ack
            acks.append(ack)
        got = live.take(3)
        # batch 3 emitted nothing, so the output stream has no batch for it
        assert got == [
            (out, acks[0].timestamp, {"v": [1, 2], "doubled": [2, 4]}),
            (out, acks[1].timestamp, {"v": [3], "doubled": [6]}),
            (out, acks[3].timestamp, {"v": [4, 5, 6], "doubled": [8, 10, 12]}),
        ]
        assert live.nothing_for(0.3)
    finally:
        live.close()

    # from the beginning again: the same batches
    again = Subscription(stub, out, 0)
    try:
        assert again.take(3) == got
    finally:
        again.close()
    # resume from a batch id: that batch and the ones after it
    resumed = Subscription(stub, out, acks[1].timestamp)
    try:
        assert resumed.take(2) == got[1:]
        assert resumed.nothing_for(0.3)
        ack = push(stub, f"{name}_in", 5, arrow(pa.table({"v": [7]})), "subp")
        assert resumed.take(1) == [(out, ack.timestamp, {"v": [7], "doubled": [14]})]
    finally:
        resumed.close()
    # from a batch id between two batches: the next one
    between = Subscription(stub, out, acks[0].timestamp + 1)
    try:
        assert [b[1] for b in between.take(3)] == [acks[1].timestamp, acks[3].timestamp, ack.timestamp]
    finally:
        between.close()


def test_subscribe_to_a_border_stream_nobody_consumes(stub):
    name = unique("raw")
    deploy(stub, f"CREATE STREAM {name} (v BIGINT, s VARCHAR);")
    acks = [push(stub, name, i, pbrows(["s", "v"], [[f"r{i}", i]]), "rawp") for i in (1, 2)]
    assert [a.outcome for a in acks] == [pb.COMMITTED] * 2
    sub = Subscription(stub, name, 0)
    try:
        assert sub.take(2) == [
            (name, acks[0].timestamp, {"v": [1], "s": ["r1"]}),
            (name, acks[1].timestamp, {"v": [2], "s": ["r2"]}),
        ]
    finally:
        sub.close()
