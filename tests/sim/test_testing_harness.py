"""streamtx.testing runs a deploy script in-process and gives exactly what a real server gives.

For the same commands, a `Harness` and an `EmbeddedServer` under the same
executor answer the same outcomes (timestamps, reasons, codes), refuse the
same bad commands with the same messages, and end with the same tables and
stored outputs: on the counters example (a state procedure feeding a SQL
barrier that sometimes aborts) and on the voter as state procedures.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pyarrow as pa
import pytest

import streamtx.procedure
import streamtx.testing
from streamtx.client import Client
from streamtx.errors import FailedPrecondition, InvalidArgument, NotFound, StreamTxError
from streamtx.procedures.examples.counters import reference_add
from streamtx.procedures.voter.app import VoterConfig, deploy_script, generate_votes, setup_params
from streamtx.procedures.voter.reference import VoterReference
from streamtx.procedures.voter.state import QUERIES
from streamtx.server.embedded import EmbeddedServer
from streamtx.testing import Harness, RunResult, run

pytestmark = pytest.mark.timeout(300)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "procedures.md"

COUNTERS = """
CREATE TABLE counters (key BIGINT PRIMARY KEY, n BIGINT NOT NULL);
CREATE TABLE seen (batch BIGINT, total BIGINT);
CREATE STREAM counter_events (event_id BIGINT, key BIGINT, delta BIGINT, "limit" BIGINT, mirror BIGINT);
CREATE STREAM counter_results (event_id BIGINT, ok BOOLEAN);
CREATE STREAM counter_alerts (event_id BIGINT);
CREATE PROCEDURE alerting_add ON STREAM counter_events AS PYTHON 'examples.counters:alerting_add';
CREATE PROCEDURE audit ON STREAM counter_alerts AS BEGIN
    SELECT error('audit refuses event 3 mod 5') WHERE EXISTS (SELECT 1 FROM counter_alerts WHERE event_id % 5 = 3);
    INSERT INTO seen SELECT $ts, coalesce(sum(n), 0) FROM counters;
END;
CREATE PROCEDURE total (k BIGINT) AS BEGIN SELECT n FROM counters WHERE key = $k; END;
"""
STORED = {  # what the comparison reads: the tables, and the stored output with its batch ids
    "counters": "SELECT * FROM counters ORDER BY ALL",
    "seen": "SELECT * FROM seen ORDER BY ALL",
    "counter_results": "SELECT * FROM counter_results ORDER BY ALL",
}


def counter_batches() -> list[tuple[str, object]]:
    """Batches of 1..4 events on a few keys, limits that some pass; one batch whose rows do not fit."""
    batches: list[tuple[str, object]] = []
    event = 0
    for size in [1, 3, 2, 4, 1, 1, 2, 3, 4, 2, 1, 3]:
        rows = []
        for _ in range(size):
            rows.append(
                {"event_id": event, "key": event % 3, "delta": 1 + event % 7, "limit": 12 + event % 5, "mirror": None}
            )
            event += 1
        batches.append(("counter_events", rows))
    batches.insert(5, ("counter_events", {"event_id": [99], "key": ["not a key"], "delta": [1], "limit": [1]}))
    return batches


def model(batches: list[tuple[str, object]]) -> dict[int, int]:
    """The counters a server must end with: an aborted audit is downstream, its batch commits all the same."""
    counters: dict[int, int] = {}
    for _, rows in batches:
        if isinstance(rows, list):
            for e in rows:
                reference_add(counters, e["key"], e["delta"], e["limit"], None)
    return counters


@pytest.fixture(params=streamtx.testing.EXECUTORS)
def executor(request) -> str:
    return request.param


def refusals(app: Client | Harness) -> list[tuple[type, str]]:
    """Bad commands, each refused before it runs: the exception's class and message."""
    out = []
    for bad in (
        lambda: app.call("nope"),
        lambda: app.call("total", k="seven"),
        lambda: app.call("total", k=1, j=2),
        lambda: app.call("alerting_add"),
        lambda: app.query("DELETE FROM counters"),
        lambda: app.query("SELECT * FROM nope"),
    ):
        with pytest.raises(StreamTxError) as info:
            bad()
        out.append((type(info.value), info.value.message))
    return out


def test_the_harness_answers_what_a_server_answers_on_the_counters(tmp_path, executor):
    batches = counter_batches()
    with EmbeddedServer(tmp_path / "data", executor=executor) as srv, Client(srv.target) as c:
        c.deploy(COUNTERS)
        want = [f.result() for f in [c.push(s, rows) for s, rows in batches]]
        want += [c.push_one("counter_events", batches[1][1], batch_id=2), c.push_one("nope", batches[0][1])]
        want_called = c.call("total", k=1)
        want_refused = refusals(c)
        want_stored = {name: c.query(sql) for name, sql in STORED.items()}
        producer = c.producer_id
    with Harness(COUNTERS, executor=executor) as h:
        got = h.push_many(batches, producer=producer)
        got += [
            h.push("counter_events", batches[1][1], producer=producer, batch_id=2),
            h.push("nope", batches[0][1], producer=producer),
        ]
        assert h.call("total", k=1) == want_called
        assert refusals(h) == want_refused
        assert {name: h.query(sql) for name, sql in STORED.items()} == want_stored
        read = [(b, row) for b, r in h.read_stream("counter_results") for row in r.fetchall()]
        tables = h.tables()
    assert got == want
    outcomes = [(a.outcome, a.original, a.code.name if a.code else None) for a in got]
    assert any(a.reason.startswith("downstream TE aborted: audit") for a in got)
    assert ("rejected", None, "INVALID_ARGUMENT") in outcomes  # the batch whose rows do not fit
    assert outcomes[-2:] == [("duplicate", "committed", None), ("rejected", None, "NOT_FOUND")]
    assert {r["key"]: r["n"] for r in tables["counters"].to_pylist()} == model(batches)
    stored = want_stored["counter_results"].to_pylist()
    assert sorted(read) == sorted((r["__ts"], (r["event_id"], r["ok"])) for r in stored)


VOTER = VoterConfig(contestants=4, max_votes=2, delete_every=8, window=5, slide=2)


def vote_batches() -> list[tuple[str, pa.Table]]:
    table = generate_votes(40, seed=5, contestants=VOTER.contestants, phones=12, invalid_share=0.1)
    sizes = [1, 1, 3, 2, 1, 5, 1, 1, 4, 2, 1, 1, 3, 6, 1, 3, 4]
    assert sum(sizes) == table.num_rows
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [("votes_in", table.slice(at, n)) for at, n in zip(starts, sizes, strict=True)]


def voter_reference(batches: list[tuple[str, pa.Table]]) -> VoterReference:
    ref = VoterReference(VOTER)
    for _, b in batches:
        ref.process_batch(list(zip(*(b.column(n).to_pylist() for n in b.column_names), strict=True)))
    return ref


def voter_state(app: Client | Harness) -> dict[str, list]:
    queries = {
        **QUERIES,
        "rejected": "SELECT vote_id, reason FROM rejected_votes ORDER BY vote_id",
        "deletions": "SELECT contestant_number, removed_votes, __ts FROM deletions ORDER BY __ts",
        "created": "SELECT vote_id, created FROM votes ORDER BY vote_id",
    }
    return {name: app.query(sql).fetchall() for name, sql in queries.items()}


def test_the_harness_runs_the_voter_as_a_server_does(tmp_path, executor):
    batches = vote_batches()
    with EmbeddedServer(tmp_path / "data", executor=executor) as srv, Client(srv.target) as c:
        c.deploy(deploy_script(VOTER, "state"))
        c.call("setup", **setup_params(VOTER))
        want = [f.result() for f in [c.push(s, b) for s, b in batches]]
        want_state = voter_state(c)
        producer = c.producer_id
    with Harness(deploy_script(VOTER, "state"), executor=executor) as h:
        h.call("setup", **setup_params(VOTER))
        got = h.push_many(batches, producer=producer)
        got_state = voter_state(h)
    assert got == want
    assert got_state == want_state
    ref = voter_reference(batches)
    assert [(c, n) for c, n, _ in got_state["deletions"]] == ref.deletions and ref.deletions
    assert got_state["rejected"] == sorted(ref.rejected)


def test_run_checks_both_executors_agree_and_returns_what_they_left():
    batches = vote_batches()
    result = run(
        deploy_script(VOTER, "state"),
        batches,
        setup=lambda h: h.call("setup", **setup_params(VOTER)),
        interval_size=7,
    )
    ref = voter_reference(batches)
    assert [r.outcome for r in result.outcomes] == ["committed"] * len(batches)
    assert [r["contestant_number"] for r in result.tables["contestants"].to_pylist()] == sorted(ref.contestants)
    deleted = [
        (r["contestant_number"], r["removed_votes"]) for _, t in result.outputs["deletions"] for r in t.to_pylist()
    ]
    assert deleted == ref.deletions and ref.deletions
    rejected = [(r["vote_id"], r["reason"]) for _, t in result.outputs["rejected_votes"] for r in t.to_pylist()]
    assert sorted(rejected) == sorted(ref.rejected) and ref.rejected


def test_run_reports_the_first_difference():
    one = RunResult([], {"t": pa.table({"a": [1, 2]})}, {"s": [(3, pa.table({"x": [1, 2]}))]})
    same = RunResult([], {"t": pa.table({"a": [1, 2]})}, {"s": [(3, pa.table({"x": [2, 1]}))]})
    streamtx.testing._check_same("a vs b", one, same)  # a batch's tuples in any order
    other = RunResult([], {"t": pa.table({"a": [1, 3]})}, one.outputs)
    with pytest.raises(AssertionError, match="a vs b: table 't' differs"):
        streamtx.testing._check_same("a vs b", one, other)
    later = RunResult([], one.tables, {"s": [(4, pa.table({"x": [1, 2]}))]})
    with pytest.raises(AssertionError, match="stream 's' differs"):
        streamtx.testing._check_same("a vs b", one, later)


def test_the_harness_refuses_what_the_front_refuses():
    with Harness(COUNTERS) as h:
        rows = [{"event_id": 1, "key": 1, "delta": 1, "limit": 9, "mirror": None}]
        gap = h.push("counter_events", rows, batch_id=3)
        assert (gap.outcome, gap.code.name) == ("rejected", "FAILED_PRECONDITION") and "batch 1 was never" in gap.reason
        derived = h.push("counter_results", [{"event_id": 1, "ok": True}])
        assert derived.code.name == "FAILED_PRECONDITION" and "output of alerting_add" in derived.reason
        assert h.push("counter_events", rows).batch_id == 1  # refused batches use up no id
        with pytest.raises(NotFound, match="has no function 'nope' marked @procedure"):
            h.deploy("CREATE PROCEDURE p ON STREAM counter_events AS PYTHON 'examples.counters:nope';")
        with pytest.raises(InvalidArgument, match="CREATE TABLE"):
            h.deploy("CREATE TABLE broken (")
    with pytest.raises(ValueError, match="executor 'fast'"):
        Harness(executor="fast")
    with Harness(COUNTERS) as h, pytest.raises(FailedPrecondition, match="push batches to the stream"):
        h.call("alerting_add")


def test_the_procedure_and_testing_docstrings_and_the_docs_example_run():
    for module in (streamtx.procedure, streamtx.testing):
        failed, tried = doctest.testmod(module)
        assert tried and not failed, module.__name__
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(DOCS), "exec"), {})
