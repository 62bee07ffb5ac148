"""The command log on real files with real fsync: round trips, group commit, rotation,
torn tails (dropped), corruption (refused, precisely located), and a writer killed with SIGKILL."""

from __future__ import annotations

import datetime
import decimal
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtx.recovery.errors import CorruptLog, LogFailed, UnreadableFormat
from streamtx.recovery.log import CommandLog, LogReader, NullLog, list_segments, segment_name
from streamtx.recovery.records import (
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    RecordKind,
    decode_command,
    encode_command,
    encode_record,
    encode_segment_header,
)

sys.path.insert(0, str(Path(__file__).parent))
from crash_writer import expected_payload  # noqa: E402

pytestmark = pytest.mark.timeout(120)

NEVER_MS = 600_000.0  # a group timer that never fires within a test


def payloads(log_dir: Path, from_lsn: int | None = None) -> list[tuple[int, bytes]]:
    return [(r.lsn, r.payload) for r in LogReader(log_dir).records(from_lsn)]


def write_log(log_dir: Path, items: list[bytes], **kw) -> None:
    with CommandLog(log_dir, **kw) as log:
        for p in items:
            log.append(RecordKind.PUSH, p)
        log.flush()


def record_offsets(sizes: list[int]) -> list[int]:
    """Byte offset of each record in a single segment holding records of these payload sizes."""
    out, pos = [], SEGMENT_HEADER_SIZE
    for n in sizes:
        out.append(pos)
        pos += RECORD_HEADER_SIZE + n
    return out + [pos]


# ----------------------------------------------------------------------------- round trips


def sample_table(n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": pa.array([f"név-{i}" if i % 3 else None for i in range(n)], pa.string()),
            "amount": pa.array([decimal.Decimal(f"{i}.25") for i in range(n)], pa.decimal128(12, 2)),
            "at": pa.array([datetime.datetime(2026, 1, 1) + datetime.timedelta(seconds=i) for i in range(n)]),
            "tags": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int32())),
        }
    )


def test_round_trip_with_arrow_bodies(tmp_path: Path) -> None:
    commands = [
        ({"op": "push", "stream": "votes", "producer": "p1", "batch_id": i, "dedup": [i, "x"]}, [sample_table(i * 7)])
        for i in range(20)
    ]
    commands.append(({"op": "call", "procedure": "add", "params": [1, "two", None, 3.5]}, []))
    commands.append(({"op": "two tables"}, [sample_table(3), sample_table(0)]))
    with CommandLog(tmp_path) as log:
        lsns = [log.append(RecordKind.PUSH, encode_command(h, t), ts=1000 + i) for i, (h, t) in enumerate(commands)]
        assert lsns == list(range(1, len(commands) + 1))
        assert log.flush() == len(commands)
    got = list(LogReader(tmp_path).records())
    assert [r.lsn for r in got] == lsns
    assert [r.ts for r in got] == [1000 + i for i in range(len(commands))]
    for rec, (header, tables) in zip(got, commands, strict=True):
        h, ts = decode_command(rec.payload)
        assert h == header
        assert len(ts) == len(tables)
        for a, b in zip(ts, tables, strict=True):
            assert a.equals(b) and a.schema == b.schema


def test_kinds_timestamps_and_empty_payloads(tmp_path: Path) -> None:
    with CommandLog(tmp_path) as log:
        log.append(0, b"", ts=-5)
        log.append(0xFFFF, b"x", ts=2**62)
        with pytest.raises(ValueError, match="u16"):
            log.append(0x10000, b"")
    got = list(LogReader(tmp_path).records())
    assert [(r.kind, r.ts, r.payload) for r in got] == [(0, -5, b""), (0xFFFF, 2**62, b"x")]


def test_decode_command_refuses_malformed_payloads() -> None:
    good = encode_command({"a": 1}, [sample_table(2)])
    with pytest.raises(ValueError, match="declares"):
        decode_command(good[:-1])
    with pytest.raises(ValueError, match="shorter than"):
        decode_command(b"\x01")
    with pytest.raises(ValueError):
        encode_command({"nan": float("nan")})


def test_reopen_continues_lsns(tmp_path: Path) -> None:
    write_log(tmp_path, [b"a", b"b"])
    with CommandLog(tmp_path) as log:
        assert log.durable_lsn == 2 and log.last_lsn == 2
        assert log.append(1, b"c") == 3
    assert payloads(tmp_path) == [(1, b"a"), (2, b"b"), (3, b"c")]
    assert payloads(tmp_path, 3) == [(3, b"c")]
    assert payloads(tmp_path, 4) == []


def test_replay_reports_progress(tmp_path: Path) -> None:
    with CommandLog(tmp_path, segment_bytes=200) as log:
        for i in range(9):
            log.append(1, bytes([i]) * 100)
            log.flush()
    reader = LogReader(tmp_path)
    assert len(reader.segments) > 2
    steps = [(done, total, rec.lsn) for done, total, rec in reader.replay(4)]
    assert steps == [(i - 3, 6, i) for i in range(4, 10)]


# ----------------------------------------------------------------------------- group commit


def test_group_commit_by_size(tmp_path: Path) -> None:
    with CommandLog(tmp_path, group_bytes=4096, group_ms=NEVER_MS) as log:
        for _ in range(3):
            log.append(1, b"x" * 1000)
        assert log.durable_lsn == 0  # 3 * 1032 bytes: below the threshold, and the timer never fires
        lsn = log.append(1, b"x" * 1000)  # 4128 bytes buffered: this group is due now
        assert log.wait_durable(lsn, timeout=30)
        assert log.groups == 1
        assert [r.lsn for r in LogReader(tmp_path).records()] == [1, 2, 3, 4]
        log.append(1, b"small")
        assert log.durable_lsn == 4
        assert log.flush() == 5
        assert log.groups == 2


def test_group_commit_by_time(tmp_path: Path) -> None:
    with CommandLog(tmp_path, group_bytes=1 << 30, group_ms=5.0) as log:
        lsn = log.append(1, b"alone")
        assert log.wait_durable(lsn, timeout=30)
        assert payloads(tmp_path) == [(1, b"alone")]
        lsns = [log.append(1, b"y") for _ in range(10)]
        assert log.wait_durable(lsns[-1], timeout=30)
        assert log.durable_lsn == 11


def test_flush_soon_starts_the_group_without_waiting_for_it(tmp_path: Path) -> None:
    with CommandLog(tmp_path, group_bytes=1 << 30, group_ms=NEVER_MS) as log:
        log.flush_soon()  # nothing buffered: no group
        lsns = [log.append(1, b"z") for _ in range(3)]
        assert log.durable_lsn == 0  # neither size nor timer would ever write these
        log.flush_soon()
        assert log.wait_durable(lsns[-1], timeout=30)
        assert log.groups == 1 and payloads(tmp_path) == [(1, b"z"), (2, b"z"), (3, b"z")]


def test_one_fsync_covers_a_whole_group(tmp_path: Path) -> None:
    with CommandLog(tmp_path, group_bytes=1 << 30, group_ms=NEVER_MS) as log:
        for i in range(500):
            log.append(1, str(i).encode())
        assert log.durable_lsn == 0
        assert log.flush() == 500
        assert log.groups == 1
    assert len(payloads(tmp_path)) == 500


def test_on_durable_reports_increasing_lsns(tmp_path: Path) -> None:
    seen: list[int] = []
    with CommandLog(tmp_path, group_bytes=2048, group_ms=1.0, on_durable=seen.append) as log:
        for i in range(300):
            log.append(1, bytes(i))
        log.flush()
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert seen[-1] == 300


def test_wait_durable_timeout_and_unknown_lsn(tmp_path: Path) -> None:
    with CommandLog(tmp_path, group_bytes=1 << 30, group_ms=NEVER_MS) as log:
        lsn = log.append(1, b"x")
        assert log.wait_durable(lsn, timeout=0.01) is False
        with pytest.raises(ValueError, match="never appended"):
            log.wait_durable(lsn + 1)
        log.flush()
        assert log.wait_durable(lsn, timeout=0)


def test_appends_from_executor_while_flusher_runs(tmp_path: Path) -> None:
    """Acks gated on durable_lsn: every acknowledged lsn is in the log afterwards."""
    acked: list[int] = []
    wake = threading.Event()
    with CommandLog(tmp_path, group_bytes=8192, group_ms=0.5, on_durable=lambda _lsn: wake.set()) as log:
        pending: list[int] = []
        for i in range(2000):
            pending.append(log.append(1, i.to_bytes(4, "little") * (i % 50)))
            durable = log.durable_lsn
            acked += [x for x in pending if x <= durable]
            pending = [x for x in pending if x > durable]
        log.flush()
        acked += pending
    got = dict(payloads(tmp_path))
    assert sorted(acked) == list(range(1, 2001))
    assert all(got[lsn] == (lsn - 1).to_bytes(4, "little") * ((lsn - 1) % 50) for lsn in acked)


def test_closed_log_refuses_appends(tmp_path: Path) -> None:
    log = CommandLog(tmp_path)
    log.append(1, b"x")
    log.close()
    log.close()
    with pytest.raises(LogFailed, match="closed"):
        log.append(1, b"y")
    assert payloads(tmp_path) == [(1, b"x")]


def test_failed_write_stops_the_log(tmp_path: Path) -> None:
    failures: list[LogFailed] = []
    log = CommandLog(tmp_path, group_ms=NEVER_MS, on_failure=failures.append)
    read_only = os.open(os.devnull, os.O_RDONLY)
    os.dup2(read_only, log._fd)  # the next write gets EBADF, as a failed disk would give EIO
    os.close(read_only)
    log.append(1, b"x")
    with pytest.raises(LogFailed, match=r"lsns 1\.\.1 failed"):
        log.flush()
    with pytest.raises(LogFailed):
        log.append(1, b"y")
    assert len(failures) == 1
    with pytest.raises(LogFailed):
        log.close()


def test_null_log_has_the_same_interface() -> None:
    seen: list[int] = []
    with NullLog(on_durable=seen.append) as log:
        assert log.append(RecordKind.CALL, b"x") == 1
        assert log.append(RecordKind.CALL, b"y") == 2
        assert log.durable_lsn == 2 and log.last_lsn == 2
        assert log.flush() == 2
        assert log.wait_durable(2)
        assert list(log.records()) == []
        assert log.truncate_before(2) == 0
    assert seen == [1, 2]


# ----------------------------------------------------------------------------- rotation and truncation


def test_rotation_and_truncate_before(tmp_path: Path) -> None:
    with CommandLog(tmp_path, segment_bytes=1000) as log:
        for i in range(1, 41):
            log.append(1, bytes([i]) * 100)
            if i % 4 == 0:
                log.flush()  # a group never spans segments: rotation happens between groups
        log.flush()
        segs = list_segments(tmp_path)
        assert len(segs) == 5
        firsts = [first for first, _ in segs]
        assert firsts == [1, 9, 17, 25, 33]
        assert [p.name for _, p in segs] == [segment_name(f) for f in firsts]
        assert [r.lsn for r in LogReader(tmp_path).records()] == list(range(1, 41))
        assert LogReader(tmp_path).total(10) == 31

        assert log.truncate_before(17) == 2  # segments 1..8 and 9..16 hold only lsns < 17
        assert log.truncate_before(18) == 0  # segment 17..24 still holds 17
        assert [r.lsn for r in log.records(17)] == list(range(17, 41))
        with pytest.raises(CorruptLog, match=r"oldest segment log-0+17\.seg starts at lsn 17"):
            list(LogReader(tmp_path).records(16))
        assert log.truncate_before(10_000) == 2  # never the segment being appended to
        assert [first for first, _ in list_segments(tmp_path)] == [33]
        assert log.append(1, b"after") == 41
    assert [r.lsn for r in LogReader(tmp_path).records()] == list(range(33, 42))


def test_a_log_of_another_payload_format_is_refused_naming_the_segment(tmp_path: Path) -> None:
    write_log(tmp_path, [b"a", b"b"], payload_format=1)
    assert [r.payload for r in LogReader(tmp_path, payload_formats=(0, 1)).records()] == [b"a", b"b"]
    with pytest.raises(UnreadableFormat, match=r"log-0+1\.seg: its records are in payload format 1, .* takes format 2"):
        LogReader(tmp_path, payload_formats=(2,))
    write_log(tmp_path, [b"c"], payload_format=2)  # a release with format 2 leaves the old segment as it is
    assert [(first, p.read_bytes()[10]) for first, p in list_segments(tmp_path)] == [(1, 1), (3, 2)]
    assert [r.payload for r in LogReader(tmp_path, payload_formats=(1, 2)).records()] == [b"a", b"b", b"c"]
    with pytest.raises(UnreadableFormat, match=r"log-0+1\.seg: .* payload format 1"):  # a sealed segment too
        LogReader(tmp_path, payload_formats=(2,))


def test_the_journal_refuses_a_log_of_another_release_before_writing(tmp_path: Path) -> None:
    from streamtx.server.partition.journal import COMMAND_FORMAT, READABLE, Journal

    write_log(tmp_path / "log", [b"x"], payload_format=max(READABLE) + 1)
    before = sorted(p.read_bytes() for _, p in list_segments(tmp_path / "log"))
    with pytest.raises(UnreadableFormat, match=f"payload format {max(READABLE) + 1}"):
        Journal.open("strong", tmp_path, lambda _lsn: None, 2.0)
    assert sorted(p.read_bytes() for _, p in list_segments(tmp_path / "log")) == before
    journal = Journal.open("strong", tmp_path / "new", lambda _lsn: None, 2.0)
    journal.log.close()
    assert [p.read_bytes()[10] for _, p in list_segments(tmp_path / "new" / "log")] == [COMMAND_FORMAT]


def test_replay_from_beyond_the_end_is_refused(tmp_path: Path) -> None:
    write_log(tmp_path, [b"a", b"b"])
    with pytest.raises(CorruptLog, match="asked from lsn 7 but the log ends at lsn 2"):
        list(LogReader(tmp_path).records(7))


def test_empty_directory_is_an_empty_log(tmp_path: Path) -> None:
    reader = LogReader(tmp_path / "nothing")
    assert (reader.first_lsn, reader.next_lsn, reader.total()) == (1, 1, 0)
    assert list(reader.records()) == []
    with CommandLog(tmp_path / "fresh", first_lsn=101) as log:
        assert log.append(1, b"x") == 101
    assert payloads(tmp_path / "fresh") == [(101, b"x")]


# ----------------------------------------------------------------------------- torn tails


@pytest.mark.parametrize("cut_into", ["header", "payload", "last byte"])
def test_torn_final_record_is_dropped_and_appends_continue(tmp_path: Path, cut_into: str) -> None:
    sizes = [10, 500, 300, 700]
    write_log(tmp_path, [bytes([i + 1]) * n for i, n in enumerate(sizes)])
    offs = record_offsets(sizes)
    cut = {"header": offs[3] + 5, "payload": offs[3] + RECORD_HEADER_SIZE + 100, "last byte": offs[4] - 1}[cut_into]
    (seg,) = [p for _, p in list_segments(tmp_path)]
    os.truncate(seg, cut)

    reader = LogReader(tmp_path)
    assert reader.next_lsn == 4 and reader.torn is not None
    assert (reader.torn.offset, reader.torn.lsn, reader.torn.size) == (offs[3], 4, cut - offs[3])
    assert [lsn for lsn, _ in payloads(tmp_path)] == [1, 2, 3]

    with CommandLog(tmp_path) as log:
        assert log.torn is not None and log.durable_lsn == 3
        assert seg.stat().st_size == offs[3]  # cut back to the last good record before appending
        assert log.append(1, b"new 4") == 4
        assert log.append(1, b"new 5") == 5
    got = payloads(tmp_path)
    assert got == [(1, b"\x01" * 10), (2, b"\x02" * 500), (3, b"\x03" * 300), (4, b"new 4"), (5, b"new 5")]


def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    """A crash may leave the file longer than the data that reached the disk, the rest zeros."""
    write_log(tmp_path, [b"a" * 50, b"b" * 50])
    (seg,) = [p for _, p in list_segments(tmp_path)]
    with open(seg, "ab") as f:
        f.write(b"\0" * 4096)
    assert [lsn for lsn, _ in payloads(tmp_path)] == [1, 2]
    with CommandLog(tmp_path) as log:
        assert log.append(1, b"c") == 3
    assert [p for _, p in payloads(tmp_path)] == [b"a" * 50, b"b" * 50, b"c"]


def test_final_record_with_zeroed_payload_end_is_torn(tmp_path: Path) -> None:
    sizes = [100, 5000]
    write_log(tmp_path, [b"k" * n for n in sizes])
    offs = record_offsets(sizes)
    (seg,) = [p for _, p in list_segments(tmp_path)]
    with open(seg, "r+b") as f:
        f.seek(offs[1] + RECORD_HEADER_SIZE + 4096)  # the page holding the payload's end never made it
        f.write(b"\0" * (offs[2] - f.tell()))
    assert [lsn for lsn, _ in payloads(tmp_path)] == [1]


def test_torn_segment_header_after_rotation(tmp_path: Path) -> None:
    """A crash while creating the next segment leaves a short header: the segment is recreated."""
    write_log(tmp_path, [b"a", b"b", b"c"])
    seg2 = tmp_path / segment_name(4)
    seg2.write_bytes(b"STXLOG\r")
    assert [lsn for lsn, _ in payloads(tmp_path)] == [1, 2, 3]
    with CommandLog(tmp_path) as log:
        assert log.append(1, b"d") == 4
    assert [p for _, p in payloads(tmp_path)] == [b"a", b"b", b"c", b"d"]
    assert [f for f, _ in list_segments(tmp_path)] == [1, 4]


def test_corrupt_final_record_is_indistinguishable_from_torn(tmp_path: Path) -> None:
    """The documented limit: damage confined to the last record is taken for a tear."""
    sizes = [20, 20, 20]
    write_log(tmp_path, [b"q" * n for n in sizes])
    offs = record_offsets(sizes)
    (seg,) = [p for _, p in list_segments(tmp_path)]
    flip(seg, offs[2] + RECORD_HEADER_SIZE + 3)
    assert [lsn for lsn, _ in payloads(tmp_path)] == [1, 2]


# ----------------------------------------------------------------------------- corruption


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


@pytest.mark.parametrize("where", ["payload", "length field", "lsn field", "header checksum"])
def test_flipped_byte_in_the_middle_is_refused(tmp_path: Path, where: str) -> None:
    sizes = [100] * 10
    write_log(tmp_path, [bytes([i]) * n for i, n in enumerate(sizes)])
    offs = record_offsets(sizes)
    (seg,) = [p for _, p in list_segments(tmp_path)]
    at = offs[4] + {"payload": RECORD_HEADER_SIZE + 50, "length field": 25, "lsn field": 8, "header checksum": 0}[where]
    flip(seg, at)
    with pytest.raises(CorruptLog) as err:
        list(LogReader(tmp_path).records())
    msg = str(err.value)
    assert seg.name in msg and f"offset {offs[4]}" in msg and "lsn 5" in msg, msg
    assert (err.value.path, err.value.offset, err.value.lsn) == (str(seg), offs[4], 5)
    with pytest.raises(CorruptLog):  # opening for appends refuses too: never append after damage
        CommandLog(tmp_path)
    assert seg.stat().st_size == offs[10]  # and nothing was truncated


def test_flipped_byte_in_a_sealed_segment_is_refused_even_at_its_end(tmp_path: Path) -> None:
    with CommandLog(tmp_path, segment_bytes=300) as log:
        for i in range(6):
            log.append(1, bytes([i]) * 100)
            log.flush()
    segs = list_segments(tmp_path)
    assert len(segs) >= 2
    first_seg = segs[0][1]
    flip(first_seg, first_seg.stat().st_size - 1)  # the last record of a sealed segment: not a tear
    with pytest.raises(CorruptLog, match=rf"{first_seg.name}: offset \d+: record lsn \d+: payload checksum mismatch"):
        list(LogReader(tmp_path).records())


def test_missing_middle_segment_is_refused(tmp_path: Path) -> None:
    with CommandLog(tmp_path, segment_bytes=200) as log:
        for i in range(8):
            log.append(1, bytes([i]) * 100)
            log.flush()
    segs = list_segments(tmp_path)
    assert len(segs) >= 4
    segs[2][1].unlink()
    with pytest.raises(CorruptLog, match=rf"lsns {segs[2][0]}\.\.{segs[3][0] - 1} are missing") as err:
        list(LogReader(tmp_path).records())
    assert segs[1][1].name in str(err.value) and segs[3][1].name in str(err.value)


def test_bad_segment_header_is_refused(tmp_path: Path) -> None:
    with CommandLog(tmp_path, segment_bytes=200) as log:
        for i in range(4):
            log.append(1, bytes([i]) * 100)
            log.flush()
    first, seg = list_segments(tmp_path)[0]
    flip(seg, 14)
    with pytest.raises(CorruptLog, match=rf"{seg.name}: offset 0: segment header checksum mismatch"):
        list(LogReader(tmp_path).records())
    seg.write_bytes(b"not a log at all" * 4)
    with pytest.raises(CorruptLog, match="bad magic"):
        list(LogReader(tmp_path).records())


def test_lsn_gap_inside_a_segment_is_refused(tmp_path: Path) -> None:
    """Valid checksums, wrong sequence: a record skipped (or spliced in from elsewhere)."""
    seg = tmp_path / segment_name(1)
    body = [encode_segment_header(1)]
    for lsn in (1, 2, 4, 5):
        body += [encode_record(lsn, 1, 0, b"p"), b"p"]
    seg.write_bytes(b"".join(body))
    offset = SEGMENT_HEADER_SIZE + 2 * (RECORD_HEADER_SIZE + 1)
    with pytest.raises(CorruptLog, match=rf"{seg.name}: offset {offset}: record has lsn 4, expected 3") as err:
        LogReader(tmp_path)
    assert (err.value.offset, err.value.lsn) == (offset, 4)


def test_overlapping_segments_are_refused(tmp_path: Path) -> None:
    for first, lsns in ((1, (1, 2, 3)), (3, (3, 4))):
        body = [encode_segment_header(first)]
        for lsn in lsns:
            body += [encode_record(lsn, 1, 0, b"p"), b"p"]
        (tmp_path / segment_name(first)).write_bytes(b"".join(body))
    with pytest.raises(CorruptLog, match="segment ends at lsn 3 but the next segment .* starts at lsn 3"):
        list(LogReader(tmp_path).records())


def test_renamed_segment_is_refused(tmp_path: Path) -> None:
    write_log(tmp_path, [b"a", b"b"])
    (_, seg) = list_segments(tmp_path)[0]
    seg.rename(tmp_path / segment_name(5))
    with pytest.raises(CorruptLog, match="segment header says first lsn 1, the file name says 5"):
        LogReader(tmp_path)


# ----------------------------------------------------------------------------- randomized


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=25),
    cut_fraction=st.floats(0, 1),
    zero_pad=st.integers(0, 3) | st.just(5000),
    segment_bytes=st.sampled_from([512, 4096, 1 << 20]),
)
def test_random_truncation_recovers_everything_before_the_cut(
    sizes: list[int], cut_fraction: float, zero_pad: int, segment_bytes: int
) -> None:
    rng = random.Random(len(sizes) * 31 + sum(sizes))
    items = [rng.randbytes(n) for n in sizes]
    with tempfile.TemporaryDirectory() as d:
        log_dir = Path(d)
        with CommandLog(log_dir, fsync=False, segment_bytes=segment_bytes) as log:
            for p in items:
                log.append(RecordKind.TE, p)
                log.flush()
        first, last_seg = list_segments(log_dir)[-1]
        size = last_seg.stat().st_size
        cut = int(cut_fraction * size)
        os.truncate(last_seg, cut)
        if zero_pad:
            with open(last_seg, "ab") as f:
                f.write(b"\0" * zero_pad)
        # records of the last segment that end at or before the cut survive; the one across it is dropped
        pos, kept = SEGMENT_HEADER_SIZE, first - 1
        for n in sizes[first - 1 :]:
            if pos + RECORD_HEADER_SIZE + n > cut:
                break
            pos += RECORD_HEADER_SIZE + n
            kept += 1
        assert payloads(log_dir) == list(enumerate(items[:kept], start=1))
        with CommandLog(log_dir, fsync=False, segment_bytes=segment_bytes) as log:
            assert log.durable_lsn == kept
            assert log.append(RecordKind.TE, b"next") == kept + 1
        assert payloads(log_dir) == list(enumerate([*items[:kept], b"next"], start=1))


# ----------------------------------------------------------------------------- a real crash


def run_writer_until_killed(log_dir: Path, seed: int, at_least: int) -> tuple[int, int]:
    """Starts tests/unit/crash_writer.py, SIGKILLs it once it reported `at_least` more durable records.
    Returns (first lsn it appended, highest lsn it reported durable)."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "crash_writer.py"), str(log_dir), str(seed)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        start = int(proc.stdout.readline().split()[1])
        durable = start - 1
        deadline = time.monotonic() + 60
        while durable < start - 1 + at_least and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "the writer died by itself"
            durable = max(durable, int(line.split()[1]))
        time.sleep(random.Random(seed + durable).uniform(0, 0.01))  # land anywhere: mid-write, mid-fsync...
        os.kill(proc.pid, signal.SIGKILL)
        # lines already printed before the kill are acknowledgements too
        for line in proc.stdout:
            durable = max(durable, int(line.split()[1]))
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return start, durable


def test_sigkill_mid_append_loses_nothing_reported_durable(tmp_path: Path) -> None:
    seed = 7
    acked = 0
    for round_ in range(3):
        survived = LogReader(tmp_path).next_lsn
        start, durable = run_writer_until_killed(tmp_path, seed, at_least=200 + round_ * 137)
        assert start == survived  # the writer resumed right after what survived the previous kill
        assert durable >= acked
        acked = durable
        reader = LogReader(tmp_path)
        assert reader.last_lsn >= acked
        n = 0
        for rec in reader.records():
            assert rec.payload == expected_payload(rec.lsn, seed), rec.lsn
            assert (rec.kind, rec.ts) == (rec.lsn % 7, rec.lsn * 10)
            n += 1
        assert n == reader.last_lsn
    assert len(list_segments(tmp_path)) > 1


@pytest.mark.parametrize(("group_ms", "sync"), [(0.0, True), (5000.0, False)])
def test_journal_without_group_commit_makes_each_record_durable_before_going_on(tmp_path, group_ms, sync):
    from streamtx.server.partition.journal import Journal

    journal = Journal.open("strong", tmp_path, lambda _lsn: None, group_ms)
    try:
        assert journal.sync is sync
        for i in range(3):
            journal._append(1, i + 1, {"i": i}, [])
            if sync:  # fsynced before _append returned
                assert journal.log.durable_lsn == journal.last_lsn == i + 1
        if not sync:  # 5 s groups: the three records wait for one fsync together
            assert journal.log.durable_lsn < journal.last_lsn
            journal.log.flush()
            assert journal.log.groups == 1
    finally:
        journal.log.close()
