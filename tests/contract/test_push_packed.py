"""Several atomic batches in one PushStream message, and frames packed between processes.

- A message with `batch_rows` carries consecutive batches; each is sequenced,
  executed, deduplicated and answered as if sent alone; acks of consecutive
  batches with one outcome come back as one ack with a `count`.
- A batch of the message that aborts changes nothing and splits the acks;
  the batches around it commit.
- A batch with a value its stream cannot hold is rejected alone; its neighbours commit.
- Bad packing (counts not adding up, negative counts, an unknown stream, a
  batch over --max-batch-rows) gets a precise status per batch and changes
  nothing else; the server keeps serving.
- The client packs what is queued while a write is under way, and the
  front↔partition link packs alike frames (`ipc.pack` / `ipc.unpack`).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest
from support.acks import expand

from streamtx import wire
from streamtx.client import AsyncClient
from streamtx.client.async_client import PACK_MAX_BYTES, PACK_YIELD, _InFlight, _nbytes
from streamtx.server import protocol as pr
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.ipc import Packed, SocketFrames, unpack
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import ipc_to_table, py_to_value, table_to_ipc

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 30.0
SC = grpc.StatusCode
MAX_ROWS = 4
_names = itertools.count(1)


@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(
        tmp_path_factory.mktemp("packed") / "data", extra_args=["--max-batch-rows", str(MAX_ROWS)]
    ) as s:
        yield s


@pytest.fixture(scope="module")
def stub(srv) -> Iterator[pb_grpc.StreamTxStub]:
    with grpc.insecure_channel(srv.target) as channel:
        yield pb_grpc.StreamTxStub(channel)


def checked_copier(stub) -> tuple[str, str]:
    """A stream whose procedure copies tuples into a table that refuses negative k."""
    name = f"pk{next(_names)}"
    stub.Deploy(
        pb.DeployRequest(
            sql=f"CREATE TABLE {name}_t (b BIGINT, k BIGINT CHECK (k >= 0));\n"
            f"CREATE STREAM {name}_s (b BIGINT, k BIGINT);\n"
            f"CREATE PROCEDURE {name}_p ON STREAM {name}_s AS BEGIN\n"
            f"  INSERT INTO {name}_t SELECT b, k FROM {name}_s;\n"
            "END;"
        ),
        timeout=TIMEOUT,
    )
    return f"{name}_s", f"{name}_t"


def packed(stream: str, first: int, batches: list[list[int]], producer: str = "packer") -> pb.PushRequest:
    """One message: batch i holds rows (b = first + i, k) for each k in batches[i]."""
    b = [first + i for i, ks in enumerate(batches) for _ in ks]
    k = [v for ks in batches for v in ks]
    table = pa.table({"b": pa.array(b, pa.int64()), "k": pa.array(k, pa.int64())})
    return pb.PushRequest(
        stream=stream,
        producer_id=producer,
        batch_id=first,
        data=pb.RowData(arrow_ipc=table_to_ipc(table)),
        batch_rows=[len(ks) for ks in batches],
    )


def rows(stub, table: str) -> list[tuple[int, int]]:
    resp = stub.Query(pb.QueryRequest(sql=f"SELECT b, k FROM {table} ORDER BY b, k"), timeout=TIMEOUT)
    t = ipc_to_table(resp.result.arrow_ipc, "result")
    return list(zip(t.column("b").to_pylist(), t.column("k").to_pylist(), strict=True))


def test_batches_of_one_message_commit_alone_and_acks_come_in_runs(stub):
    stream, table = checked_copier(stub)
    batches = [[1, 2], [3], [4, -1], [5], [6, 7]]  # batch 3 violates the CHECK
    acks = list(stub.PushStream(iter([packed(stream, 1, batches)]), timeout=TIMEOUT))
    per_batch = expand(acks)
    assert [(b, o) for b, o, _, _ in per_batch] == [
        (1, pb.COMMITTED),
        (2, pb.COMMITTED),
        (3, pb.REJECTED),
        (4, pb.COMMITTED),
        (5, pb.COMMITTED),
    ]
    assert [a.count for a in acks] == [2, 0, 2], acks
    assert acks[1].code == SC.ABORTED.value[0] and "CHECK constraint failed" in acks[1].reason, acks[1]
    assert [a.rows for a in acks] == [3, 2, 3]
    stamps = [t for *_, t in per_batch]
    assert all(b == a + 1 for a, b in itertools.pairwise(stamps)), stamps
    assert rows(stub, table) == [(1, 1), (1, 2), (2, 3), (4, 5), (5, 6), (5, 7)]

    again = list(stub.PushStream(iter([packed(stream, 1, batches)]), timeout=TIMEOUT))
    assert [(b, o, orig) for b, o, orig, _ in expand(again)] == [
        (1, pb.DUPLICATE, pb.COMMITTED),
        (2, pb.DUPLICATE, pb.COMMITTED),
        (3, pb.DUPLICATE, pb.REJECTED),
        (4, pb.DUPLICATE, pb.COMMITTED),
        (5, pb.DUPLICATE, pb.COMMITTED),
    ]
    assert rows(stub, table) == [(1, 1), (1, 2), (2, 3), (4, 5), (5, 6), (5, 7)]


@pytest.mark.parametrize("encoding", ["arrow", "rows"])
def test_a_value_that_does_not_fit_rejects_only_its_own_batch_of_a_message(stub, encoding):
    """Eight one-row batches in one message; the sixth holds 1.5 for a BIGINT (as text through Arrow)."""
    stream, table = checked_copier(stub)
    ks: list[object] = [10, 11, 12, 13, 14, 1.5, 16, 17]
    if encoding == "arrow":
        data = pb.RowData(arrow_ipc=table_to_ipc(pa.table({"b": list(range(1, 9)), "k": [str(k) for k in ks]})))
    else:
        data = pb.RowData(
            rows=pb.Rows(
                columns=["b", "k"],
                rows=[pb.Row(values=[py_to_value(b), py_to_value(k)]) for b, k in zip(range(1, 9), ks, strict=True)],
            )
        )
    req = pb.PushRequest(stream=stream, producer_id="mixed", batch_id=1, data=data, batch_rows=[1] * 8)
    raw = list(stub.PushStream(iter([req]), timeout=TIMEOUT))
    assert [(b, o) for b, o, _, _ in expand(raw)] == [(b, pb.REJECTED if b == 6 else pb.COMMITTED) for b in range(1, 9)]
    bad = next(a for a in raw if a.outcome == pb.REJECTED)
    assert bad.count in (0, 1) and bad.code == SC.INVALID_ARGUMENT.value[0], bad
    assert "(producer 'mixed', batch 6)" in bad.reason and "column 'k' row 0" in bad.reason, bad.reason
    assert rows(stub, table) == [(b, k) for b, k in zip(range(1, 9), ks, strict=True) if b != 6]


def test_acks_of_a_long_message_leave_as_its_batches_finish(tmp_path):
    """A message of 200 batches over intervals of at most 4: its acks come back in several runs, in order.

    Held back until the whole message was done, they would come as one ack of
    count 200 (all commit, consecutive timestamps), and a producer that packed
    its window into one message would wait for all of it before sending more.
    """
    with EmbeddedServer(tmp_path / "data", extra_args=["--interval-size", "4"]) as srv:
        with grpc.insecure_channel(srv.target) as channel:
            stub = pb_grpc.StreamTxStub(channel)
            stream, table = checked_copier(stub)
            batches = [[i] for i in range(200)]
            acks = list(stub.PushStream(iter([packed(stream, 1, batches)]), timeout=TIMEOUT))
            per_batch = expand(acks)
            assert [(b, o) for b, o, _, _ in per_batch] == [(i + 1, pb.COMMITTED) for i in range(200)]
            assert len(acks) > 1, acks
            assert sum(a.rows for a in acks) == 200
            assert len(rows(stub, table)) == 200


def test_packed_and_single_messages_interleave_in_batch_id_order(stub):
    stream, table = checked_copier(stub)
    single = pb.PushRequest(
        stream=stream,
        producer_id="mixer",
        batch_id=4,
        data=pb.RowData(arrow_ipc=table_to_ipc(pa.table({"b": [4], "k": [40]}))),
    )
    messages = [packed(stream, 1, [[10], [20], [30]], "mixer"), single, packed(stream, 5, [[50], []], "mixer")]
    acks = list(stub.PushStream(iter(messages), timeout=TIMEOUT))
    assert [(b, o) for b, o, _, _ in expand(acks)] == [(i, pb.COMMITTED) for i in range(1, 7)]
    assert rows(stub, table) == [(1, 10), (2, 20), (3, 30), (4, 40), (5, 50)]


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow", "rows"])
def test_a_value_one_batch_cannot_hold_rejects_that_batch_only(stub, arrow):
    """Packed by the client or not, a batch is answered as if sent alone: its neighbours still commit."""
    stream, table = checked_copier(stub)
    values = pa.table({"b": pa.array([1, 2, 2, 3], pa.int64()), "k": ["10", "20", "x", "30"]})
    data = pb.RowData(arrow_ipc=table_to_ipc(values)) if arrow else pb.RowData(rows=wire.table_to_rows(values))
    req = pb.PushRequest(stream=stream, producer_id="mixed", batch_id=1, data=data, batch_rows=[1, 2, 1])
    raw = list(stub.PushStream(iter([req]), timeout=TIMEOUT))
    assert [(b, o) for b, o, _, _ in expand(raw)] == [(1, pb.COMMITTED), (2, pb.REJECTED), (3, pb.COMMITTED)]
    rejected = next(a for a in raw if a.outcome == pb.REJECTED)
    assert rejected.code == SC.INVALID_ARGUMENT.value[0], rejected
    assert "batch 2)" in rejected.reason and "column 'k' row 1: text 'x' is not a BIGINT" in rejected.reason, rejected
    assert rows(stub, table) == [(1, 10), (3, 30)]


def test_a_list_value_one_batch_cannot_hold_rejects_that_batch_only(stub):
    """Lists are cast batch by batch from slices of the message: another batch's values must not count."""
    name = f"pl{next(_names)}"
    stub.Deploy(
        pb.DeployRequest(
            sql=f"CREATE TABLE {name}_t (b BIGINT, v BIGINT[][]);\n"
            f"CREATE STREAM {name}_s (b BIGINT, v BIGINT[][]);\n"
            f"CREATE PROCEDURE {name}_p ON STREAM {name}_s AS BEGIN\n"
            f"  INSERT INTO {name}_t SELECT b, v FROM {name}_s;\n"
            "END;"
        ),
        timeout=TIMEOUT,
    )
    nested = [[[1.0]], [[1.5]], None, [[2.0], None]]
    values = pa.table(
        {"b": pa.array([1, 2, 3, 4], pa.int64()), "v": pa.array(nested, pa.list_(pa.list_(pa.float64())))}
    )
    req = pb.PushRequest(
        stream=f"{name}_s",
        producer_id="lists",
        batch_id=1,
        data=pb.RowData(arrow_ipc=table_to_ipc(values)),
        batch_rows=[1, 1, 1, 1],
    )
    raw = list(stub.PushStream(iter([req]), timeout=TIMEOUT))
    assert [(b, o) for b, o, _, _ in expand(raw)] == [
        (1, pb.COMMITTED),
        (2, pb.REJECTED),
        (3, pb.COMMITTED),
        (4, pb.COMMITTED),
    ]
    rejected = next(a for a in raw if a.outcome == pb.REJECTED)
    assert "batch 2)" in rejected.reason and "value [[1.5]]" in rejected.reason, rejected.reason
    resp = stub.Query(pb.QueryRequest(sql=f"SELECT b, v FROM {name}_t ORDER BY b"), timeout=TIMEOUT)
    got = ipc_to_table(resp.result.arrow_ipc, "result").to_pylist()
    assert got == [{"b": 1, "v": [[1]]}, {"b": 3, "v": None}, {"b": 4, "v": [[2], None]}]


@pytest.mark.parametrize(
    ("counts", "words"),
    [
        ([1, 1], ["batch_rows [1, 1]", "3 rows"]),  # data holds 3 rows
        ([4, -1], ["batch_rows [4, -1]"]),
        ([0, 0, 3], None),  # empty batches are fine
    ],
)
def test_counts_must_add_up_to_the_rows(stub, counts, words):
    stream, table = checked_copier(stub)
    req = packed(stream, 1, [[1, 2, 3]], "counter")
    del req.batch_rows[:]
    req.batch_rows.extend(counts)
    raw = list(stub.PushStream(iter([req]), timeout=TIMEOUT))
    acks = expand(raw)
    assert [b for b, *_ in acks] == list(range(1, len(counts) + 1))
    if words is None:
        assert all(o == pb.COMMITTED for _, o, _, _ in acks)
        assert [k for _, k in rows(stub, table)] == [1, 2, 3]
        return
    assert all(o == pb.REJECTED for _, o, _, _ in acks)
    assert all(a.code == SC.INVALID_ARGUMENT.value[0] for a in raw), raw
    for w in [*words, stream, f"batches 1..{len(counts)}"]:
        assert w in raw[0].reason, raw[0].reason
    assert rows(stub, table) == []
    again = list(stub.PushStream(iter([req]), timeout=TIMEOUT))  # each batch's rejection is remembered
    assert all(o == pb.DUPLICATE and orig == pb.REJECTED for _, o, orig, _ in expand(again))
    nxt = list(stub.PushStream(iter([packed(stream, 1 + len(counts), [[9]], "counter")]), timeout=TIMEOUT))
    assert [a.outcome for a in nxt] == [pb.COMMITTED]  # the ids are used up; the producer goes on
    assert rows(stub, table) == [(1 + len(counts), 9)]


def test_unknown_stream_and_oversized_batch(stub):
    acks = expand(list(stub.PushStream(iter([packed("no_such_stream", 1, [[1], [2]])]), timeout=TIMEOUT)))
    assert [(b, o) for b, o, _, _ in acks] == [(1, pb.REJECTED), (2, pb.REJECTED)]
    raw = list(stub.PushStream(iter([packed("no_such_stream", 1, [[1], [2]])]), timeout=TIMEOUT))
    assert raw[0].code == SC.NOT_FOUND.value[0] and "no_such_stream" in raw[0].reason

    stream, table = checked_copier(stub)
    big = list(range(MAX_ROWS + 1))
    raw = list(stub.PushStream(iter([packed(stream, 1, [[1], big, [2]], "big")]), timeout=TIMEOUT))
    per_batch = expand(raw)
    assert [(b, o) for b, o, _, _ in per_batch] == [(1, pb.COMMITTED), (2, pb.REJECTED), (3, pb.COMMITTED)]
    assert raw[1].code == SC.RESOURCE_EXHAUSTED.value[0] and "--max-batch-rows" in raw[1].reason, raw[1]
    assert rows(stub, table) == [(1, 1), (3, 2)]


def test_client_packs_queued_batches_into_few_messages(srv):
    async def run() -> tuple[list, dict]:
        async with AsyncClient(srv.target, producer_id="client-packer", max_in_flight=1024) as c:
            status = await c.status()
            await c.deploy(
                "CREATE TABLE cp_t (b BIGINT, k BIGINT);\n"
                "CREATE STREAM cp_s (b BIGINT, k BIGINT);\n"
                "CREATE PROCEDURE cp_p ON STREAM cp_s AS BEGIN INSERT INTO cp_t SELECT b, k FROM cp_s; END;"
            )
            await (await c.push("cp_s", {"b": [0], "k": [0]}))  # the stream is open before the count starts
            before = (await c.status())["counters"].get("push_messages", 0)
            futures = [await c.push("cp_s", {"b": [i], "k": [i * i]}) for i in range(1, 301)]
            results = await asyncio.gather(*futures)
            after = (await c.status())["counters"].get("push_messages", 0)
            table = await c.query("SELECT count(*) AS n, sum(k) AS s FROM cp_t")
            return results, {"messages": after - before, "state": table.to_pylist(), "status": status}

    results, seen = asyncio.run(run())
    assert [r.batch_id for r in results] == list(range(2, 302))
    assert all(r.outcome == "committed" and r.rows == 1 for r in results)
    assert all(b.timestamp > a.timestamp for a, b in itertools.pairwise(results))
    assert seen["state"] == [{"n": 301, "s": sum(i * i for i in range(1, 301))}]
    # the producer never awaits an ack: its batches leave packed, but the writer runs every PACK_YIELD of them,
    # so the first ones leave before the last is pushed (how many messages follow depends on how soon gRPC
    # completes each write: one write is outstanding at a time)
    assert 1 < seen["messages"] <= 300 // PACK_YIELD + 1, seen["messages"]


def test_client_message_runs_split_on_stream_gap_schema_and_size():
    loop = asyncio.new_event_loop()
    try:
        client = AsyncClient("127.0.0.1:1", producer_id="p")

        def entry(stream: str, batch_id: int, table: pa.Table) -> _InFlight:
            return _InFlight(stream, batch_id, table, loop.create_future())

        small = pa.table({"v": pa.array([1], pa.int64())})
        other = pa.table({"v": pa.array([1], pa.int32())})
        big = pa.table({"v": pa.array(range(PACK_MAX_BYTES // 8 + 1), pa.int64())})
        entries = [
            entry("a", 1, small),
            entry("a", 2, small),
            entry("b", 1, small),  # another stream
            entry("a", 3, small),
            entry("a", 5, small),  # an id gap
            entry("a", 6, other),  # another schema
            entry("a", 7, other),
            entry("a", 8, big),  # over the byte cap with what came before
            entry("a", 9, small),
        ]
        msgs = client._messages(entries)
        shape = [(m.stream, m.batch_id, list(m.batch_rows)) for m in msgs]
        assert shape == [
            ("a", 1, [1, 1]),
            ("b", 1, []),
            ("a", 3, []),
            ("a", 5, []),
            ("a", 6, [1, 1]),
            ("a", 8, []),
            ("a", 9, []),
        ]
        assert ipc_to_table(msgs[0].data.arrow_ipc, "m").to_pydict() == {"v": [1, 1]}
        client.arrow = False
        assert all(not m.batch_rows for m in client._messages(entries[:2]))  # protobuf rows travel one by one
    finally:
        loop.close()


def test_slices_of_a_table_larger_than_the_byte_cap_still_pack_together():
    """A message's size counts each batch's own rows, not the buffers a slice shares with its table."""
    loop = asyncio.new_event_loop()
    try:
        client = AsyncClient("127.0.0.1:1", producer_id="p")
        n = PACK_MAX_BYTES // 8 + 10
        whole = pa.table({"v": pa.array(range(n), pa.int64()), "s": pa.array([str(i) for i in range(n)])})
        fixed = whole.select(["v"])
        for table in (fixed, whole):
            entries = [_InFlight("a", i + 1, table.slice(i, 1), loop.create_future()) for i in range(100)]
            msgs = client._messages(entries)
            assert [len(m.batch_rows) for m in msgs] == [100]
            assert ipc_to_table(msgs[0].data.arrow_ipc, "m").column("v").to_pylist() == list(range(100))
        assert _nbytes(fixed.slice(0, 1000)) >= fixed.slice(0, 1000).nbytes  # a bound, never less
    finally:
        loop.close()


def test_ipc_pack_unpack_keeps_frames_and_order():
    t1 = pa.table({"x": [1, 2]})
    t2 = pa.table({"x": [3]})
    t0 = pa.table({"x": pa.array([], pa.int64())})
    s = pa.table({"y": ["a"]})
    push = pr.Push("s", "p", 1, 1)
    frames = [
        (pr.Request(1, push), [t1]),
        (pr.Request(2, push), [t0]),
        (pr.Request(3, push), [t2]),
        (pr.Request(4, push), [s]),  # another schema: a new run
        (pr.Response(5), []),
        (pr.Response(6), []),
        (pr.Request(7, pr.Echo()), [t1, t2]),  # two relations: alone
    ]
    a, b = socket.socketpair()
    with a, b:
        SocketFrames(a).write_many(frames)
        a.shutdown(socket.SHUT_WR)
        reader = SocketFrames(b)
        raw = list(iter(reader.read, None))
    out = [one for frame in raw for one in unpack(frame)]
    assert [type(h) for h, _ in raw] == [Packed, pr.Request, Packed, pr.Request]
    assert [h for h, _ in out] == [h for h, _ in frames]
    assert [[t.to_pydict() for t in ts] for _, ts in out] == [[t.to_pydict() for t in ts] for _, ts in frames]
