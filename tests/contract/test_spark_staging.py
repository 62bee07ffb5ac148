"""Two-phase pushes on a real server (no Spark): Stage, CommitStaged, AbortStaged, and the limits.

- Exactly the named parts become one atomic batch; other attempts' parts are discarded.
- A re-sent commit is DUPLICATE with the original outcome; an empty commit is an empty batch.
- Staged rows are bounded (RESOURCE_EXHAUSTED, nothing staged) and expire when never committed.
- Bad input is a precise status and changes nothing.
- DescribeStream and ReadStream give connectors a stream's schema, completeness and ranges.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest
from support.spark import unique

from streamtx.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.front.staging import PartSpec, Staging
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import encode_rowdata, ipc_to_table

pytestmark = pytest.mark.timeout(120)
SC = grpc.StatusCode


@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator[EmbeddedServer]:
    extra = ["--staging-max-bytes", "200000", "--staging-ttl", "2", "--order-timeout", "1"]
    with EmbeddedServer(tmp_path_factory.mktemp("staging") / "data", extra_args=extra) as s:
        yield s


@pytest.fixture(scope="module")
def stub(srv) -> Iterator[pb_grpc.StreamTxStub]:
    with grpc.insecure_channel(srv.target) as channel:
        yield pb_grpc.StreamTxStub(channel)


@pytest.fixture
def app(stub) -> str:
    p = unique("g")
    stub.Deploy(
        pb.DeployRequest(
            sql=f"""
CREATE TABLE {p}_log (id BIGINT, k INTEGER);
CREATE STREAM {p}_in (id BIGINT, k INTEGER);
CREATE STREAM {p}_out (id BIGINT, k INTEGER);
CREATE PROCEDURE {p}_apply ON STREAM {p}_in AS BEGIN
    INSERT INTO {p}_log SELECT id, k FROM {p}_in;
    INSERT INTO {p}_out SELECT id, k FROM {p}_in;
END;
"""
        ),
        timeout=20,
    )
    return p


def rows(lo: int, hi: int) -> pa.Table:
    return pa.table(
        {"id": pa.array(range(lo, hi), pa.int64()), "k": pa.array([i % 3 for i in range(lo, hi)], pa.int32())}
    )


def stage(stub, stream: str, sid: str, part: str, chunk: int, table: pa.Table) -> pb.StageResponse:
    req = pb.StageRequest(stream=stream, staging_id=sid, part=part, chunk=chunk, data=encode_rowdata(table))
    return stub.Stage(req, timeout=20)


def commit(stub, stream: str, sid: str, producer: str, batch_id: int, parts) -> pb.PushAck:
    req = pb.CommitStagedRequest(
        stream=stream,
        staging_id=sid,
        producer_id=producer,
        batch_id=batch_id,
        parts=[pb.StagedPart(part=p, chunks=c, rows=r) for p, c, r in parts],
    )
    return stub.CommitStaged(req, timeout=20)


def log_ids(stub, p: str) -> list[int]:
    reply = stub.Query(pb.QueryRequest(sql=f"SELECT id FROM {p}_log ORDER BY id"), timeout=20)
    return ipc_to_table(reply.result.arrow_ipc).column("id").to_pylist()


def status_code(call) -> SC:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def test_commit_takes_exactly_the_named_parts_once(stub, app):
    p = app
    s = f"{p}_in"
    stage(stub, s, "q/0", "p0.a0", 0, rows(0, 10))  # an attempt that failed after one chunk
    stage(stub, s, "q/0", "p0.a1", 0, rows(0, 10))
    stage(stub, s, "q/0", "p0.a1", 1, rows(10, 20))
    stage(stub, s, "q/0", "p0.a1", 1, rows(10, 20))  # a retried Stage call replaces its chunk
    stage(stub, s, "q/0", "p1.a0", 0, rows(20, 25))
    ack = commit(stub, s, "q/0", "prod", 1, [("p0.a1", 2, 20), ("p1.a0", 1, 5)])
    assert (ack.outcome, ack.rows) == (pb.COMMITTED, 25)
    assert log_ids(stub, p) == list(range(25))

    again = commit(stub, s, "q/0", "prod", 1, [("p0.a1", 2, 20), ("p1.a0", 1, 5)])  # the ack was lost
    assert (again.outcome, again.original) == (pb.DUPLICATE, pb.COMMITTED)
    empty = commit(stub, s, "q/1", "prod", 2, [("p0.a0", 0, 0)])  # a micro-batch without rows
    assert empty.outcome == pb.COMMITTED and empty.rows == 0
    assert log_ids(stub, p) == list(range(25))


def test_bad_commits_and_stages_change_nothing(stub, app):
    p = app
    s = f"{p}_in"
    stage(stub, s, "b/0", "x", 0, rows(0, 10))
    code, msg = status_code(lambda: commit(stub, s, "b/0", "prod", 1, [("x", 2, 10)]))
    assert code == SC.FAILED_PRECONDITION and "part x lacks chunk(s) 1 of 2" in msg
    code, msg = status_code(lambda: commit(stub, s, "b/0", "prod", 1, [("x", 1, 11)]))
    assert code == SC.FAILED_PRECONDITION and "holds 10 rows, the commit says 11" in msg
    code, msg = status_code(lambda: commit(stub, s, "never", "prod", 1, [("x", 1, 10)]))
    assert code == SC.FAILED_PRECONDITION and "nothing is staged under this id" in msg
    code, msg = status_code(lambda: stage(stub, "nope", "b/0", "x", 0, rows(0, 1)))
    assert code == SC.NOT_FOUND and "unknown stream 'nope'" in msg
    code, msg = status_code(lambda: stage(stub, f"{p}_out", "b/0", "x", 0, rows(0, 1)))
    assert code == SC.FAILED_PRECONDITION and "border streams only" in msg
    bad = pa.table({"id": pa.array([1]), "j": pa.array([1])})
    code, msg = status_code(lambda: stage(stub, s, "b/0", "x", 1, bad))
    assert code == SC.INVALID_ARGUMENT and "unknown column 'j'" in msg
    code, msg = status_code(lambda: stage(stub, s, "", "x", 1, rows(0, 1)))
    assert code == SC.INVALID_ARGUMENT and "staging_id is empty" in msg
    assert log_ids(stub, p) == []
    # the valid staged chunk survived every refused call
    assert commit(stub, s, "b/0", "prod", 1, [("x", 1, 10)]).outcome == pb.COMMITTED
    assert log_ids(stub, p) == list(range(10))


def test_commit_out_of_order_is_not_taken_and_its_resend_is_no_duplicate(stub, app):
    p = app
    s = f"{p}_in"
    stage(stub, s, "o/5", "x", 0, rows(0, 4))
    code, msg = status_code(lambda: commit(stub, s, "o/5", "late", 2, [("x", 1, 4)]))  # batch 1 never came
    assert code == SC.FAILED_PRECONDITION and "never arrived" in msg
    code, msg = status_code(lambda: commit(stub, s, "o/5", "late", 2, [("x", 1, 4)]))
    assert code == SC.FAILED_PRECONDITION and "nothing is staged" in msg  # not an empty batch 2
    assert log_ids(stub, p) == []


def test_abort_limit_and_expiry(stub, app):
    p = app
    s = f"{p}_in"
    stage(stub, s, "a/0", "x", 0, rows(0, 100))
    assert stub.AbortStaged(pb.AbortStagedRequest(stream=s, staging_id="a/0"), timeout=20).parts == 1
    code, _ = status_code(lambda: commit(stub, s, "a/0", "prod", 1, [("x", 1, 100)]))
    assert code == SC.FAILED_PRECONDITION

    big = rows(0, 20_000)  # 240 kB > --staging-max-bytes 200000
    code, msg = status_code(lambda: stage(stub, s, "a/1", "x", 0, big))
    assert code == SC.RESOURCE_EXHAUSTED and "staging limit of 200000 bytes" in msg

    stage(stub, s, "a/2", "x", 0, rows(0, 5))
    import time

    time.sleep(3.5)  # --staging-ttl 2: swept without any further staging call
    status = stub.Status(pb.StatusRequest(), timeout=20)
    assert status.counters["staging_expired"] >= 1
    code, _ = status_code(lambda: commit(stub, s, "a/2", "prod", 1, [("x", 1, 5)]))
    assert code == SC.FAILED_PRECONDITION
    assert log_ids(stub, p) == []


def test_describe_and_read_stream(stub, app):
    p = app
    for b in range(1, 4):
        stage(stub, f"{p}_in", f"r/{b}", "x", 0, rows(b * 10, b * 10 + 3))
        commit(stub, f"{p}_in", f"r/{b}", "prod", b, [("x", 1, 3)])
    d = stub.DescribeStream(pb.DescribeStreamRequest(stream=f"{p}_out", with_complete_through=True), timeout=20)
    assert d.complete_through >= 3
    assert (d.border, d.readable) == (False, True)
    assert pa.ipc.read_schema(pa.py_buffer(d.arrow_schema)).names == ["id", "k"]
    got = stub.ReadStream(pb.ReadStreamRequest(stream=f"{p}_out", to_ts=d.complete_through + 1), timeout=20)
    ids = [b.ts for b in got.batches]
    assert len(ids) == 3 and ids == sorted(ids) and not got.more
    first = stub.ReadStream(pb.ReadStreamRequest(stream=f"{p}_out", from_ts=ids[1], to_ts=ids[2]), timeout=20)
    assert [b.ts for b in first.batches] == [ids[1]]
    code, msg = status_code(lambda: stub.DescribeStream(pb.DescribeStreamRequest(stream="nope"), timeout=20))
    assert code == SC.NOT_FOUND and "unknown stream 'nope'" in msg
    code, _ = status_code(lambda: stub.ReadStream(pb.ReadStreamRequest(stream=f"{p}_in"), timeout=20))
    assert code == SC.FAILED_PRECONDITION


def test_staging_unit_bounds_and_ttl():
    now = [0.0]
    st = Staging(max_bytes=1000, ttl_s=10, clock=lambda: now[0])
    t = rows(0, 50)  # 600 bytes
    st.put("s", "id", "a", 0, t)
    st.put("s", "id", "a", 0, t)  # replacing a chunk does not count twice
    assert st.nbytes == t.nbytes
    with pytest.raises(ResourceExhausted):
        st.put("s", "id", "b", 0, t)
    assert st.nbytes == t.nbytes
    with pytest.raises(InvalidArgument):
        st.take("s", "id", [PartSpec("a", 1, 50), PartSpec("a", 1, 50)], t.schema)
    with pytest.raises(FailedPrecondition):
        st.take("s", "id", [PartSpec("a", 1, 49)], t.schema)
    now[0] = 11
    assert st.expire() == 1 and st.nbytes == 0 and len(st) == 0
    assert st.take("s", "id", [PartSpec("a", 1, 50)], t.schema) is None
