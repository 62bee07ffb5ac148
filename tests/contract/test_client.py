"""The Python client and the CLI against a real server (the `server` fixture of conftest).

Client-only logic (conversions, scripted stream failures) is in tests/unit/test_client_unit.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from support.proxy import Proxy

from streamtx import cli, errors
from streamtx.client import AsyncClient, Client, PushResult, Result
from streamtx.server.embedded import EmbeddedServer

SCRIPT = """
CREATE TABLE totals (k BIGINT PRIMARY KEY, n BIGINT);
CREATE STREAM events (k BIGINT, v BIGINT);   -- consumed by tally
CREATE STREAM raw (k BIGINT, v BIGINT);      -- consumed by nobody: subscribable
CREATE PROCEDURE tally() ON STREAM events AS BEGIN
  INSERT INTO totals SELECT k, sum(v) FROM events GROUP BY k
    ON CONFLICT (k) DO UPDATE SET n = totals.n + excluded.n;
END;
CREATE PROCEDURE bump(key BIGINT, amount BIGINT) AS BEGIN
  INSERT INTO totals SELECT $key, $amount WHERE $key IS NOT NULL
    ON CONFLICT (k) DO UPDATE SET n = totals.n + excluded.n;
  SELECT k, n FROM totals WHERE k = $key;
END;
"""


def arun(coro: Any, timeout: float = 120) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def rows(n: int, keys: int = 5, offset: int = 0) -> dict[str, list[int]]:
    return {"k": [(offset + i) % keys for i in range(n)], "v": [1] * n}


async def total(c: AsyncClient) -> int:
    return (await c.query("SELECT coalesce(sum(n), 0)::BIGINT AS n FROM totals")).fetchall()[0][0]


@pytest.fixture
def deployed(server: EmbeddedServer) -> EmbeddedServer:
    with Client(server.target) as c:
        c.deploy(SCRIPT)
    return server


# -- pipelined pushes ---------------------------------------------------------------------


def test_pipelined_pushes_acked_in_order_within_window(deployed: EmbeddedServer) -> None:
    async def go() -> tuple[list[PushResult], int, int]:
        async with AsyncClient(deployed.target, max_in_flight=16) as c:
            futures, seen = [], 0
            for i in range(300):
                futures.append(await c.push("events", rows(10, offset=i)))
                seen = max(seen, c.in_flight)
                assert c.in_flight <= 16
            results = await asyncio.gather(*futures)
            assert await c.flush() == [] and c.in_flight == 0
            return results, seen, await total(c)

    results, seen, n = arun(go())
    assert seen == 16  # the window filled: pushes waited for acks
    assert [r.batch_id for r in results] == list(range(1, 301))
    assert all(r.outcome == "committed" and r.stream == "events" for r in results)
    assert all(r.rows == 10 for r in results)
    stamps = [r.timestamp for r in results]
    assert stamps == sorted(stamps) and len(set(stamps)) == 300  # batch-id order
    assert n == 3000


def test_duplicate_repush_changes_nothing(deployed: EmbeddedServer) -> None:
    async def go() -> tuple[list[PushResult], list[PushResult], PushResult, int]:
        async with AsyncClient(deployed.target, producer_id="replayer") as c:
            first = [await (await c.push("events", rows(4))) for _ in range(5)]
        async with AsyncClient(deployed.target, producer_id="replayer") as c:
            again = [await c.push("events", rows(4)) for _ in range(5)]  # ids 1..5 again
            again_results = list(await asyncio.gather(*again))
            one = await c.push_one("events", rows(4), batch_id=3)
            return first, again_results, one, await total(c)

    first, again, one, n = arun(go())
    assert [r.outcome for r in first] == ["committed"] * 5
    assert [r.batch_id for r in again] == [1, 2, 3, 4, 5]
    assert all(r.outcome == "duplicate" and r.original == "committed" and r.ok for r in again)
    assert one.outcome == "duplicate"
    assert n == 20  # exactly once


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_stream_created_again_answers_duplicates_with_its_own_timestamps(tmp_path: Path, partitions: int) -> None:
    """Dropping a stream forgets what each producer pushed on it: batch 1 on the stream created again is new, and
    its re-send is a duplicate of that batch, with that batch's timestamp (not the dropped stream's)."""
    with EmbeddedServer(tmp_path / "data", partitions=partitions) as srv, Client(srv.target, producer_id="p") as c:
        c.deploy(SCRIPT)
        first = [c.push("events", rows(2), batch_id=i).result() for i in (1, 2, 3)]
        c.deploy("DROP PROCEDURE tally; DROP STREAM events;")
        c.deploy(
            "CREATE STREAM events (k BIGINT, v BIGINT);\n"
            "CREATE PROCEDURE tally() ON STREAM events AS BEGIN INSERT INTO totals SELECT k, sum(v) FROM events "
            "GROUP BY k ON CONFLICT (k) DO UPDATE SET n = totals.n + excluded.n; END;"
        )
        again = c.push("events", rows(2), batch_id=1).result()
        resent = c.push("events", rows(2), batch_id=1).result()
    assert [r.outcome for r in first] == ["committed"] * 3
    assert again.outcome == "committed" and again.timestamp > first[-1].timestamp
    assert (resent.outcome, resent.original, resent.timestamp) == ("duplicate", "committed", again.timestamp)


def test_protobuf_rows_and_push_one(deployed: EmbeddedServer) -> None:
    async def go() -> tuple[PushResult, PushResult, int]:
        async with AsyncClient(deployed.target, arrow=False) as c:
            a = await (await c.push("events", [{"k": 1, "v": 2}, {"k": 2, "v": 3}]))
            b = await c.push_one("events", pd.DataFrame({"k": [1], "v": [5]}))
            return a, b, await total(c)

    a, b, n = arun(go())
    assert (a.outcome, a.batch_id, b.outcome, b.batch_id) == ("committed", 1, "committed", 2)
    assert n == 10


def test_broken_connection_resends_with_same_ids(deployed: EmbeddedServer) -> None:
    proxy = Proxy(deployed.target)
    try:

        async def go() -> tuple[list[PushResult], int]:
            async with AsyncClient(proxy.target, max_in_flight=32, retries=8) as c:
                futures = []
                for i in range(200):
                    futures.append(await c.push("events", rows(5, offset=i)))
                    if i == 60:
                        proxy.cut()  # many batches unacknowledged at this point
                results = await asyncio.gather(*futures)
                return results, await total(c)

        results, n = arun(go())
    finally:
        proxy.close()
    assert proxy.connections >= 2  # the stream was re-established
    assert [r.batch_id for r in results] == list(range(1, 201))
    assert all(r.outcome == "committed" or r.original == "committed" for r in results)
    assert n == 1000  # re-sent batches were not applied twice


def test_a_client_given_several_targets_moves_to_the_next_and_resends_there(deployed: EmbeddedServer) -> None:
    """The first target goes away mid-stream for good; the batches it had not acknowledged go to the second."""
    proxy = Proxy(deployed.target)

    async def go() -> tuple[list[PushResult], int, str]:
        async with AsyncClient(f"{proxy.target},{deployed.target}", max_in_flight=32) as c:
            futures = []
            for i in range(200):
                futures.append(await c.push("events", rows(5, offset=i)))
                if i == 60:
                    proxy.cut()
                    await asyncio.sleep(0.3)  # the cut connections closed
                    proxy.close()  # and no longer listening: only the second target answers
            results = await asyncio.gather(*futures)
            return results, await total(c), c.target

    results, n, target = arun(go())
    assert target == deployed.target
    assert [r.batch_id for r in results] == list(range(1, 201))
    assert all(r.outcome == "committed" or r.original == "committed" for r in results)
    assert n == 1000  # nothing taken twice
    with pytest.raises(ValueError, match="no HOST:PORT"):
        AsyncClient(" , ")


def test_the_spark_connection_given_several_targets_moves_to_the_next(deployed: EmbeddedServer) -> None:
    from streamtx.client.spark.rpc import Conn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    with Conn(f"{dead},{deployed.target}", retry_for_s=10) as conn:
        assert conn.describe("events").border
        assert conn.target == deployed.target and conn.retries >= 1


# -- sync client: deploy, query, call, subscribe, status -------------------------------------


def test_sync_client_surface(client: Client) -> None:
    d = client.deploy(SCRIPT)
    assert ("stream", "events") in d.created and ("procedure", "bump") in d.created
    futures = [client.push("raw", {"k": [i], "v": [i * 10]}) for i in range(5)]
    results = [f.result(timeout=30) for f in futures]
    assert [r.batch_id for r in results] == [1, 2, 3, 4, 5]
    client.push("events", rows(7)).result(timeout=30).raise_for_outcome()

    q = client.query("SELECT k, n FROM totals WHERE n >= $min ORDER BY k", {"min": 1})
    assert isinstance(q, Result) and q.column_names == ["k", "n"]
    df = q.df()
    assert isinstance(df, pd.DataFrame) and df["n"].sum() == 7
    assert len(q) == 5 and q.fetchall()[0] == (0, 2)

    (res,) = client.call("bump", key=100, amount=5)
    assert res.to_pylist() == [{"k": 100, "n": 5}]
    (res,) = client.call("bump", key=100, amount=1)
    assert res.fetchall() == [(100, 6)]

    got = []
    for ts, batch in client.subscribe("raw"):
        got.append((ts, batch.to_pylist()))
        if len(got) == 5:
            break
    assert [r for _, r in got] == [[{"k": i, "v": i * 10}] for i in range(5)]
    assert [b for b, _ in got] == [r.timestamp for r in results]  # a stream batch is named by its timestamp
    later = list(_take(client.subscribe("raw", from_ts=got[2][0]), 3))
    assert [b for b, _ in later] == [b for b, _ in got[2:]]

    status = client.status()
    assert status["executor"] in ("serial", "opchain")
    assert status["streams"] == ["events", "raw"] and "totals" in status["tables"]
    client.deploy("CREATE INDEX totals_n ON totals (n);")
    assert client.status()["indexes"] == ["totals_n"]
    assert status["partitions"][0]["alive"] is True
    assert isinstance(status["last_timestamp"], int) and status["last_timestamp"] >= 8
    assert all(isinstance(v, int) for v in status["counters"].values())


def _take(it: Iterator[Any], n: int) -> Iterator[Any]:
    for i, item in enumerate(it):
        yield item
        if i + 1 == n:
            return


def test_async_subscribe(deployed: EmbeddedServer) -> None:
    async def go() -> list[list[dict[str, int]]]:
        async with AsyncClient(deployed.target) as c:
            got: list[list[dict[str, int]]] = []

            async def reader() -> None:
                async with contextlib.aclosing(c.subscribe("raw")) as batches:
                    async for _, batch in batches:
                        got.append(batch.to_pylist())
                        if len(got) == 3:
                            return

            task = asyncio.create_task(reader())  # subscribed before the pushes
            for i in range(3):
                (await (await c.push("raw", [{"k": i, "v": 0}]))).raise_for_outcome()
            await asyncio.wait_for(task, 30)
            return got

    assert arun(go()) == [[{"k": i, "v": 0}] for i in range(3)]


# -- error mapping ----------------------------------------------------------------------------


def test_errors_map_to_streamtx_exceptions(deployed: EmbeddedServer) -> None:
    async def go() -> None:
        async with AsyncClient(deployed.target) as c:
            rejected = await (await c.push("nope", rows(1)))
            assert rejected.outcome == "rejected" and not rejected.ok
            assert "nope" in rejected.reason
            with pytest.raises(errors.NotFound, match="unknown stream 'nope'"):
                rejected.raise_for_outcome()
            with pytest.raises(errors.NotFound):
                (await c.push_one("nope", rows(1))).raise_for_outcome()
            bad = await (await c.push("raw", [{"k": 1, "zz": 2}]))
            with pytest.raises(errors.InvalidArgument, match="zz"):
                bad.raise_for_outcome()
            with pytest.raises(errors.NotFound, match="nope"):
                await c.call("nope")
            with pytest.raises(errors.FailedPrecondition):
                await c.call("tally")  # runs ON STREAM: push instead
            with pytest.raises(errors.InvalidArgument):
                await c.call("bump", key=1)  # missing parameter
            with pytest.raises(errors.InvalidArgument):
                await c.query("SELEC nonsense")
            with pytest.raises(errors.InvalidArgument):
                await c.query("DELETE FROM totals")  # Query is read-only
            with pytest.raises(errors.InvalidArgument):
                await c.deploy("CREATE STREAM broken (a)")
            with pytest.raises(errors.NotFound):
                async for _ in c.subscribe("nope"):
                    pass
            with pytest.raises(errors.FailedPrecondition):
                async for _ in c.subscribe("events"):  # consumed by tally
                    pass

    arun(go())


def test_token_is_sent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with EmbeddedServer(tmp_path / "data", token="s3cret") as srv:
        with Client(srv.target) as c, pytest.raises(errors.Unauthenticated):
            c.deploy(SCRIPT)
        with Client(srv.target, token="wrong") as c, pytest.raises(errors.Unauthenticated):
            c.deploy(SCRIPT)
        with Client(srv.target, token="s3cret") as c:
            assert c.deploy(SCRIPT).created
            assert c.push("raw", rows(1)).result(timeout=30).ok
        script = tmp_path / "app.sql"
        script.write_text("CREATE TABLE more (a INT);")
        assert cli.main(["--target", srv.target, "deploy", str(script)]) == 2
        assert capsys.readouterr().err.startswith("error: UNAUTHENTICATED: ")
        assert cli.main(["--target", srv.target, "--token", "s3cret", "deploy", str(script)]) == 0
        assert "created table more" in capsys.readouterr().out


def test_unreachable_server_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    with Client(f"127.0.0.1:{port}", retries=1) as c:
        with pytest.raises(errors.Unavailable):
            c.status()
        with pytest.raises(errors.Unavailable):
            c.push("raw", rows(1)).result(timeout=30)


# -- CLI ----------------------------------------------------------------------------------------


def test_cli_against_server(server: EmbeddedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = ["--target", server.target]
    script = tmp_path / "app.sql"
    script.write_text(SCRIPT)
    assert cli.main([*t, "deploy", str(script)]) == 0
    out = capsys.readouterr().out
    assert "created table totals" in out and "created procedure bump" in out

    csv = tmp_path / "events.csv"
    csv.write_text("k,v\n" + "".join(f"{i % 3},1\n" for i in range(95)))
    push = [*t, "push", "events", "--file", str(csv), "--batch-size", "10"]
    assert cli.main([*push, "--producer-id", "cli-1"]) == 0
    out = capsys.readouterr().out
    assert "10 committed" in out and "0 duplicate" in out and "0 rejected" in out
    assert cli.main([*push, "--producer-id", "cli-1", "--protobuf"]) == 0
    assert "10 duplicate" in capsys.readouterr().out

    assert cli.main([*t, "sql", "SELECT sum(n)::BIGINT AS total FROM totals"]) == 0
    out = capsys.readouterr().out
    assert "total" in out and "95" in out and "1 row" in out

    assert cli.main([*t, "call", "bump", "key=7", "amount=3"]) == 0
    out = capsys.readouterr().out
    assert "7" in out and "3" in out

    assert cli.main([*t, "explain", "bump"]) == 0
    out = capsys.readouterr().out
    assert "bump statement 1 (compiled)" in out and "bump statement 2 (compiled)" in out
    assert cli.main([*t, "explain", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: NOT_FOUND: ")

    assert cli.main([*t, "status"]) == 0
    out = capsys.readouterr().out
    assert "events" in out and "totals" in out and "partitions" in out and "counters" in out

    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(f'{{"k": {i}, "v": {10 * i}}}\n' for i in range(5)))
    assert cli.main([*t, "push", "raw", "-f", str(raw), "--batch-size", "2", "-q"]) == 0
    capsys.readouterr()
    assert cli.main([*t, "subscribe", "raw", "--batches", "3"]) == 0
    batches = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [b["rows"] for b in batches] == [
        [{"k": 0, "v": 0}, {"k": 1, "v": 10}],
        [{"k": 2, "v": 20}, {"k": 3, "v": 30}],
        [{"k": 4, "v": 40}],
    ]
    stamps = [b["ts"] for b in batches]
    assert stamps == sorted(stamps) and len(set(stamps)) == 3
    assert cli.main([*t, "subscribe", "raw", "--from-ts", str(stamps[1] + 1), "-n", "1"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [batches[2]]
    assert cli.main([*t, "subscribe", "events", "-n", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: FAILED_PRECONDITION: ")

    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"k": 1, "v": 1}\n')
    assert cli.main([*t, "push", "nope", "-f", str(jsonl), "-q"]) == 1
    out = capsys.readouterr().out
    assert "1 rejected" in out and "NOT_FOUND" in out

    assert cli.main([*t, "sql", "SELECT * FROM missing"]) == 2
    assert capsys.readouterr().err.startswith("error: INVALID_ARGUMENT: ")
    assert cli.main([*t, "call", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: NOT_FOUND: ") and err.count("\n") == 1


def test_cli_health_reports_serving(server, capsys):
    from streamtx import cli

    assert cli.main(["--target", server.target, "health"]) == 0
    assert "SERVING" in capsys.readouterr().out
    assert cli.main(["--target", "127.0.0.1:1", "health"]) == 1


def test_client_connects_to_a_briefly_stalled_server(tmp_path):
    """The server's front process stalls 0.5 s (as on a busy machine) while a new client deploys."""
    with EmbeddedServer(tmp_path / "data") as srv:
        os.kill(srv.proc.pid, signal.SIGSTOP)
        resume = threading.Timer(0.5, os.kill, (srv.proc.pid, signal.SIGCONT))
        resume.start()
        try:
            with Client(srv.target) as c:
                c.deploy("CREATE TABLE t (a INTEGER);")
                assert c.status()["tables"] == ["t"]
        finally:
            resume.join()
