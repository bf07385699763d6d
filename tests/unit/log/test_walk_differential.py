"""The C record walk (``ads_broker.log._walk``) against its Python reference
(``ads_broker.log.walk_reference``): on generated valid, mutated and truncated record bodies both
must return the same position, state, and error kind, record index and numbers.

The bodies are built field by field with our own varint encoder so that they reach what a real
client never sends: non-minimal varints up to and past Kafka's 5/10-byte limits, 5th bytes with bits
past 32, lengths that lie, negative header counts and key lengths, offset deltas out of order,
extreme timestamp deltas; then bytes are flipped, inserted, deleted and the body cut anywhere.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ads_broker.log import _walk
from ads_broker.log import walk_reference as ref
from tests.fuzz.frames import uvarint as _unsigned

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Examples of the main differential test: 200 in `make test` (~10 s); WALK_DIFF_EXAMPLES=20000 for a long run.
EXAMPLES = int(os.environ.get("WALK_DIFF_EXAMPLES", "200"))


def _zigzag(value: int, bits: int) -> int:
    return ((value << 1) ^ (value >> (bits - 1))) & ((1 << bits) - 1)


def _pad(raw: bytes, extra: int) -> bytes:
    """The same value in ``extra`` more bytes (continuation bits, zero payload): Kafka's decoder
    accepts it while the total stays within its limit."""
    if not extra:
        return raw
    return raw[:-1] + bytes([raw[-1] | 0x80]) + b"\x80" * (extra - 1) + b"\x00"


@st.composite
def varint(draw: st.DrawFn, value: int | None = None, bits: int = 32) -> bytes:
    low, high = (-(2**31), 2**31 - 1) if bits == 32 else (INT64_MIN, INT64_MAX)
    if value is None or draw(st.integers(0, 19)) == 0:
        value = draw(st.one_of(st.integers(-3, 300), st.integers(low, high)))
    kind = draw(st.integers(0, 9))
    if kind == 0:  # raw unsigned bits past the type's width (Kafka drops them)
        return _unsigned(draw(st.integers(0, 2 ** (bits + 6) - 1)))
    raw = _unsigned(_zigzag(value, bits))
    if kind == 1:  # non-minimal, sometimes past Kafka's limit
        return _pad(raw, draw(st.integers(1, 7 if bits == 32 else 12)))
    return raw


@st.composite
def record(draw: st.DrawFn, index: int) -> bytes:
    key = draw(st.one_of(st.none(), st.binary(max_size=12)))
    value = draw(st.one_of(st.none(), st.binary(max_size=40)))
    body = bytearray(b"\x00")  # attributes
    body += draw(varint(draw(st.one_of(st.integers(-5, 5), st.integers(INT64_MIN, INT64_MAX))), bits=64))
    body += draw(varint(index if draw(st.integers(0, 9)) else draw(st.integers(-2, index + 2))))
    body += draw(varint(-1 if key is None else len(key))) + (key or b"")
    body += draw(varint(-1 if value is None else len(value))) + (value or b"")
    headers = draw(st.lists(st.tuples(st.binary(max_size=6), st.one_of(st.none(), st.binary(max_size=6))),
                            max_size=3))
    body += draw(varint(len(headers)))
    for hkey, hvalue in headers:
        body += draw(varint(len(hkey))) + hkey
        body += draw(varint(-1 if hvalue is None else len(hvalue))) + (hvalue or b"")
    length = len(body) if draw(st.integers(0, 9)) else draw(st.integers(-3, len(body) + 3))
    return draw(varint(length)) + bytes(body)


@st.composite
def body(draw: st.DrawFn) -> tuple[bytes, int]:
    count = draw(st.integers(0, 6))
    data = bytearray(b"".join(draw(record(i)) for i in range(count)))
    for _ in range(draw(st.integers(0, 3))):  # mutations
        op = draw(st.integers(0, 2))
        at = draw(st.integers(0, len(data)))
        if op == 0 and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif op == 1:
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif at < len(data):
            del data[at]
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data), count + draw(st.integers(-1, 2))


STATE = st.tuples(st.integers(INT64_MIN, INT64_MAX), st.integers(INT64_MIN, INT64_MAX),
                  st.integers(INT64_MIN, INT64_MAX))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body(), STATE, st.integers(0, 3), st.data())
def test_c_walk_agrees_with_the_reference(generated: tuple[bytes, int], state: tuple[int, int, int], start: int,
                                          data: st.DataObject) -> None:
    buf, count = generated
    min_delta, max_delta, no_ts = state
    pos = data.draw(st.integers(0, min(start, len(buf))))
    as_bytearray = data.draw(st.booleans())  # what the compressed path passes (its window)
    args = (pos, len(buf), 0, count, min_delta, max_delta, no_ts, -1)
    expected = ref.scan_span(buf, *args)
    event(f"error kind {expected[5]}")
    assert _walk.scan_span(bytearray(buf) if as_bytearray else buf, *args) == expected


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 70))
def test_c_walk_agrees_with_the_reference_on_random_bytes(buf: bytes, count: int) -> None:
    args = (0, len(buf), 0, count, INT64_MAX, -1, -1, -1)
    assert _walk.scan_span(buf, *args) == ref.scan_span(buf, *args)


def test_varints_past_kafkas_limits_are_errors_in_both() -> None:
    # length 7 as a 6-byte varint: over the 5-byte limit of a varint
    too_long_length = _pad(_unsigned(14), 5)
    # a valid length, then a timestamp delta in 11 bytes: over the 10-byte limit of a varlong
    ts = _pad(_unsigned(0), 10)
    rec = b"\x00" + ts + b"\x00\x01\x01\x00"
    too_long_ts = _unsigned(_zigzag(len(rec), 32)) + rec
    for buf, limit in ((too_long_length, 5), (too_long_ts, 10)):
        args = (0, len(buf), 0, 1, INT64_MAX, -1, -1, -1)
        result = _walk.scan_span(buf, *args)
        assert result == ref.scan_span(buf, *args)
        assert result[5:7] == (ref.WALK_LONG_VARINT, limit)


def test_the_walk_refuses_positions_outside_the_data() -> None:
    for pos, end in ((-1, 3), (2, 1), (0, 9)):
        for impl in (_walk.scan_span, ref.scan_span):
            try:
                impl(b"abc", pos, end, 0, 1, 0, 0, 0, -1)
            except ValueError as exc:
                assert "0 <= pos <= end <= len(data)" in str(exc)
            else:
                raise AssertionError(f"{impl} accepted pos {pos}, end {end}")


@settings(max_examples=max(EXAMPLES // 2, 1), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body(), st.integers(INT64_MIN, INT64_MAX), st.tuples(st.integers(-10, 10), st.integers(-10, 10)),
       st.integers(0, 3), st.booleans())
def test_the_naming_pass_marks_agree_with_the_reference(generated: tuple[bytes, int], no_ts: int,
                                                        bounds: tuple[int, int], flags: int,
                                                        as_memoryview: bool) -> None:
    """The naming pass of a refused batch (marks and timestamp deltas per record): both walks mark
    the same records, write the same deltas, and leave every byte past the records walked alone."""
    buf, count = generated
    count = max(count, 0)
    results = []
    for impl in (_walk.scan_span, ref.scan_span):
        marks, deltas = bytearray(b"\xee" * count), bytearray(b"\xee" * (8 * count))
        args = (0, len(buf), 0, count, INT64_MAX, -1, no_ts, -1)
        out = impl(buf, *args, memoryview(marks) if as_memoryview else marks, deltas, bounds[0], bounds[1], flags)
        results.append((out, bytes(marks), bytes(deltas)))
        walked = out[1]
        assert marks[walked:] == b"\xee" * (count - walked)  # nothing written past the records walked
        assert set(marks[:walked]) <= {ref.MARK_OK, ref.MARK_NULL_KEY, ref.MARK_TIMESTAMP}
    assert results[0] == results[1]
    plain = ref.scan_span(buf, 0, len(buf), 0, count, INT64_MAX, -1, no_ts, -1)
    assert results[0][0] == plain  # the marks change nothing of the walk's result


def test_the_naming_pass_marks_keys_first_then_timestamps() -> None:
    """Kafka's validateRecord order: a keyless record is a key error even when its timestamp is out
    of range too; a record without a timestamp (no_ts_delta) is never a timestamp error."""
    def rec(index: int, key: bytes | None, ts_delta: int) -> bytes:
        body = (b"\x00" + _unsigned(_zigzag(ts_delta, 64)) + _unsigned(_zigzag(index, 32))
                + (_unsigned(1) if key is None else _unsigned(_zigzag(len(key), 32)) + key) + b"\x00\x00")
        return _unsigned(_zigzag(len(body), 32)) + body
    no_ts = -7
    cases = [(None, 0), (b"k", 500), (None, 500), (b"k", 0), (b"k", no_ts), (None, no_ts)]
    buf = b"".join(rec(i, key, delta) for i, (key, delta) in enumerate(cases))
    for flags, expected in ((3, [1, 2, 1, 0, 0, 1]), (2, [0, 2, 2, 0, 0, 0]), (1, [1, 0, 1, 0, 0, 1]),
                            (0, [0] * 6)):
        for impl in (_walk.scan_span, ref.scan_span):
            marks, deltas = bytearray(6), bytearray(48)
            out = impl(buf, 0, len(buf), 0, 6, INT64_MAX, -1, no_ts, -1, marks, deltas, -100, 100, flags)
            assert out[5] == ref.WALK_OK and out[1] == 6
            assert list(marks) == expected, (impl, flags)
            assert [int.from_bytes(deltas[8 * i: 8 * i + 8], "little", signed=True) for i in range(6)] == [
                d for _, d in cases]


def test_the_naming_pass_refuses_buffers_too_small_for_count() -> None:
    for impl in (_walk.scan_span, ref.scan_span):
        for marks, deltas in ((bytearray(2), bytearray(24)), (bytearray(3), bytearray(16)), (bytearray(3), None)):
            try:
                impl(b"", 0, 0, 0, 3, 0, 0, 0, -1, marks, deltas, 0, 0, 3)
            except ValueError:
                pass
            else:
                raise AssertionError(f"{impl} accepted marks of {len(marks)} and deltas of {deltas!r}")
