"""Random values of every SQL type a push carries, through protobuf `Rows` and Arrow, at 1 and 2 partitions.

Each type's values are drawn from its whole domain and its edges, in each form
the contract (docs/protocol.md, "Rows") reads for the type: the Python value
the client encodes as a `Value` (Rows) or as the Arrow type pyarrow infers
(Arrow), text, numbers of other kinds, and the exact Arrow type. Every value is
its own batch (pipelined, so several share a message), and all of them once
more as one batch. A batch is either COMMITTED, and each value reads back
(Query in ARROW) as exactly what the form's rule says it is, or REJECTED with
INVALID_ARGUMENT naming column 'v' and the row; both paths give the same
outcome. Read in ROWS format, each stored value comes in the documented
`Value` kind, and pushed back through Rows it is stored identically.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import math
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtx import wire
from streamtx.client import Client
from streamtx.errors import InvalidArgument
from streamtx.server.embedded import EmbeddedServer
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.v1 import streamtx_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(600)

REJECT = "REJECT"
"""What a value must be refused as."""


@dataclass(frozen=True)
class Maybe:
    """A value the contract lets the server refuse, or store as exactly this."""

    value: Any


@dataclass(frozen=True)
class Form:
    """Values of one kind for a column, and what each must be stored as (canonical, `REJECT` or `Maybe`)."""

    name: str
    values: st.SearchStrategy
    expect: Callable[[Any], Any]
    arrow_type: pa.DataType | None = None  # None: what pyarrow infers from the Python values
    arrow_expect: Callable[[Any], Any] | None = None  # where the contract reads the Arrow form otherwise
    agree: bool = True  # whether the contract reads the value the same way through Rows and Arrow


@dataclass(frozen=True)
class Kind:
    sql: str
    forms: tuple[Form, ...]
    rows_kind: Callable[[Any], str | None]  # the ROWS `Value` kind of a stored (canonical) value


I64 = (-(2**63), 2**63 - 1)
EPOCH = dt.datetime(1970, 1, 1)
UTC = dt.UTC
PY_DAYS = ((dt.date.min - EPOCH.date()).days, (dt.date.max - EPOCH.date()).days)
PY_MICROS = (
    (dt.datetime.min - EPOCH) // dt.timedelta(microseconds=1),
    (dt.datetime.max - EPOCH) // dt.timedelta(microseconds=1),
)
DAY_US = 86_400_000_000
D = decimal.Context(prec=200)


def nullable(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), values, values, values, values)


def none_or(rule: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda x: None if x is None else rule(x)


def int64_kind(v: Any) -> str | None:
    if v is None:
        return None
    return "int_value" if I64[0] <= v <= I64[1] else "string_value"


def fixed(kind: str) -> Callable[[Any], str | None]:
    return lambda v: None if v is None else kind


# -- numbers -----------------------------------------------------------------------------------


def whole(f: float, lo: int, hi: int) -> Any:
    return int(f) if math.isfinite(f) and f == int(f) and lo <= int(f) <= hi else REJECT


FLOATS = st.one_of(
    st.floats(),
    st.floats(-1e6, 1e6).map(lambda f: round(f, 2)),
    st.sampled_from([0.0, -0.0, 0.5, 1.5, -1.0, math.nan, math.inf, -math.inf, 2.0**63, -(2.0**63), 1e300, 5e-324]),
)


def integer(arrow: pa.DataType, lo: int, hi: int, pushable: tuple[int, int] | None = None) -> Kind:
    """An integer type of range [lo, hi], of which a push carries `pushable` (HUGEINT: what DECIMAL(38,0) holds)."""
    plo, phi = pushable or (lo, hi)
    edges = st.sampled_from([lo, hi, lo - 1, hi + 1, 0, -1, plo, phi, plo - 1, phi + 1])
    ints = st.one_of(st.integers(lo, hi), edges, st.integers(-(2**130), 2**130))
    in_range = none_or(lambda v: v if plo <= v <= phi else REJECT)

    def from_double(f: float) -> Any:  # HUGEINT travels as DECIMAL(38,0): a double is read as its shortest form
        return fits(decimal.Decimal(repr(f)), 38, 0) if math.isfinite(f) else REJECT

    exact = arrow if plo == lo else pa.decimal128(38, 0)
    return Kind(
        str(wire.sql_name(arrow)) if plo == lo else "HUGEINT",
        (
            Form("int", nullable(ints.filter(lambda v: I64[0] <= v <= I64[1])), in_range),
            Form("double", nullable(FLOATS), none_or(lambda f: whole(f, plo, phi) if plo == lo else from_double(f))),
            Form("text", nullable(ints.map(str)), none_or(lambda s: in_range(int(s)))),
            Form("exact", nullable(st.integers(plo, phi)), in_range, arrow_type=exact),
            Form("bool", nullable(st.booleans()), none_or(lambda b: REJECT)),
        ),
        int64_kind,
    )


def real32(f: float) -> Any:
    """A double rounded to single precision; one that rounds to an infinity is refused."""
    single = struct.unpack("f", struct.pack("f", f))[0]
    return REJECT if math.isinf(single) and not math.isinf(f) else single


def floating(single: bool) -> Kind:
    rounded = real32 if single else (lambda f: f)
    limit = 2**24 if single else 2**53
    singles = st.floats(width=32)
    ints = st.one_of(st.integers(-(limit + 2), limit + 2), st.integers(*I64))

    def from_int(v: int) -> Any:
        if abs(v) <= limit:
            return float(v)
        return Maybe(float(v)) if rounded(float(v)) == v else REJECT

    return Kind(
        "REAL" if single else "DOUBLE",
        (
            Form(
                "double",
                nullable(st.one_of(FLOATS, singles, st.sampled_from([3.4028235e38, 3.4028236e38]))),
                none_or(rounded),
            ),
            Form("int", nullable(ints), none_or(from_int)),
            Form("text", nullable(st.one_of(singles if single else FLOATS).map(repr)), none_or(lambda s: float(s))),
            Form(
                "junk", nullable(st.sampled_from(["", "1,5", "one", "0x10", "1.5.1", "--1"])), none_or(lambda s: REJECT)
            ),
            Form(
                "exact",
                nullable(singles if single else FLOATS),
                none_or(rounded),
                arrow_type=pa.float32() if single else pa.float64(),
            ),
            Form("bool", nullable(st.booleans()), none_or(lambda b: REJECT)),
        ),
        fixed("double_value"),
    )


def fits(d: decimal.Decimal, p: int, s: int) -> Any:
    """`d` at scale `s` if that is exact and it has at most `p` digits."""
    if not d.is_finite() or d and d.adjusted() >= p - s:
        return REJECT
    q = d.quantize(decimal.Decimal(1).scaleb(-s), context=D)
    return q if q == d and q.copy_abs() < decimal.Decimal(10) ** (p - s) else REJECT


def decimal_kind(p: int, s: int) -> Kind:
    ulp = decimal.Decimal(1).scaleb(-s, D)
    top = decimal.Decimal(10**p - 1).scaleb(-s, D)
    decimals = st.one_of(
        st.builds(
            lambda n, e: decimal.Decimal(n).scaleb(e, D),
            st.integers(-(10 ** (p + 2)), 10 ** (p + 2)),
            st.integers(-s - 2, 2),
        ),
        st.sampled_from([top, D.minus(top), D.add(top, ulp), D.minus(D.add(top, ulp)), ulp, D.divide(ulp, 10)]),
        st.sampled_from([decimal.Decimal(0), decimal.Decimal("-0")]),
        st.integers(-(2**130), 2**130).map(decimal.Decimal),
    )
    in_range = st.integers(-(10**p) + 1, 10**p - 1).map(lambda n: decimal.Decimal(n).scaleb(-s, D))

    def from_double(f: float) -> Any:
        return fits(decimal.Decimal(repr(f)), p, s) if math.isfinite(f) else REJECT

    return Kind(
        f"DECIMAL({p},{s})",
        (
            Form("decimal", nullable(decimals), none_or(lambda d: fits(d, p, s))),
            Form(
                "text",
                nullable(decimals.map(lambda d: format(d, "f"))),
                none_or(lambda t: fits(decimal.Decimal(t), p, s)),
            ),
            Form("text_e", nullable(decimals.map(str)), none_or(lambda t: fits(decimal.Decimal(t), p, s))),
            Form("int", nullable(st.integers(*I64)), none_or(lambda v: fits(decimal.Decimal(v), p, s))),
            Form("double", nullable(FLOATS), none_or(from_double)),
            Form("exact", nullable(in_range), none_or(lambda d: d), arrow_type=pa.decimal128(p, s)),
        ),
        (lambda v: None if v is None else "int_value" if I64[0] <= v <= I64[1] else "string_value")
        if s == 0
        else fixed("string_value"),
    )


# -- text and bytes ----------------------------------------------------------------------------

TEXT = st.one_of(
    st.text(),
    st.text(min_size=2000, max_size=3000),
    st.sampled_from(["", "\x00", "a\x00b", "\U0010ffff", "é", "\u200b", " ", "NULL", "'", "\\x00"]),
)


def utf8(b: bytes) -> Any:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return REJECT


VARCHAR = Kind(
    "VARCHAR",
    (
        Form("text", nullable(TEXT), none_or(lambda s: s)),
        Form("large", nullable(TEXT), none_or(lambda s: s), arrow_type=pa.large_string()),
        Form("bytes", nullable(st.one_of(TEXT.map(str.encode), st.binary())), none_or(utf8)),
        Form("int", nullable(st.integers(*I64)), none_or(lambda v: REJECT)),
        Form("double", nullable(FLOATS), none_or(lambda v: REJECT)),
        Form("bool", nullable(st.booleans()), none_or(lambda v: REJECT)),
    ),
    fixed("string_value"),
)

BYTES = st.one_of(st.binary(), st.binary(min_size=2000, max_size=3000), st.sampled_from([b"", b"\x00", b"\xff\xfe"]))
BLOB = Kind(
    "BLOB",
    (
        Form("bytes", nullable(BYTES), none_or(lambda b: b)),
        Form("large", nullable(BYTES), none_or(lambda b: b), arrow_type=pa.large_binary()),
        Form("text", nullable(TEXT), none_or(str.encode)),
        Form("int", nullable(st.integers(*I64)), none_or(lambda v: REJECT)),
    ),
    fixed("bytes_value"),
)

BOOLEAN = Kind(
    "BOOLEAN",
    (
        Form("bool", nullable(st.booleans()), none_or(lambda b: b)),
        Form(
            "text",
            nullable(st.sampled_from(["true", "false", "TRUE", "False"])),
            none_or(lambda s: s.lower() == "true"),
        ),
        Form("junk", nullable(st.sampled_from(["", "yes", "t", "2", "truth", " true"])), none_or(lambda s: REJECT)),
        Form("int", nullable(st.integers(-2, 2)), none_or(lambda v: REJECT)),
        Form("double", nullable(FLOATS), none_or(lambda v: REJECT)),
    ),
    fixed("bool_value"),
)


# -- time --------------------------------------------------------------------------------------


def days(d: dt.date) -> int:
    return (d - EPOCH.date()).days


def micros(t: dt.datetime) -> int:
    if t.tzinfo is not None:
        t = t.astimezone(UTC).replace(tzinfo=None)
    return (t - EPOCH) // dt.timedelta(microseconds=1)


def in_python(lo_hi: tuple[int, int]) -> Callable[[Any], str | None]:
    """ISO-8601 text within Python's years 1 to 9999; beyond them, the number (days or microseconds)."""
    return lambda v: None if v is None else "string_value" if lo_hi[0] <= v <= lo_hi[1] else "int_value"


DATES = st.one_of(st.dates(), st.sampled_from([dt.date.min, dt.date.max, dt.date(1970, 1, 1), dt.date(2000, 2, 29)]))
INT32 = (-(2**31), 2**31 - 1)
BAD_DATES = ["", "2024-02-30", "2024-13-01", "yesterday", "10000-01-01", "2024-01-02 03:04:05+02:00"]
DATE = Kind(
    "DATE",
    (
        Form("date", nullable(DATES), none_or(days)),
        Form("text", nullable(DATES.map(dt.date.isoformat)), none_or(lambda s: days(dt.date.fromisoformat(s)))),
        Form("junk", nullable(st.sampled_from(BAD_DATES)), none_or(lambda s: REJECT)),
        # an int is a number of days; an Arrow date is an int32 (an int64 is refused, as documented)
        Form(
            "int",
            nullable(st.one_of(st.integers(*INT32), st.integers(*I64))),
            none_or(lambda v: v if INT32[0] <= v <= INT32[1] else REJECT),
            arrow_expect=none_or(lambda v: REJECT),
        ),
        Form("exact", nullable(st.integers(*INT32)), none_or(lambda v: v), arrow_type=pa.date32()),
        Form(
            "datetime",
            nullable(st.datetimes()),
            none_or(lambda t: Maybe(days(t.date())) if t.time() == dt.time() else REJECT),
            agree=False,
        ),
    ),
    in_python(PY_DAYS),
)

DATETIMES = st.one_of(
    st.datetimes(),
    st.sampled_from([dt.datetime.min, dt.datetime.max, EPOCH, dt.datetime(2024, 1, 2, 3, 4, 5, 123456)]),
)
ZONES = st.integers(-23 * 60, 23 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
ZONED = st.datetimes(dt.datetime(2, 1, 1), dt.datetime(9998, 12, 31), timezones=ZONES)
BAD_TIMESTAMPS = ["", "2024-01-02 25:00:00", "now", "2024/01/02"]


def timestamp_kind(unit: str) -> Kind:
    """TIMESTAMP in microseconds or nanoseconds: a datetime, ISO-8601 text, an int or whole double of the unit."""
    per_us = 1000 if unit == "ns" else 1
    per_s = 1_000_000 * per_us
    finer = "2024-01-02 03:04:05." + "1" * (10 if unit == "ns" else 7)  # a digit beyond the unit
    arrow = pa.timestamp(unit)

    def of(t: dt.datetime) -> Any:
        v = micros(t) * per_us
        return v if I64[0] <= v <= I64[1] else REJECT

    return Kind(
        "TIMESTAMP_NS" if unit == "ns" else "TIMESTAMP",
        (
            Form("datetime", nullable(DATETIMES), none_or(of)),
            Form(
                "text",
                nullable(DATETIMES.map(lambda t: t.isoformat(sep=" "))),
                none_or(lambda s: of(dt.datetime.fromisoformat(s))),
            ),
            Form(
                "text_t",
                nullable(DATETIMES.map(dt.datetime.isoformat)),
                none_or(lambda s: of(dt.datetime.fromisoformat(s))),
            ),
            Form("date", nullable(DATES), none_or(lambda d: of(dt.datetime.combine(d, dt.time())))),
            Form("junk", nullable(st.sampled_from([*BAD_TIMESTAMPS, finer])), none_or(lambda s: REJECT)),
            Form("int", nullable(st.one_of(st.integers(*I64), st.sampled_from([*I64, 0, -1]))), none_or(lambda v: v)),
            Form("double", nullable(FLOATS), none_or(lambda f: whole(f, *I64))),
            Form("exact", nullable(st.integers(*I64)), none_or(lambda v: v), arrow_type=arrow),
            Form("zoned", nullable(ZONED), none_or(lambda t: REJECT)),
        ),
        # ISO-8601 text within Python's years and where whole seconds fit in int64 (Arrow reads it so)
        in_python((max(PY_MICROS[0] * per_us, -(2**63 // per_s) * per_s), min(PY_MICROS[1] * per_us, I64[1]))),
    )


TIMESTAMPTZ = Kind(
    "TIMESTAMPTZ",
    (
        Form("zoned", nullable(ZONED), none_or(micros)),
        Form(
            "text",
            nullable(ZONED.map(lambda t: t.isoformat(sep=" "))),
            none_or(lambda s: micros(dt.datetime.fromisoformat(s))),
        ),
        Form("int", nullable(st.integers(*I64)), none_or(lambda v: v)),
        Form("exact", nullable(st.integers(*I64)), none_or(lambda v: v), arrow_type=pa.timestamp("us", tz="UTC")),
        Form("local", nullable(st.datetimes()), none_or(lambda t: REJECT)),
        Form("local_text", nullable(st.datetimes().map(lambda t: t.isoformat(sep=" "))), none_or(lambda t: REJECT)),
    ),
    in_python(PY_MICROS),
)


def time_of(t: dt.time) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


TIMES = st.one_of(st.times(), st.sampled_from([dt.time.min, dt.time.max, dt.time(12, 0, 0, 1)]))
TIME = Kind(
    "TIME",
    (
        Form("time", nullable(TIMES), none_or(time_of)),
        Form("text", nullable(TIMES.map(dt.time.isoformat)), none_or(lambda s: time_of(dt.time.fromisoformat(s)))),
        Form("midnight", nullable(st.just("24:00:00")), none_or(lambda s: DAY_US)),
        Form(
            "junk",
            nullable(st.sampled_from(["", "25:00:00", "03:04:60", "24:00:01", "noon", "03:04:05+02:00"])),
            none_or(lambda s: REJECT),
        ),
        Form(
            "int",
            nullable(st.one_of(st.integers(-2, DAY_US + 2), st.integers(*I64))),
            none_or(lambda v: v if 0 <= v <= DAY_US else REJECT),
        ),
        Form("exact", nullable(st.integers(0, DAY_US)), none_or(lambda v: v), arrow_type=pa.time64("us")),
    ),
    fixed("string_value"),
)


# -- lists -------------------------------------------------------------------------------------


def each(rule: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A list's rule: element by element; one refused element refuses the list."""

    def apply(xs: list[Any] | None) -> Any:
        if xs is None:
            return None
        out = [None if x is None else rule(x) for x in xs]
        if REJECT in out:
            return REJECT
        if any(isinstance(o, Maybe) for o in out):
            return Maybe([o.value if isinstance(o, Maybe) else o for o in out])
        return out

    return apply


def lists(values: st.SearchStrategy) -> st.SearchStrategy:
    return nullable(st.lists(st.one_of(st.none(), values, values, values), max_size=5))


def list_kind(sql: str, forms: list[tuple[str, st.SearchStrategy, Callable[[Any], Any], pa.DataType | None]]) -> Kind:
    return Kind(
        sql,
        tuple(Form(name, lists(values), each(rule), arrow_type=t) for name, values, rule, t in forms),
        fixed("list_value"),
    )


SMALL = st.integers(-(2**20), 2**20)
KINDS: dict[str, Kind] = {
    "boolean": BOOLEAN,
    "tinyint": integer(pa.int8(), -(2**7), 2**7 - 1),
    "smallint": integer(pa.int16(), -(2**15), 2**15 - 1),
    "integer": integer(pa.int32(), -(2**31), 2**31 - 1),
    "bigint": integer(pa.int64(), *I64),
    "hugeint": integer(pa.int64(), -(2**127), 2**127 - 1, pushable=(-(10**38) + 1, 10**38 - 1)),
    "utinyint": integer(pa.uint8(), 0, 2**8 - 1),
    "usmallint": integer(pa.uint16(), 0, 2**16 - 1),
    "uinteger": integer(pa.uint32(), 0, 2**32 - 1),
    "ubigint": integer(pa.uint64(), 0, 2**64 - 1),
    "real": floating(single=True),
    "double": floating(single=False),
    "dec4_2": decimal_kind(4, 2),
    "dec18_6": decimal_kind(18, 6),
    "dec38_10": decimal_kind(38, 10),
    "dec38_0": decimal_kind(38, 0),
    "varchar": VARCHAR,
    "blob": BLOB,
    "date": DATE,
    "timestamp": timestamp_kind("us"),
    "timestamp_ns": timestamp_kind("ns"),
    "timestamptz": TIMESTAMPTZ,
    "time": TIME,
    "bigint_list": list_kind(
        "BIGINT[]",
        [
            ("int", st.integers(*I64), lambda v: v, None),
            ("double", FLOATS, lambda f: whole(f, *I64), None),
            (
                "text",
                st.integers(-(2**64), 2**64).map(str),
                lambda s: int(s) if I64[0] <= int(s) <= I64[1] else REJECT,
                None,
            ),
        ],
    ),
    "real_list": list_kind("REAL[]", [("double", FLOATS, real32, None), ("int", SMALL, float, None)]),
    "double_list": list_kind("DOUBLE[]", [("double", FLOATS, lambda f: f, None)]),
    "boolean_list": list_kind(
        "BOOLEAN[]", [("bool", st.booleans(), lambda b: b, None), ("int", st.integers(0, 2), lambda v: REJECT, None)]
    ),
    "varchar_list": list_kind("VARCHAR[]", [("text", TEXT, lambda s: s, None)]),
    "decimal_list": list_kind(
        "DECIMAL(10,2)[]",
        [
            ("decimal", st.decimals(allow_nan=False, allow_infinity=False), lambda d: fits(d, 10, 2), None),
            ("text", st.decimals(-(10**9), 10**9, places=3).map(str), lambda t: fits(decimal.Decimal(t), 10, 2), None),
            ("double", FLOATS, lambda f: fits(decimal.Decimal(repr(f)), 10, 2) if math.isfinite(f) else REJECT, None),
        ],
    ),
    "timestamp_list": list_kind(
        "TIMESTAMP[]",
        [
            ("datetime", DATETIMES, micros, None),
            (
                "text",
                DATETIMES.map(lambda t: t.isoformat(sep=" ")),
                lambda s: micros(dt.datetime.fromisoformat(s)),
                None,
            ),
        ],
    ),
    "bigint_nested": list_kind(
        "BIGINT[][]", [("list", st.lists(st.one_of(st.none(), SMALL), max_size=3), each(lambda v: v), None)]
    ),
}

APP = "\n".join(f"CREATE STREAM t_{name} (k BIGINT, v {kind.sql}) PARTITION BY (k);" for name, kind in KINDS.items())


# -- the servers -------------------------------------------------------------------------------


@dataclass
class Server:
    rows: Client
    arrow: Client
    stub: pb_grpc.StreamTxStub
    keys: Iterator[int]
    back_ids: dict[str, Iterator[int]]

    def __repr__(self) -> str:
        return f"Server({self.arrow.target})"


@pytest.fixture(scope="module", params=[1, 2], ids=["P1", "P2"])
def srv(request, tmp_path_factory) -> Iterator[Server]:
    with EmbeddedServer(tmp_path_factory.mktemp("types"), partitions=request.param) as server:
        with (
            Client(server.target, arrow=False) as rows,
            Client(server.target) as arrow,
            grpc.insecure_channel(server.target) as channel,
        ):
            arrow.deploy(APP)
            back_ids = {name: itertools.count(1) for name in KINDS}
            yield Server(rows, arrow, pb_grpc.StreamTxStub(channel), itertools.count(1), back_ids)


# -- reading back ------------------------------------------------------------------------------


def plain(kind: pa.DataType) -> pa.DataType:
    """The type whose Python values hold `kind`'s exactly: times and dates as their numbers."""
    if pa.types.is_timestamp(kind) or pa.types.is_time64(kind):
        return pa.int64()
    if pa.types.is_date32(kind):
        return pa.int32()
    if pa.types.is_list(kind):
        return pa.list_(plain(kind.value_type))
    return kind


def stored(srv: Server, name: str, keys: list[int]) -> dict[int, Any]:
    table = srv.arrow.query(
        f"SELECT k, v FROM t_{name} WHERE k BETWEEN $lo AND $hi", {"lo": min(keys), "hi": max(keys)}
    ).arrow()
    v = table.column("v")
    return dict(zip(table.column("k").to_pylist(), v.cast(plain(v.type)).to_pylist(), strict=True))


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if a is None or b is None:
        return a is None and b is None
    return a == b


def table(keys: list[int], values: list[Any], kind: pa.DataType | None) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(values, type=kind)})


def check_rows_format(srv: Server, name: str, kind: Kind, keys: list[int], want: dict[int, Any]) -> None:
    """Read in ROWS, each value has its documented kind, and pushed back through Rows it is stored identically."""
    sql = f"SELECT k, v FROM t_{name} WHERE k BETWEEN $lo AND $hi"
    params = wire.params_to_proto({"lo": min(keys), "hi": max(keys)})
    rows = srv.stub.Query(pb.QueryRequest(sql=sql, params=params, format=pb.ROWS), timeout=60).result.rows
    assert list(rows.columns) == ["k", "v"]
    back: dict[int, int] = {}
    out = []
    for row in rows.rows:
        k, v = row.values
        assert v.WhichOneof("kind") == kind.rows_kind(want[k.int_value]), (name, want[k.int_value], v)
        new = next(srv.keys)
        back[new] = k.int_value
        out.append(pb.Row(values=[pb.Value(int_value=new), v]))
    if not out:
        return
    ack = srv.stub.Push(
        pb.PushRequest(
            stream=f"t_{name}",
            producer_id="rows-back",
            batch_id=next(srv.back_ids[name]),
            data=pb.RowData(rows=pb.Rows(columns=["k", "v"], rows=out)),
        ),
        timeout=60,
    )
    assert ack.outcome == pb.COMMITTED, (name, ack.reason)
    again = stored(srv, name, list(back))
    for new, old in back.items():
        assert same(again[new], want[old]), (name, "ROWS read pushed back", want[old], again[new])


# -- the property ------------------------------------------------------------------------------


def outcome_of(srv: Server, name: str, form: Form, values: list[Any]) -> None:
    stream = f"t_{name}"
    pushed: list[tuple[str, int, Any, Any]] = []
    batches: list[tuple[str, list[int], Any]] = []
    for path, client in (("rows", srv.rows), ("arrow", srv.arrow)):
        for x in values:
            key = next(srv.keys)
            pushed.append((path, key, x, client.push(stream, table([key], [x], form.arrow_type))))
        keys = [next(srv.keys) for _ in values]
        batches.append((path, keys, client.push(stream, table(keys, values, form.arrow_type))))
    srv.rows.flush()
    srv.arrow.flush()
    every = [k for _, k, _, _ in pushed] + [k for _, keys, _ in batches for k in keys]
    got = stored(srv, name, every)

    seen: dict[tuple[str, int], Any] = {}
    for i, (path, key, x, fut) in enumerate(pushed):
        res = fut.result()
        rule = form.arrow_expect if path == "arrow" and form.arrow_expect else form.expect
        want = rule(x)
        label = (name, form.name, path, x, want)
        if res.outcome == "rejected":
            assert want is REJECT or isinstance(want, Maybe), (*label, res.reason)
            assert res.code == grpc.StatusCode.INVALID_ARGUMENT, (*label, res.code, res.reason)
            assert "column 'v' row 0" in res.reason, (*label, res.reason)
            seen[(path, i % len(values))] = REJECT
            continue
        assert res.outcome == "committed", (*label, res)
        assert want is not REJECT, (*label, "committed as", got.get(key))
        assert same(got[key], want.value if isinstance(want, Maybe) else want), (*label, "stored", got[key])
        seen[(path, i % len(values))] = got[key]

    if form.agree and not form.arrow_expect:
        for i, x in enumerate(values):
            r, a = seen[("rows", i)], seen[("arrow", i)]
            assert same(r, a) if REJECT not in (r, a) else r == a, (name, form.name, x, "rows:", r, "arrow:", a)

    for path, keys, fut in batches:
        res = fut.result()
        refused = [i for i in range(len(values)) if seen[(path, i)] is REJECT]
        if refused:
            assert res.outcome == "rejected" and res.code == grpc.StatusCode.INVALID_ARGUMENT, (name, path, res)
            assert any(f"column 'v' row {i}:" in res.reason for i in refused), (name, path, refused, res.reason)
        else:
            assert res.outcome == "committed", (name, form.name, path, values, res.reason)
            for i, key in enumerate(keys):
                assert same(got[key], seen[(path, i)]), (name, path, values[i], got[key], seen[(path, i)])

    if got:
        check_rows_format(srv, name, KINDS[name], list(got), got)


@pytest.mark.parametrize("name", list(KINDS))
@settings(
    max_examples=int(os.environ.get("TYPES_EXAMPLES", 5)),  # more to hunt: TYPES_EXAMPLES=50 pytest ...
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_each_value_is_stored_exactly_or_rejected_naming_its_column(srv, name, data):
    kind = KINDS[name]
    form = data.draw(st.sampled_from(kind.forms), label="form")
    values = data.draw(st.lists(form.values, min_size=1, max_size=8), label="values")
    if form.arrow_type is None:
        try:
            pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            values = [v for v in values if v is None] or [None]  # no Arrow type holds them all: not a push
    outcome_of(srv, name, form, values)


@pytest.mark.parametrize(
    "sql, instead",
    [
        ("UHUGEINT", "HUGEINT"),
        ("UUID", "VARCHAR"),
        ("JSON", "VARCHAR"),
        ("ENUM('a', 'b')", "VARCHAR"),
        ("BIT", "VARCHAR"),
        ("INTERVAL", "BIGINT"),
        ("TIMETZ", "TIMESTAMPTZ"),
        ("UUID[]", "VARCHAR"),
        ("STRUCT(a INTEGER, b JSON)", "VARCHAR"),
    ],
)
def test_a_type_a_push_cannot_carry_exactly_is_refused_at_deploy(srv, sql, instead):
    """Its Arrow form is wider (a UUID travels as VARCHAR): a value DuckDB refuses would fail after the commit."""
    with pytest.raises(InvalidArgument) as refused:
        srv.arrow.deploy(f"CREATE STREAM pushed (k BIGINT, v {sql});")
    assert "stream 'pushed': column 'v' is" in refused.value.message, refused.value.message
    assert f"declare it {instead}" in refused.value.message, refused.value.message


def test_a_stream_procedures_write_keeps_any_type(srv):
    srv.arrow.deploy(
        "CREATE STREAM ids_in (k BIGINT);\nCREATE STREAM ids_out (k BIGINT, u UUID, j JSON);\n"
        "CREATE PROCEDURE ids ON STREAM ids_in AS BEGIN\n"
        "  INSERT INTO ids_out SELECT k, md5(k::VARCHAR)::UUID, to_json(k) FROM ids_in;\nEND;"
    )
    assert srv.arrow.push("ids_in", {"k": [1, 2]}).result().outcome == "committed"
    got = srv.arrow.query("SELECT k, u::VARCHAR, j::VARCHAR FROM ids_out ORDER BY k").fetchall()
    assert got == [(1, "c4ca4238-a0b9-2382-0dcc-509a6f75849b", "1"), (2, "c81e728d-9d4c-2f63-6f06-7f89cc14862c", "2")]


@pytest.mark.parametrize(
    "name, column",
    [
        (
            "varchar",
            pa.Array.from_buffers(
                pa.string(), 2, [None, pa.py_buffer(b"\0\0\0\0\1\0\0\0\3\0\0\0"), pa.py_buffer(b"a\xff\xfe")]
            ),
        ),
        (
            "dec4_2",
            pa.Array.from_buffers(
                pa.decimal128(4, 2), 2, [None, pa.py_buffer(bytes(16) + (10**30).to_bytes(16, "little"))]
            ),
        ),
    ],
    ids=["not-utf8", "beyond-precision"],
)
def test_arrow_bytes_that_are_not_a_value_of_the_type_are_refused(srv, name, column):
    """Arrow IPC holds what a client wrote: text not UTF-8 failed in DuckDB after the ack; a wide decimal wrapped."""
    data = pa.table({"k": pa.array([next(srv.keys), next(srv.keys)], pa.int64()), "v": column})
    request = pb.PushRequest(
        stream=f"t_{name}", producer_id=f"raw-{name}", batch_id=1, data=pb.RowData(arrow_ipc=wire.table_to_ipc(data))
    )
    ack = srv.stub.Push(request, timeout=60)
    assert ack.outcome == pb.REJECTED and ack.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], ack
    assert "column 'v' row 1: invalid" in ack.reason, ack.reason
    assert srv.arrow.query(
        f"SELECT count(*) FROM t_{name} WHERE k >= $k", {"k": min(data["k"].to_pylist())}
    ).fetchall() == [(0,)]


def test_arrow_time_of_24_00_00_is_stored_and_one_microsecond_more_is_refused(srv):
    """Arrow's own validation refuses a time64 of a whole day, which DuckDB keeps as TIME '24:00:00' (and
    which the protobuf rows path takes): the Arrow path takes it too."""
    keys = [next(srv.keys), next(srv.keys)]
    day = pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array([DAY_US, 0], pa.time64("us"))})
    assert srv.arrow.push("t_time", day).result(timeout=60).outcome == "committed"
    got = srv.arrow.query("SELECT k, CAST(v AS VARCHAR) FROM t_time WHERE k >= $k ORDER BY k", {"k": keys[0]})
    assert got.fetchall() == [(keys[0], "24:00:00"), (keys[1], "00:00:00")]
    beyond = pa.table({"k": pa.array([next(srv.keys)], pa.int64()), "v": pa.array([DAY_US + 1], pa.time64("us"))})
    result = srv.arrow.push("t_time", beyond).result(timeout=60)
    assert result.outcome == "rejected" and "column 'v' row 0" in result.reason, result
