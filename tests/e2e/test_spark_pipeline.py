"""The example pipeline: raw vote files (some malformed) -> Spark -> the voter, exactly once.

The final voter tables equal the sequential reference fed the well-formed
votes, one atomic batch per file; a second run over the same checkpoint
(nothing new) changes nothing, and new files are picked up after it.
"""

from __future__ import annotations

import io
import json

import pytest
from support.spark import make_spark

from streamtx.client import Client
from streamtx.procedures.voter.reference import SERVER_QUERIES, VoterReference
from streamtx.procedures.voter.spark_pipeline import ensure_voter, run, write_raw_files
from streamtx.server.embedded import EmbeddedServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def parse(line: str) -> tuple[int, int, int] | None:
    """What the job's cleaning keeps of one raw line (written independently of Spark)."""
    try:
        r = json.loads(line)
        vote = (
            int(str(r["vote_id"]).strip()),
            int(str(r["phone_number"]).strip()),
            int(str(r["contestant_number"]).strip()),
        )
    except (ValueError, KeyError, TypeError):
        return None
    return vote if 10**9 <= vote[1] < 10**10 and vote[2] > 0 else None


def test_pipeline_matches_reference(tmp_path):
    spark = make_spark(tmp_path / "local")
    raw, ckpt = tmp_path / "raw", tmp_path / "ckpt"
    try:
        with EmbeddedServer(tmp_path / "data") as srv:
            assert ensure_voter(srv.target) is True
            assert ensure_voter(srv.target) is False
            bad = write_raw_files(raw, 1500, 3, seed=3)
            assert bad > 0
            out = io.StringIO()
            assert run(spark, srv.target, raw, ckpt, once=True, out=out) == 3
            assert "final: accepted votes" in out.getvalue() and "top: 1. #" in out.getvalue()
            assert run(spark, srv.target, raw, ckpt, once=True, out=io.StringIO()) == 0
            write_raw_files(raw, 500, 1, seed=4, first_file=3)
            assert run(spark, srv.target, raw, ckpt, once=True, out=io.StringIO()) == 1

            ref = VoterReference()
            kept = 0
            for f in sorted(raw.glob("votes-*.json")):
                votes = sorted(v for v in map(parse, f.read_text().splitlines()) if v is not None)
                kept += len(votes)
                ref.process_batch(votes)
            assert kept == 2000 - bad - sum(
                1 for ln in (raw / "votes-00003.json").read_text().splitlines() if not parse(ln)
            )
            expected = ref.tables()
            with Client(srv.target) as c:
                for name, sql in SERVER_QUERIES.items():
                    assert c.query(sql).fetchall() == expected[name], name
    finally:
        spark.stop()
