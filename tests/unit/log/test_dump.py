"""dump-log output on real segment, index and snapshot files."""

from __future__ import annotations

import struct
from pathlib import Path

from ads_broker.log.config import LogConfig
from ads_broker.log.dump import dump_log
from ads_broker.log.records import Record, build_batch

from .helpers import BASE_TS, batch, open_log

SEGMENT = "00000000000000000000"


def test_dump_log_prints_batches_records_markers_and_a_torn_tail(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", LogConfig(index_interval_bytes=0))
    log.append_as_leader(batch(2, ts=BASE_TS, pid=8, epoch=1, seq=0), 3)
    marker = build_batch(
        [Record(-1, BASE_TS, struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 6))],
        producer_id=8,
        producer_epoch=1,
        is_transactional=True,
        is_control=True,
    )
    log.append_internal(marker, 3)
    log.close()
    segment = tmp_path / "p" / f"{SEGMENT}.log"
    with open(segment, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00\x01\x00torn")
    lines = list(dump_log(segment))
    assert lines[0] == f"Dumping {segment}" and lines[1] == "Log starting offset: 0"
    assert lines[2].startswith("baseOffset: 0 lastOffset: 1 count: 2 baseSequence: 0 lastSequence: 1 producerId: 8")
    assert "partitionLeaderEpoch: 3" in lines[2] and "position: 0" in lines[2] and "isvalid: true" in lines[2]
    assert f"CreateTime: {BASE_TS + 1}" in lines[2] and "compresscodec: none" in lines[2]
    assert lines[3] == (
        f"| offset: 0 CreateTime: {BASE_TS} keySize: 2 valueSize: 10 sequence: 0 headerKeys: [] "
        "key: k0 payload: vvvvvvvvvv"
    )
    assert lines[4].startswith("| offset: 1 ") and lines[4].endswith("key: k1 payload: vvvvvvvvvv")
    assert "isControl: true" in lines[5] and "baseOffset: 2" in lines[5]
    assert lines[6].endswith("endTxnMarker: COMMIT coordinatorEpoch: 6")
    assert lines[7].startswith("Found 16 trailing bytes at position")
    index_lines = list(dump_log(tmp_path / "p" / f"{SEGMENT}.index"))
    # the first batch of a segment is never indexed (Kafka: position 0 is implied)
    marker_position = lines[5].split("position: ")[1].split()[0]
    assert index_lines[1:] == [f"offset: 2 position: {marker_position}"]
    snapshot_lines = list(dump_log(next((tmp_path / "p").glob("*.snapshot"))))
    assert "producerId: 8 producerEpoch: 1 firstSequence: 0 lastSequence: 1" in snapshot_lines[1]


def test_dump_log_flags_a_bad_crc(tmp_path: Path) -> None:
    data = bytearray(batch(1))
    data[-1] ^= 1
    path = tmp_path / f"{SEGMENT}.log"
    path.write_bytes(bytes(data))
    lines = list(dump_log(path))
    assert "isvalid: false" in lines[2] and len(lines) == 3
