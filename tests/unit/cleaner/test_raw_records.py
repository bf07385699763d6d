"""The cleaner's in-place record parser agrees with kafka-python's decoder, and refuses garbage."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ads_broker.exceptions import CorruptRecordError
from ads_broker.log.records import Record, build_batch, decode_batch, raw_records, read_header

records_strategy = st.lists(
    st.tuples(st.none() | st.binary(max_size=300), st.none() | st.binary(max_size=300), st.integers(0, 10**6),
              st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=2)),
    min_size=1, max_size=20)


@settings(max_examples=150, deadline=None)
@given(recs=records_strategy, base=st.integers(0, 2**40))
def test_raw_records_match_the_reference_decoder(recs: list[tuple[bytes | None, bytes | None, int,
                                                                    list[tuple[str, bytes | None]]]],
                                                  base: int) -> None:
    data = build_batch([Record(-1, 1_700_000_000_000 + ts, k, v, h) for k, v, ts, h in recs], base_offset=base)
    header = read_header(data)
    raw = raw_records(data, header)
    _, ref = decode_batch(data)
    assert [(r.offset, r.timestamp, r.key, r.tombstone) for r in raw] == [
        (r.offset, r.timestamp, r.key, r.value is None) for r in ref]
    assert raw[0].start == 61 and raw[-1].end == len(data)


def test_malformed_records_are_corrupt() -> None:
    data = bytearray(build_batch([Record(-1, 1, b"k", b"v"), Record(-1, 1, b"k2", b"v2")]))
    header = read_header(data)
    with pytest.raises(CorruptRecordError):
        raw_records(bytes(data[:-3]), header)  # records end before the batch does
    data[61] = 0x7F  # first record claims a length far beyond the batch
    with pytest.raises(CorruptRecordError):
        raw_records(bytes(data), header)


def test_an_unterminated_varint_is_corrupt_not_an_index_error() -> None:
    """The cleaner's walk stops at Kafka's 10-byte varlong limit (and at the buffer's end) with a
    CorruptRecordError, which marks the partition uncleanable, instead of reading on."""
    from ads_broker.log.cleaner_io import records_in

    data = bytearray(build_batch([Record(-1, 1, b"k", b"v")]))
    header = read_header(data)
    data[61:] = b"\xff" * (len(data) - 61)  # the first record's length never ends
    with pytest.raises(CorruptRecordError, match="varint longer than 10 bytes"):
        list(records_in(data, 0, header))
    data[61:] = b"\x80" * 3  # ...nor does the buffer hold its end
    with pytest.raises(CorruptRecordError, match="varint"):
        list(records_in(data, 0, header))


def test_the_cleaner_scan_refuses_a_batch_whose_crc_does_not_match(tmp_path: Path) -> None:
    """A flipped bit in a record is caught before the cleaner reads a key from it, in the read
    buffer and when the batch is larger than the buffer and streamed."""
    from ads_broker.log.cleaner_io import scan_batches

    good = build_batch([Record(-1, 1, b"k%d" % i, b"v" * 200) for i in range(10)])
    bad = bytearray(good)
    bad[100] ^= 0x01
    path = tmp_path / "segment"
    path.write_bytes(good + bytes(bad))
    fd = os.open(path, os.O_RDONLY)
    try:
        for buffer_size in (1 << 16, 64):  # whole batches in the buffer; batches streamed through it
            scan = scan_batches(fd, 0, 2 * len(good), bytearray(buffer_size))
            assert next(scan)[0] == 0
            with pytest.raises(CorruptRecordError, match=f"batch at position {len(good)} .* fails its CRC-32C check"):
                next(scan)
    finally:
        os.close(fd)
