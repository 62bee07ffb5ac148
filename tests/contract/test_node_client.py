"""The Node.js client (clients/node) meets the wire contract against real servers.

Node runs `clients/node/test/driver.js`, the command-line face of `streamtx.js`, in a
subprocess: deploy, query and call in ROWS format, pipelined pushes over PushStream.
What it reports is compared with an expected state computed here and with the Python
client's view. The crash test SIGKILLs the whole server while the Node producer pushes,
restarts it on the same data directory and port, and checks every batch was applied once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import drop_all
from support.partitions import keys_on
from support.processes import wait_dead
from support.proxy import Proxy

from streamtx.client import Client
from streamtx.server.embedded import EmbeddedServer

pytestmark = pytest.mark.timeout(300)

PARTITIONS = (1, 2)
IDS = [f"P{p}" for p in PARTITIONS]
NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
DRIVER = NODE_DIR / "test" / "driver.js"
APP = """
CREATE STREAM events (k BIGINT, n BIGINT) PARTITION BY (k);
CREATE TABLE totals (k BIGINT PRIMARY KEY, n BIGINT NOT NULL, hits BIGINT NOT NULL) PARTITION BY (k);
CREATE PROCEDURE tally ON STREAM events AS BEGIN
    SELECT error('negative n') WHERE EXISTS (SELECT 1 FROM events WHERE n < 0);
    INSERT INTO totals SELECT k, sum(n), count(*) FROM events GROUP BY k
        ON CONFLICT DO UPDATE SET n = totals.n + excluded.n, hits = totals.hits + excluded.hits;
END;
CREATE PROCEDURE total (k BIGINT) PARTITION ON k AS BEGIN SELECT k, n FROM totals WHERE k = $k; END;
"""
KEYS = {0: keys_on(2, 0, 3), 1: keys_on(2, 1, 3)}
"""Keys owned by each partition at P = 2 (at P = 1 all are on partition 0)."""
TOTALS = "SELECT k, n, hits FROM totals ORDER BY k"

Batch = list[dict[str, Any]]


@pytest.fixture(scope="module")
def node() -> str:
    """The node executable, with clients/node's dependencies installed (`npm ci` on a fresh clone)."""
    exe = shutil.which("node")
    message = "node not found: install Node.js >= 18 to test clients/node"
    if exe is None:
        pytest.skip(message)
    major = int(subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout[1:].split(".")[0])
    if major < 18:
        pytest.skip(f"{message} (found {major})")
    if not (NODE_DIR / "node_modules").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm not found: install npm, or run `npm ci` in clients/node, to test clients/node")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR, check=True)
    return exe


@pytest.fixture(scope="module", params=PARTITIONS, ids=IDS)
def srv(request, tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("node"), partitions=request.param) as s:
        yield s


@pytest.fixture
def target(srv) -> str:
    """The module's server, emptied: each test deploys what it needs through the Node client."""
    with Client(srv.target) as c:
        drop_all(c)
    return srv.target


def _decode(obj: dict[str, Any]) -> Any:
    """The driver's JSON: BigInts as {"bigint": digits}, Buffers as {"type": "Buffer", "data": bytes}."""
    if obj.keys() == {"bigint"}:
        return int(obj["bigint"])
    if obj.keys() == {"type", "data"} and obj["type"] == "Buffer":
        return bytes(obj["data"])
    return obj


def lines(text: str) -> list[Any]:
    return [json.loads(line, object_hook=_decode) for line in text.splitlines() if line.strip()]


def run(node: str, target: str, *args: str, stdin: str = "", ok: bool = True, token: str | None = None) -> Any:
    """Runs one driver verb; returns its one JSON line (or, for push, all of them)."""
    env = {k: v for k, v in os.environ.items() if k != "STREAMTX_TOKEN"} | ({"STREAMTX_TOKEN": token} if token else {})
    cmd = [node, str(DRIVER), target, *args]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120, env=env)
    out = lines(proc.stdout)
    assert (proc.returncode == 0) == ok, (proc.returncode, proc.stdout, proc.stderr)
    return out if args[0] == "push" else out[0]


def push(
    node: str,
    target: str,
    producer: str,
    batches: list[Batch],
    *,
    window: int = 16,
    pack: bool = False,
    ids: list[int] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Pushes batches pipelined from Node; returns (acks in push order, the driver's summary)."""
    stdin = "".join(
        json.dumps({"stream": "events", "rows": rows, **({"batch_id": ids[i]} if ids else {})}) + "\n"
        for i, rows in enumerate(batches)
    )
    out = run(node, target, "push", producer, str(window), *(["pack"] if pack else []), stdin=stdin)
    summary = out.pop()
    assert summary["done"], summary
    assert sorted(a["i"] for a in out) == list(range(len(batches)))
    return sorted(out, key=lambda a: a["i"]), summary


def apply(batches: list[Batch], committed: list[bool]) -> list[tuple[int, int, int]]:
    """The expected `totals` rows: every committed batch applied once."""
    n: Counter[int] = Counter()
    hits: Counter[int] = Counter()
    for rows, ok in zip(batches, committed, strict=True):
        for r in rows if ok else ():
            n[r["k"]] += r["n"]
            hits[r["k"]] += 1
    return [(k, n[k], hits[k]) for k in sorted(n)]


def random_batches(rng: random.Random, count: int, side: int | None = None) -> list[Batch]:
    """Batches of 1-3 rows, on partition 0's keys, partition 1's, or both (at P = 2)."""
    out = []
    for _ in range(count):
        sides = [side] if side is not None else rng.choice([[0], [1], [0, 1]])
        out.append(
            [{"k": rng.choice(KEYS[rng.choice(sides)]), "n": rng.randint(1, 9)} for _ in range(rng.randint(1, 3))]
        )
    return out


def node_totals(node: str, target: str) -> list[tuple[int, int, int]]:
    return [(r["k"], r["n"], r["hits"]) for r in run(node, target, "query", TOTALS)]


def test_pipelined_pushes_rejections_duplicates_and_reads(node, target):
    deployed = run(node, target, "deploy", stdin=APP)
    assert {(o["kind"], o["name"]) for o in deployed["created"]} == {
        ("stream", "events"),
        ("table", "totals"),
        ("procedure", "tally"),
        ("procedure", "total"),
    }
    batches = random_batches(random.Random(7), 120)
    inexact = {5, 40, 41, 99}  # 1.5 into BIGINT: the batch does not fit the stream
    aborted = {17, 60}  # a negative n: the procedure the batch feeds aborts it
    for i in inexact:
        batches[i] = [*batches[i], {"k": KEYS[0][0], "n": 1.5}]
    for i in aborted:
        batches[i] = [{"k": KEYS[1][0], "n": -3}, *batches[i]]
    acks, summary = push(node, target, "node-1", batches, window=8)
    assert summary["calls"] == 1
    for i, ack in enumerate(acks):
        assert (ack["batchId"], ack["producerId"], ack["rows"]) == (i + 1, "node-1", len(batches[i]))
        if i in inexact:
            assert (ack["outcome"], ack["codeName"], ack["code"]) == ("REJECTED", "INVALID_ARGUMENT", 3), ack
            assert "column 'n'" in ack["reason"] and "1.5" in ack["reason"] and "BIGINT" in ack["reason"]
        elif i in aborted:
            assert (ack["outcome"], ack["codeName"]) == ("REJECTED", "ABORTED"), ack
            assert "negative n" in ack["reason"]
        else:
            assert (ack["outcome"], ack["code"], ack["reason"]) == ("COMMITTED", 0, ""), ack
    stamps = [a["timestamp"] for a in acks]
    assert stamps == sorted(set(stamps)) and stamps[0] > 0  # taken in batch-id order
    committed = [a["outcome"] == "COMMITTED" for a in acks]

    # Re-sent ids (a committed batch, a rejected one of each kind), with other rows on the other partition:
    # DUPLICATE with the original outcome, nothing changes. Then the producer goes on with a new id.
    again = [3, 5, 17, 50, 119]
    other = random_batches(random.Random(8), len(again), side=1) + random_batches(random.Random(9), 1, side=0)
    acks2, _ = push(node, target, "node-1", other, ids=[i + 1 for i in again] + [121])
    for i, ack in zip(again, acks2, strict=False):
        first = acks[i]
        assert (ack["batchId"], ack["outcome"], ack["original"]) == (i + 1, "DUPLICATE", first["outcome"]), ack
        if first["outcome"] == "REJECTED":
            assert (ack["code"], ack["reason"]) == (first["code"], first["reason"])
    assert acks2[-1]["batchId"] == 121 and acks2[-1]["outcome"] == "COMMITTED"
    expected = apply([*batches, other[-1]], [*committed, True])

    with Client(target) as c:
        python_view = [tuple(r) for r in c.query(TOTALS).fetchall()]
    assert node_totals(node, target) == python_view == expected
    k, n, _ = expected[0]
    assert run(node, target, "call", "total", json.dumps({"k": k})) == [[{"k": k, "n": n}]]


def test_coalesced_acks_of_packed_messages_resolve_every_batch(node, target):
    run(node, target, "deploy", stdin=APP)
    batches = random_batches(random.Random(3), 200)
    acks, summary = push(node, target, "node-packed", batches, window=64, pack=True)
    assert [(a["batchId"], a["outcome"]) for a in acks] == [(i + 1, "COMMITTED") for i in range(len(batches))]
    stamps = [a["timestamp"] for a in acks]
    assert stamps == sorted(set(stamps))
    assert summary["coalesced"] > 0, summary  # some acks covered several batches (`count`)
    assert node_totals(node, target) == apply(batches, [True] * len(batches))


def test_a_packed_message_rejects_only_the_batch_that_does_not_fit(node, target):
    run(node, target, "deploy", stdin=APP)
    batches = [[{"k": KEYS[0][0], "n": 1}] for _ in range(8)]
    batches[5] = [{"k": KEYS[0][0], "n": 1.5}]
    acks, _ = push(node, target, "node-packed-bad", batches, window=8, pack=True)
    assert [a["outcome"] for a in acks] == ["COMMITTED"] * 5 + ["REJECTED"] + ["COMMITTED"] * 2


def test_results_in_rows_format_keep_every_type_exact(node, target):
    sql = (
        "SELECT 9007199254740993 AS big, (-9223372036854775808)::BIGINT AS low, 0.5::DOUBLE AS d, 'naïve' AS s, "
        "true AS b, '\\x01\\xFF'::BLOB AS y, [1, 2]::BIGINT[] AS l, NULL AS z, 1.50::DECIMAL(10, 2) AS price, "
        "TIMESTAMP '2024-01-02 03:04:05.123456' AS ts, DATE '2024-01-02' AS day, $p AS p, $q AS q"
    )
    params = json.dumps({"p": {"bigint": str(2**62 + 1)}, "q": [1.25, None]})
    assert run(node, target, "query", sql, params) == [
        {
            "big": 2**53 + 1,
            "low": -(2**63),
            "d": 0.5,
            "s": "naïve",
            "b": True,
            "y": b"\x01\xff",
            "l": [1, 2],
            "z": None,
            "price": "1.50",
            "ts": "2024-01-02 03:04:05.123456",
            "day": "2024-01-02",
            "p": 2**62 + 1,
            "q": [1.25, None],
        }
    ]


def test_errors_are_statuses_naming_what_is_wrong(node, target):
    err = run(node, target, "query", "SELECT * FROM nowhere", ok=False)["error"]
    assert err["codeName"] == "INVALID_ARGUMENT" and err["code"] == 3 and "nowhere" in err["message"]
    err = run(node, target, "deploy", stdin="CREATE TABLE t (a NOSUCHTYPE);", ok=False)["error"]
    assert err["codeName"] == "INVALID_ARGUMENT" and "NOSUCHTYPE" in err["message"].upper()
    err = run(node, target, "call", "nosuch", ok=False)["error"]
    assert err["codeName"] == "NOT_FOUND" and "nosuch" in err["message"]


def test_the_token_goes_as_bearer_metadata(node, tmp_path):
    with EmbeddedServer(tmp_path / "data", token="s3cret") as srv:
        err = run(node, srv.target, "deploy", stdin=APP, ok=False)["error"]
        assert err["codeName"] == "UNAUTHENTICATED" and "no token given" in err["message"]
        err = run(node, srv.target, "deploy", stdin=APP, ok=False, token="guess")["error"]
        assert err["codeName"] == "UNAUTHENTICATED" and "wrong token" in err["message"]
        assert len(run(node, srv.target, "deploy", stdin=APP, token="s3cret")["created"]) == 4


# --------------------------------------------------------------------------- the server dies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_server(srv: EmbeddedServer) -> None:
    """SIGKILL of the front and of every worker, as a machine crash would leave them."""
    with Client(srv.target) as c:
        workers = [p["pid"] for p in c.status()["partitions"]]
    srv.kill()
    for pid in wait_dead(workers, 10):
        os.kill(pid, signal.SIGKILL)
    assert wait_dead(workers, 10) == []


def push_through(
    node: str, target: str, producer: str, batches: list[Batch], after: Callable[[int], None]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Pushes from Node while the test acts on the way: `after(n)` runs as the n-th ack arrives. Every batch must
    end acknowledged exactly once (committed, or DUPLICATE of a commit); returns (acks in push order, summary)."""
    proc = subprocess.Popen(
        [node, str(DRIVER), target, "push", producer, "16"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None and stdout is not None

    def feed() -> None:
        with stdin:
            for rows in batches:
                stdin.write(json.dumps({"stream": "events", "rows": rows}) + "\n")

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        acks = []
        for line in stdout:
            out = lines(line)[0]
            if "done" in out:
                summary = out
                break
            assert "error" not in out, out
            acks.append(out)
            after(len(acks))
        assert proc.wait(60) == 0
        feeder.join()
    finally:
        if proc.poll() is None:
            proc.kill()
    acks.sort(key=lambda a: a["i"])
    assert [a["batchId"] for a in acks] == list(range(1, len(batches) + 1))
    outcomes = Counter((a["outcome"], a["original"]) for a in acks)
    assert set(outcomes) <= {("COMMITTED", None), ("DUPLICATE", "COMMITTED")}, outcomes
    return acks, summary


@pytest.mark.slow
@pytest.mark.parametrize("partitions", PARTITIONS, ids=IDS)
def test_the_producer_reconnects_after_server_crashes_and_applies_every_batch_once(node, tmp_path, partitions):
    args = ["--port", str(free_port()), "--order-timeout", "30"]  # the same port after each restart
    srv = EmbeddedServer(tmp_path / "data", partitions=partitions, extra_args=args).start()
    batches = random_batches(random.Random(partitions), 400)
    crashes = {50, 200}  # after this many acks the server dies, with batches in flight

    def crash(acked: int) -> None:
        if acked in crashes:
            kill_server(srv)
            srv.start()

    try:
        with Client(srv.target) as c:
            c.deploy(APP)
        _, summary = push_through(node, srv.target, "node-crash", batches, crash)
        assert summary["calls"] > len(crashes)  # it reconnected after each crash
        expected = apply(batches, [True] * len(batches))
        with Client(srv.target) as c:
            assert [tuple(r) for r in c.query(TOTALS).fetchall()] == expected
        assert node_totals(node, srv.target) == expected
    finally:
        srv.close()


def test_a_client_given_several_targets_moves_to_the_next_and_resends_there(node, target):
    """The first host goes away mid-stream for good (a cluster host dying); the producer sends what it had not
    acknowledged to the second, same ids, and reads go there too."""
    run(node, target, "deploy", stdin=APP)
    batches = random_batches(random.Random(11), 300)
    proxy = Proxy(target)

    def go_away(acked: int) -> None:
        if acked == 60:
            proxy.cut()  # with batches in flight
            proxy.close()  # and no longer listening: only the second target answers

    try:
        _, summary = push_through(node, f"{proxy.target},{target}", "node-failover", batches, go_away)
    finally:
        proxy.close()
    assert summary["calls"] == 2  # one PushStream through the first target, then one to the second
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there: a read moves on to the next target
    assert node_totals(node, f"{dead},{target}") == apply(batches, [True] * len(batches))


def test_a_value_javascript_cannot_send_fails_the_push_naming_row_and_column(node, target):
    run(node, target, "deploy", stdin=APP)
    out = run(node, target, "push", "node-bad", "4", stdin='{"stream": "events", "rows": [{"k": {}}]}\n', ok=False)
    assert out[-1]["error"]["message"].startswith("row 0 column 'k': cannot send a Object")
    assert re.search(r"number, BigInt, string", out[-1]["error"]["message"])


def test_subscribe_follows_a_stream_from_a_timestamp_as_the_python_client_does(node, target):
    with Client(target) as c:
        c.deploy("CREATE STREAM feed (k BIGINT, note VARCHAR);")
        acks = [c.push("feed", {"k": [i, -i], "note": [f"n{i}", None]}).result() for i in range(1, 4)]
        with contextlib.closing(c.subscribe("feed", from_ts=acks[1].timestamp)) as sub:
            want = [(ts, rows.to_pylist()) for ts, rows in itertools.islice(sub, 2)]
    assert [ts for ts, _ in want] == [acks[1].timestamp, acks[2].timestamp]
    got = lines(
        subprocess.run(
            [node, str(DRIVER), target, "subscribe", "feed", str(acks[1].timestamp), "2"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    )
    assert [(b["ts"], b["rows"]) for b in got] == want
    err = run(node, target, "subscribe", "nope", "0", "1", ok=False)["error"]
    assert err["codeName"] == "NOT_FOUND" and "nope" in err["message"]
