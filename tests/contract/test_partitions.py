"""Partitioned execution: routing by key, replicated tables, multi-partition TEs, scatter/gather, exchange.

Every test runs a real server with P worker processes. Where rows live is
checked through Status (`partition<i>.rows.<table>`) against the partition map
the server uses (round-robin bins), and results against plain Python.
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.partitions import ACCOUNTS, deposits, keys_on, owners

from streamtx.client import Client
from streamtx.errors import InvalidArgument
from streamtx.server.embedded import EmbeddedServer
from streamtx.server.partitioning import SMALL, PartitionMap, key_hashes

pytestmark = pytest.mark.timeout(300)


KEY_TYPES = {
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "int16": (pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    "uint32": (pa.uint32(), st.integers(0, 2**32 - 1)),
    "string": (pa.string(), st.text(max_size=6)),
}


@settings(max_examples=300, deadline=None)
@given(data=st.data(), kind=st.sampled_from(sorted(KEY_TYPES)), partitions=st.integers(1, 5))
def test_a_few_keys_hash_in_python_as_the_vectorised_hash_does(data, kind, partitions):
    """Up to `SMALL` keys take the Python path; it must place every key where `key_hashes` does."""
    arrow_type, values = KEY_TYPES[kind]
    keys = data.draw(st.lists(st.one_of(st.none(), values), min_size=1, max_size=SMALL))
    pmap = PartitionMap.round_robin(partitions, 1024)
    expected = np.asarray(pmap.owner)[(key_hashes(pa.array(keys, arrow_type)) % np.uint64(1024)).astype(np.int64)]
    assert pmap.owners(pa.array(keys, arrow_type)).tolist() == expected.tolist()
    half = len(keys) // 2  # a column in chunks (as DuckDB returns one) hashes chunk by chunk, to the same
    chunks = [pa.array(keys[:half], arrow_type), pa.array([], arrow_type), pa.array(keys[half:], arrow_type)]
    chunked = key_hashes(pa.chunked_array(chunks, arrow_type))
    assert (np.asarray(pmap.owner)[(chunked % np.uint64(1024)).astype(np.int64)]).tolist() == expected.tolist()
    sole = pmap.sole_owner(pa.array(keys, arrow_type))
    assert sole == (int(expected[0]) if len(set(expected.tolist())) == 1 else None)
    assert pmap.sole_owner(pa.array(keys * (SMALL + 1), arrow_type)) == sole  # the vectorised path
    present = [k for k in keys if k is not None]
    if present and kind in ("int64", "string"):
        assert pmap.owners_of(present).tolist() == expected[[k is not None for k in keys]].tolist()
    nested = pa.table({"k": pa.array([keys], pa.list_(arrow_type)), "j": pa.array(keys[:1], arrow_type)})
    want = sorted({int(o) for k, o in zip(keys, expected, strict=True) if k is not None})
    assert pmap.partitions_of(nested, ["k", "j"]) == want
    assert pmap.partitions_of(pa.concat_tables([nested] * (SMALL + 1)), ["k", "j"]) == want


def table_rows(client: Client, table: str, partitions: int) -> list[int]:
    counters = client.status()["counters"]
    return [int(counters.get(f"partition{p}.rows.{table}", 0)) for p in range(partitions)]


@pytest.fixture(scope="module", params=[2, 4], ids=["P2", "P4"])
def cluster(request, tmp_path_factory):
    with EmbeddedServer(tmp_path_factory.mktemp("parts"), partitions=request.param) as srv:
        yield srv, request.param


@pytest.fixture
def bank(cluster):
    """The accounts app, freshly deployed (previous test's objects dropped)."""
    srv, partitions = cluster
    with Client(srv.target) as c:
        status = c.status()
        drops = [
            f"DROP {kind.upper()} {name};"
            for kind in ("procedure", "stream", "table")
            for name in status.get(kind + "s", [])
        ]
        if drops:
            c.deploy("\n".join(drops))
        c.deploy(ACCOUNTS)
        c.call("set_fee", kind="deposit", fee=0)
        yield c, partitions


def test_keyed_batches_run_on_the_partition_owning_their_keys(bank):
    c, partitions = bank
    accounts = [k for p in range(partitions) for k in keys_on(partitions, p, 5, start=100 * p + 1)]
    for account in accounts:
        assert c.push("deposits", deposits([(account, 10)])).result().ok
    expected = [0] * partitions
    for p in owners(partitions, accounts):
        expected[p] += 1
    assert table_rows(c, "balances", partitions) == expected
    assert c.query("SELECT count(*), sum(balance) FROM balances").fetchall() == [(len(accounts), 10 * len(accounts))]
    # audit is a single table: every row on the home partition
    assert table_rows(c, "audit", partitions) == [len(accounts)] + [0] * (partitions - 1)


def test_a_batch_spanning_partitions_commits_on_all_or_none(bank):
    c, partitions = bank
    a, b = keys_on(partitions, 0, 1)[0], keys_on(partitions, 1, 1)[0]
    assert c.push("deposits", deposits([(a, 5), (b, 7)])).result().ok
    # b would go negative on partition 1: the CHECK aborts the TE there, and partition 0's part is undone too
    bad = c.push("deposits", deposits([(a, 100), (b, -50)])).result()
    assert bad.outcome == "rejected" and "balance" in bad.reason
    assert c.query("SELECT account, balance FROM balances ORDER BY 1").fetchall() == sorted([(a, 5), (b, 7)])
    assert c.query("SELECT count(*) FROM audit").fetchall() == [(2,)]


def test_replicated_table_written_everywhere_read_by_every_partition(bank):
    c, partitions = bank
    c.call("set_fee", kind="deposit", fee=1)
    accounts = [keys_on(partitions, p, 1)[0] for p in range(partitions)]
    assert c.push("deposits", deposits([(k, 10) for k in accounts])).result().ok
    assert c.query("SELECT DISTINCT balance FROM balances").fetchall() == [(9,)]
    assert table_rows(c, "fees", partitions) == [1] * partitions


def test_scatter_gather_queries_aggregate_across_partitions(bank):
    c, partitions = bank
    rows = [(k, (k * 37) % 101) for k in range(1, 200)]
    for i in range(0, len(rows), 25):
        assert c.push("deposits", deposits(rows[i : i + 25])).result().ok
    assert min(table_rows(c, "balances", partitions)) > 0
    oracle = duckdb.connect()
    oracle.register("balances", pa.table({"account": [k for k, _ in rows], "balance": [m for _, m in rows]}))
    oracle.register("audit", pa.table({"account": [k for k, _ in rows], "amount": [m for _, m in rows]}))
    queries = [
        "SELECT count(*), sum(balance), avg(balance) FROM balances",
        "SELECT account, balance FROM balances ORDER BY balance DESC, account LIMIT 7",
        "SELECT balance % 3 AS g, count(*), min(balance), max(balance) FROM balances GROUP BY g ORDER BY g",
        "SELECT count(*) FROM balances b JOIN audit a ON a.account = b.account WHERE b.balance > 50",
        "WITH big AS (SELECT * FROM balances WHERE balance > 90) SELECT count(*) FROM big",
    ]
    for sql in queries:
        assert c.query(sql).fetchall() == oracle.execute(sql).fetchall(), sql


def test_exchange_to_a_single_procedure_keeps_batch_order_and_exactly_once(bank):
    c, partitions = bank
    batches = []
    for i in range(12):
        keys = keys_on(partitions, i % partitions, 2, start=1000 * i + 1) + keys_on(
            partitions, (i + 1) % partitions, 1, start=1000 * i + 1
        )
        batches.append(deposits([(k, i + 1) for k in keys]))
    results = [f.result() for f in [c.push("deposits", b) for b in batches]]
    assert all(r.ok for r in results)
    audit = c.query("SELECT b, count(*), min(amount), max(amount) FROM audit GROUP BY b ORDER BY b").fetchall()
    assert [n for _, n, _, _ in audit] == [3] * 12
    assert [lo for _, _, lo, _ in audit] == list(range(1, 13))  # batch order: the i-th batch deposits i+1


def test_keyed_call_runs_on_the_owner_of_its_parameter(bank):
    c, partitions = bank
    for p in range(partitions):
        c.call("open_account", account=keys_on(partitions, p, 1, start=5000)[0])
    assert table_rows(c, "balances", partitions) == [1] * partitions


def test_resent_coordinated_batch_is_a_duplicate_with_its_original_outcome(bank):
    c, partitions = bank
    a, b = keys_on(partitions, 0, 1)[0], keys_on(partitions, 1, 1)[0]
    with Client(c.target, producer_id="resender") as p:
        ok = p.push("deposits", deposits([(a, 1), (b, 1)]), batch_id=1).result()
        bad = p.push("deposits", deposits([(a, 1), (b, -9)]), batch_id=2).result()
        assert ok.outcome == "committed" and bad.outcome == "rejected"
        again_ok = p.push("deposits", deposits([(a, 1), (b, 1)]), batch_id=1).result()
        again_bad = p.push("deposits", deposits([(a, 1), (b, -9)]), batch_id=2).result()
    assert again_ok.outcome == "duplicate" and again_bad.outcome == "duplicate"
    assert again_bad.original == "rejected" and "balance" in again_bad.reason
    assert c.query("SELECT sum(balance) FROM balances").fetchall() == [(2,)]


def resend_everything(target: str, a: int, b: int) -> dict[str, Any]:
    """Batches 1-3 of one producer first went to `a`'s partition (committed, aborted, bad rows);
    re-sent with rows on `b`'s partition, each must be a DUPLICATE with its original outcome."""
    with Client(target, producer_id="rerouter") as p:
        first = [
            p.push("deposits", deposits([(a, 5)]), batch_id=1).result(),
            p.push("deposits", deposits([(a, -9)]), batch_id=2).result(),  # the balance CHECK aborts it
            p.push("deposits", {"account": [a], "amount": ["five"]}, batch_id=3).result(),  # refused at decode
        ]
        again = [p.push("deposits", deposits([(b, 7)]), batch_id=i).result() for i in (1, 2, 3)]
    return {"first": first, "again": again}


def check_resends(first: list[Any], again: list[Any]) -> None:
    assert [x.outcome for x in first] == ["committed", "rejected", "rejected"], first
    assert [x.outcome for x in again] == ["duplicate"] * 3, again
    assert [x.original for x in again] == ["committed", "rejected", "rejected"]
    assert [x.reason for x in again[1:]] == [x.reason for x in first[1:]] and "balance" in again[1].reason
    assert [x.timestamp for x in again] == [x.timestamp for x in first]  # each the original's, committed too


def test_a_resent_batch_whose_rows_route_to_another_partition_is_a_duplicate(bank):
    c, partitions = bank
    a, b = keys_on(partitions, 0, 1)[0], keys_on(partitions, 1, 1)[0]
    check_resends(**resend_everything(c.target, a, b))
    assert c.query("SELECT account, balance FROM balances ORDER BY 1").fetchall() == [(a, 5)]


def test_a_resend_after_a_restart_is_still_a_duplicate_wherever_it_routes(tmp_path):
    a, b = keys_on(2, 0, 1)[0], keys_on(2, 1, 1)[0]
    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target) as c:
        c.deploy(ACCOUNTS)
        c.call("set_fee", kind="deposit", fee=0)
        first = resend_everything(srv.target, a, b)["first"]
        with Client(srv.target, producer_id="latest") as p:
            latest = p.push("deposits", deposits([(b, 1)]), batch_id=1).result()
    with EmbeddedServer(tmp_path / "data", partitions=2) as srv, Client(srv.target) as c:
        with Client(srv.target, producer_id="rerouter") as p:
            again = [p.push("deposits", deposits([(b, 7)]), batch_id=i).result() for i in (1, 2, 3)]
        with Client(srv.target, producer_id="latest") as p:
            latest_again = p.push("deposits", deposits([(a, 1)]), batch_id=1).result()
        check_resends(first, again)
        assert latest_again.outcome == "duplicate" and latest_again.original == "committed"
        assert latest_again.timestamp == latest.timestamp  # a producer's latest batch keeps its timestamp
        assert c.query("SELECT account, balance FROM balances ORDER BY 1").fetchall() == sorted([(a, 5), (b, 1)])


def test_deploy_refuses_partitioned_code_on_single_or_written_replicated_tables(bank):
    c, _ = bank
    with pytest.raises(InvalidArgument, match="lives on one partition; declare 'audit' REPLICATED"):
        c.deploy(
            "CREATE STREAM s2 (account BIGINT) PARTITION BY (account);"
            "CREATE PROCEDURE p2 ON STREAM s2 AS BEGIN INSERT INTO audit SELECT account, 0, 0 FROM s2; END;"
        )
    with pytest.raises(InvalidArgument, match="writes replicated table 'fees'"):
        c.deploy(
            "CREATE STREAM s3 (account BIGINT) PARTITION BY (account);"
            "CREATE PROCEDURE p3 ON STREAM s3 AS BEGIN INSERT OR REPLACE INTO fees SELECT 'x', 1 FROM s3; END;"
        )


def test_deploy_refuses_a_statement_on_every_partition_that_reads_a_single_table(bank):
    """Elsewhere than partition 0 it would read `audit` empty and close another account: a decision taken once
    must reach the partitions as data (the voter's deletion at P = 2 went wrong this way)."""
    c, _ = bank
    before = c.status()["procedures"]
    with pytest.raises(InvalidArgument) as e:
        c.deploy(
            "CREATE PROCEDURE close_busiest () AS BEGIN"
            "    DELETE FROM balances WHERE account = (SELECT account FROM audit ORDER BY amount DESC LIMIT 1);"
            "END;"
        )
    message = str(e.value)
    assert "statement 1 of procedure 'close_busiest' runs on every partition (it touches balances)" in message
    assert "reads table 'audit', which only the home partition holds" in message
    assert "declare 'audit' REPLICATED" in message
    assert c.status()["procedures"] == before


def test_a_keyed_procedure_may_not_emit_keys_of_another_partition_locally(cluster):
    srv, partitions = cluster
    with Client(srv.target) as c:
        c.deploy(
            "CREATE TABLE hops (k BIGINT) PARTITION BY (k);"
            "CREATE STREAM hop_in (k BIGINT) PARTITION BY (k);"
            "CREATE STREAM hop_out (k BIGINT) PARTITION BY (k);"
            "CREATE PROCEDURE hop ON STREAM hop_in AS BEGIN INSERT INTO hop_out SELECT k + 1 FROM hop_in; END;"
            "CREATE PROCEDURE land ON STREAM hop_out AS BEGIN INSERT INTO hops SELECT k FROM hop_out; END;"
        )
        k = next(k for k in range(1, 1000) if owners(partitions, [k])[0] != owners(partitions, [k + 1])[0])
        r = c.push("hop_in", pa.table({"k": pa.array([k], pa.int64())})).result()
        assert r.outcome == "rejected" and "belongs to partition" in r.reason
        c.deploy("DROP PROCEDURE land; DROP PROCEDURE hop; DROP STREAM hop_out; DROP STREAM hop_in; DROP TABLE hops;")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(
        st.lists(st.tuples(st.integers(1, 40), st.integers(-30, 60)), min_size=1, max_size=6),
        min_size=1,
        max_size=14,
    )
)
def test_random_deposits_match_a_sequential_reference(bank, batches):
    c, _ = bank
    balances: dict[int, int] = dict(c.query("SELECT account, balance FROM balances").fetchall())
    audit = c.query("SELECT count(*) FROM audit").fetchall()[0][0]
    outcomes = []
    for batch in batches:
        trial = dict(balances)
        for account, amount in batch:
            trial[account] = trial.get(account, 0) + amount
        ok = all(v >= 0 for v in trial.values())
        outcomes.append("committed" if ok else "rejected")
        if ok:
            balances = trial
            audit += len(batch)
    results = [f.result() for f in [c.push("deposits", deposits(b)) for b in batches]]
    assert [r.outcome for r in results] == outcomes
    assert dict(c.query("SELECT account, balance FROM balances").fetchall()) == balances
    assert c.query("SELECT count(*) FROM audit").fetchall()[0][0] == audit
