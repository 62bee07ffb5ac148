"""Tuples (server/tuples.py) stand for the Arrow table they would be: same rows, same tables, same order."""

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtx.server.ipc import join_grouped, split_grouped
from streamtx.server.partition.state import RowShape, table_rows
from streamtx.server.tuples import Tuples, arrow, concat

VOTES = RowShape.of(pa.schema([("vote_id", pa.int64()), ("state", pa.string()), ("n", pa.int32())]))
DELETIONS = RowShape.of(pa.schema([("contestant", pa.int32()), ("removed", pa.int64())]))
assert VOTES is not None and DELETIONS is not None

vote = st.tuples(st.integers(-(2**63), 2**63 - 1), st.one_of(st.none(), st.text(max_size=3)), st.integers(-5, 5))
deletion = st.tuples(st.integers(0, 30), st.one_of(st.none(), st.integers(0, 10**12)))


@st.composite
def parts(draw: st.DrawFn) -> list:
    """A mix of Tuples of two shapes and plain tables, some Tuples already converted."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["votes", "deletions", "table"]))
        if kind == "table":
            out.append(VOTES.table(draw(st.lists(vote, max_size=3))))
            continue
        shape, row = (VOTES, vote) if kind == "votes" else (DELETIONS, deletion)
        t = Tuples(shape, draw(st.lists(row, max_size=3)))
        if draw(st.booleans()):
            t.table()
        out.append(t)
    return out


def expected(part) -> pa.Table:
    return part.shape.table(part.values) if isinstance(part, Tuples) else part


@settings(deadline=None)
@given(parts())
def test_the_log_gets_back_the_tables_it_would_have_written(ps: list) -> None:
    streams = ["d" if isinstance(p, Tuples) and p.shape is DELETIONS else "v" for p in ps]
    order, runs, joined = join_grouped(ps, streams)
    back = split_grouped(order, runs, joined)
    assert len(back) == len(ps)
    for b, p in zip(back, ps, strict=True):
        assert b.equals(expected(p))
        assert table_rows(b) == (p.rows() if isinstance(p, Tuples) else table_rows(p))


@settings(deadline=None)
@given(st.lists(st.lists(vote, max_size=3), min_size=1, max_size=5), st.booleans())
def test_concat_keeps_order_and_stays_tuples_when_it_can(groups: list, with_table: bool) -> None:
    ps: list = [Tuples(VOTES, g) for g in groups]
    if with_table:
        ps.append(VOTES.table([(1, "x", 2)]))
    joined = concat(ps)
    want = pa.concat_tables([expected(p) for p in ps])
    assert isinstance(joined, Tuples) == (not with_table or len(ps) == 1)
    assert arrow(joined).equals(want)
    assert joined.num_rows == want.num_rows
    if isinstance(joined, Tuples):
        assert [joined.slice(i, 1).rows()[0] for i in range(joined.num_rows)] == want.to_pylist()
