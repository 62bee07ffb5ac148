"""Overload: admission bounds what pushes hold; refusals change nothing; slow readers cost nothing.

`streamtx bench overload` is the measured side (latency of reads under overload);
here the correctness side: every acknowledged batch applied exactly once, memory
under a stated bound, a unary Push refused precisely, a slow Subscribe reader
unable to make the server buffer.
"""

from __future__ import annotations

import re
import threading
import time

import grpc
import psutil
import pytest

from streamtx.bench import overload
from streamtx.client import Client
from streamtx.errors import RETRY_AFTER_KEY, DeadlineExceeded, OutOfRange, ResourceExhausted
from streamtx.server.embedded import EmbeddedServer
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc
from streamtx.wire import encode_rowdata

EVENTS = overload.SCRIPT


def _request(producer: str, batch_id: int, k: int = 1, v: int = 1) -> pb.PushRequest:
    import pyarrow as pa

    table = pa.table({"k": pa.array([k], pa.int32()), "v": pa.array([v], pa.int64())})
    return pb.PushRequest(stream="events", producer_id=producer, batch_id=batch_id, data=encode_rowdata(table, True))


def _totals(c: Client) -> list[tuple]:
    return c.query("SELECT k, n, s FROM totals ORDER BY k").fetchall()


def test_a_unary_push_past_the_limit_is_refused_with_a_retry_hint_and_changes_nothing(tmp_path) -> None:
    extra = ["--max-in-flight", "1", "--push-wait", "0"]
    with EmbeddedServer(tmp_path / "d", extra_args=extra) as srv, Client(srv.target, producer_id="py") as c:
        c.deploy(EVENTS)
        channel = grpc.insecure_channel(srv.target)
        stub = pb_grpc.StreamTxStub(channel)
        early = stub.Push.future(_request("a", 2, k=1, v=20))  # parked for batch 1: holds the one slot
        time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Push(_request("b", 1, k=2, v=5))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        message = refused.value.details()
        assert "batch 1" in message and "'b'" in message and "--max-in-flight 1" in message
        assert "nothing was taken" in message
        hint = dict(refused.value.trailing_metadata())[RETRY_AFTER_KEY]
        assert 1 <= int(hint) <= 2000
        assert _totals(c) == []  # the refusal took nothing

        # batch 1 of "a" goes in over the limit: batch 2, admitted first, waits for it
        assert stub.Push(_request("a", 1, k=1, v=10)).outcome == pb.COMMITTED
        assert early.result(timeout=30).outcome == pb.COMMITTED
        assert stub.Push(_request("b", 1, k=2, v=5)).outcome == pb.COMMITTED  # the refused id is still free

        # the client waits out the hint and sends again, as often as it takes
        late = stub.Push.future(_request("a", 4, k=1, v=40))  # full again
        time.sleep(0.3)
        done: list = []
        pusher = threading.Thread(target=lambda: done.append(c.push_one("events", [{"k": 3, "v": 7}])))
        pusher.start()
        time.sleep(1.0)
        assert not done  # still refused and retried
        assert stub.Push(_request("a", 3, k=1, v=30)).outcome == pb.COMMITTED
        assert late.result(timeout=30).outcome == pb.COMMITTED
        pusher.join(30)
        assert done and done[0].outcome == "committed"
        assert _totals(c) == [(1, 4, 100), (2, 1, 5), (3, 1, 7)]
        assert c.status()["counters"]["push_refused"] >= 2
        channel.close()


def test_a_unary_push_of_several_batches_is_refused_by_name(tmp_path) -> None:
    with EmbeddedServer(tmp_path / "d") as srv, Client(srv.target) as c:
        c.deploy(EVENTS)
        request = _request("a", 1)
        request.batch_rows.extend([1])
        with grpc.insecure_channel(srv.target) as channel:
            with pytest.raises(grpc.RpcError) as bad:
                pb_grpc.StreamTxStub(channel).Push(request)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "batch_rows" in bad.value.details() and "PushStream" in bad.value.details()
        assert _totals(c) == []


@pytest.mark.slow
def test_four_producers_at_full_speed_keep_memory_bounded_and_every_batch_once() -> None:
    """The issue's overload test: 60 s, a small limit; see `streamtx bench overload` for the latencies."""
    line = overload.run_limit(64, 60.0, partitions=2, quiet=True)
    assert line["exactly_once"], line["not_committed"]
    assert line["in_flight_peak"] >= 64, "the producers never filled the admission window"
    assert all(peak < overload.RSS_BOUND_MIB for peak in line["rss_peak_mib"].values()), line["rss_peak_mib"]
    assert len(line["samples"]) >= 10  # Health and Query kept answering, each within its deadline (DEADLINE_S)
    assert all(n > 0 for n in line["batches"].values()), line["batches"]


@pytest.mark.slow
def test_a_slow_subscriber_does_not_make_the_server_buffer(tmp_path) -> None:
    """A reader taking 0.1 s per batch while 100 KiB batches arrive at full speed: the front's memory stays put."""
    script = "CREATE STREAM feed (i BIGINT, payload VARCHAR);"
    rows = [{"i": i, "payload": "x" * 100} for i in range(1000)]
    extra = ["--stream-retention", "300"]
    with EmbeddedServer(tmp_path / "d", extra_args=extra) as srv, Client(srv.target, timeout=30) as c:
        c.deploy(script)
        front = psutil.Process(srv.proc.pid)
        stop = threading.Event()
        pushed = [0]

        def produce() -> None:
            with Client(srv.target, producer_id="feeder", max_in_flight=64) as p:
                while not stop.is_set():
                    p.push("feed", rows)
                    pushed[0] += 1
                p.flush()

        producer = threading.Thread(target=produce)
        producer.start()
        seen: list[int] = []
        peak = 0
        fell_behind = 0
        start = time.monotonic()
        from_batch = 0

        def enough() -> bool:  # 20 s, and more data went by than the bound holds (on a loaded machine: longer)
            elapsed = time.monotonic() - start
            return elapsed > 120 or (elapsed > 20 and pushed[0] * 100 * 1024 / 2**20 > overload.RSS_BOUND_MIB)

        try:
            with Client(srv.target) as reader:
                while not enough():
                    try:
                        for batch_id, result in reader.subscribe("feed", from_batch):
                            assert result.num_rows == len(rows)
                            seen.append(batch_id)
                            from_batch = batch_id + 1
                            peak = max(peak, front.memory_info().rss)
                            if enough():
                                break
                            time.sleep(0.1)
                    except OutOfRange as e:  # behind the retained batches: told by name, resumes past them
                        fell_behind += 1
                        from_batch = int(re.search(r"resume from (\d+)", e.message).group(1))
        finally:
            stop.set()
            producer.join(60)
        assert seen == sorted(seen) and len(set(seen)) == len(seen)
        assert fell_behind >= 1
        assert pushed[0] * 100 > 3 * 100 * len(seen)  # the reader fell far behind: most batches were never read
        assert pushed[0] * 100 * 1024 / 2**20 > overload.RSS_BOUND_MIB  # more data went by than the bound holds
        assert peak / 2**20 < overload.RSS_BOUND_MIB, peak / 2**20


def test_a_query_result_past_the_message_limit_is_refused_by_name(tmp_path) -> None:
    with EmbeddedServer(tmp_path / "d", extra_args=["--max-message-bytes", "100000"]) as srv, Client(srv.target) as c:
        with pytest.raises(ResourceExhausted) as big:
            c.query("SELECT i, repeat('x', 100) AS p FROM range(10000) t(i)")
        assert "10000 rows" in big.value.message and "--max-message-bytes (100000)" in big.value.message
        assert c.query("SELECT count(*) FROM range(10000)").fetchall() == [(10000,)]


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_query_past_the_timeout_is_stopped_by_name_and_the_server_goes_on(tmp_path, partitions) -> None:
    """At P = 1 the partition runs it; at P = 2 the front runs it over the gathered tables."""
    extra = ["--query-timeout", "0.5"]
    with EmbeddedServer(tmp_path / "d", partitions=partitions, extra_args=extra) as srv, Client(srv.target) as c:
        c.deploy(EVENTS)
        assert c.push_one("events", [{"k": 1, "v": 2}, {"k": 2, "v": 3}]).outcome == "committed"
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded) as slow:
            c.query("SELECT count(*) FROM totals a, totals b, range(100000000000) r WHERE r.range % 7 = a.k")
        assert time.monotonic() - started < 20
        assert "--query-timeout (0.5 s)" in slow.value.message and "nothing changed" in slow.value.message
        assert c.push_one("events", [{"k": 1, "v": 5}]).outcome == "committed"
        assert _totals(c) == [(1, 2, 7), (2, 1, 3)]


def test_a_push_whose_caller_gave_up_holds_its_room_until_it_has_its_outcome(tmp_path) -> None:
    extra = ["--max-in-flight", "1", "--push-wait", "0"]
    with EmbeddedServer(tmp_path / "d", extra_args=extra) as srv, Client(srv.target) as c:
        c.deploy(EVENTS)
        with grpc.insecure_channel(srv.target) as channel:
            stub = pb_grpc.StreamTxStub(channel)
            with pytest.raises(grpc.RpcError) as gave_up:
                stub.Push(_request("a", 2, k=1, v=20), timeout=0.5)  # parked for batch 1, the caller leaves
            assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            with pytest.raises(grpc.RpcError) as refused:  # batch 2 of "a" still holds the one slot
                stub.Push(_request("b", 1, k=2, v=5))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert stub.Push(_request("a", 1, k=1, v=10)).outcome == pb.COMMITTED
            again = stub.Push(_request("a", 2, k=1, v=20))  # it ran, once
            assert (again.outcome, again.original) == (pb.DUPLICATE, pb.COMMITTED)
            assert stub.Push(_request("b", 1, k=2, v=5)).outcome == pb.COMMITTED
        assert _totals(c) == [(1, 2, 30), (2, 1, 5)]
