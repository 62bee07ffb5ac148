"""The accounts application partitioned by account, and keys chosen by the partition that owns them."""

from __future__ import annotations

import pyarrow as pa

from streamtx.server.partitioning import PartitionMap

ACCOUNTS = """
CREATE TABLE fees (kind VARCHAR PRIMARY KEY, fee BIGINT NOT NULL) REPLICATED;
CREATE TABLE balances (account BIGINT PRIMARY KEY, balance BIGINT NOT NULL CHECK (balance >= 0))
    PARTITION BY (account);
CREATE TABLE audit (account BIGINT, amount BIGINT, b BIGINT);
CREATE STREAM deposits (account BIGINT, amount BIGINT) PARTITION BY (account);
CREATE STREAM applied (account BIGINT, amount BIGINT);
CREATE PROCEDURE set_fee (kind VARCHAR, fee BIGINT) AS BEGIN
    INSERT OR REPLACE INTO fees VALUES ($kind, $fee);
END;
CREATE PROCEDURE deposit ON STREAM deposits AS BEGIN
    INSERT INTO balances
        SELECT account, sum(amount) - (SELECT fee FROM fees WHERE kind = 'deposit') * count(*)
        FROM deposits GROUP BY account
        ON CONFLICT DO UPDATE SET balance = balances.balance + excluded.balance;
    INSERT INTO applied SELECT account, amount FROM deposits;
END;
CREATE PROCEDURE record ON STREAM applied AS BEGIN
    INSERT INTO audit SELECT account, amount, $batch_id FROM applied;
END;
CREATE PROCEDURE open_account (account BIGINT) PARTITION ON account AS BEGIN
    INSERT INTO balances VALUES ($account, 0);
END;
"""


def owners(partitions: int, keys: list[int]) -> list[int]:
    return PartitionMap.round_robin(partitions, 1024).owners(pa.array(keys, pa.int64())).tolist()


def keys_on(partitions: int, partition: int, n: int, start: int = 1) -> list[int]:
    """`n` account numbers owned by `partition`."""
    out, k = [], start
    while len(out) < n:
        if owners(partitions, [k])[0] == partition:
            out.append(k)
        k += 1
    return out


def deposits(rows: list[tuple[int, int]]) -> pa.Table:
    return pa.table({"account": [a for a, _ in rows], "amount": [m for _, m in rows]}, schema=DEPOSIT_SCHEMA)


DEPOSIT_SCHEMA = pa.schema([("account", pa.int64()), ("amount", pa.int64())])


ACCOUNTS_ON = {0: keys_on(2, 0, 4), 1: keys_on(2, 1, 4)}  # four accounts on each partition of two

HITS = """
CREATE STREAM hits (account BIGINT, n BIGINT) PARTITION BY (account);
CREATE TABLE hit_counts (account BIGINT PRIMARY KEY, n BIGINT NOT NULL) PARTITION BY (account);
CREATE PROCEDURE hit ON STREAM hits AS BEGIN
    INSERT INTO hit_counts SELECT account, sum(n) FROM hits GROUP BY account
        ON CONFLICT DO UPDATE SET n = hit_counts.n + excluded.n;
END;
"""
"""Batches that stay on one partition: many are in flight to a worker when it is killed."""
