"""compression.type at the log: a client batch is stored with the topic's codec (Kafka's
LogValidator), its records, producer fields and sequence kept, so idempotent retries of a
recompressed batch are still recognised as duplicates."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ads_broker.exceptions import InvalidConfigurationError, RecordTooLargeError
from ads_broker.log.config import LogConfig
from ads_broker.log.records import Record, build_batch, decode_batch, iter_batches, read_header
from tests.unit.log.helpers import BASE_TS, Clock, open_log, read_all

CODECS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def client_batch(codec: int, *, seq: int = 0, transactional: bool = False) -> bytes:
    records = [Record(-1, BASE_TS + i, b"k%d" % i, b"value-%d-" % i * 40, [("h", b"%d" % i), ("none", None)])
               for i in range(12)]
    return build_batch(records, producer_id=7, producer_epoch=3, base_sequence=seq, is_transactional=transactional,
                       compression=codec)


@pytest.mark.parametrize("target", list(CODECS))
@pytest.mark.parametrize("source", [0, 1, 2, 3, 4])
def test_a_batch_is_stored_with_the_topic_codec(tmp_path: Path, target: str, source: int) -> None:
    log = open_log(tmp_path / "p", LogConfig(compression_type=target), clock=Clock(BASE_TS + 100))
    sent = client_batch(source, seq=5)
    info = log.append_as_leader(sent, 9)
    assert (info.first_offset, info.last_offset, info.duplicate) == (0, 11, False)
    [(_, stored)] = list(iter_batches(read_all(log), validate=True))  # CRC checked
    original = read_header(sent)
    assert stored.compression == CODECS[target]
    assert (stored.producer_id, stored.producer_epoch, stored.base_sequence, stored.last_offset_delta,
            stored.records_count, stored.partition_leader_epoch) == (7, 3, 5, 11, 12, 9)
    assert (stored.base_timestamp, stored.max_timestamp) == (original.base_timestamp, original.max_timestamp)
    assert decode_batch(read_all(log))[1] == decode_batch(sent)[1]


def test_producer_keeps_the_producers_codec_byte_for_byte(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", LogConfig(compression_type="producer"), clock=Clock(BASE_TS + 100))
    sent = client_batch(3)
    log.append_as_leader(sent, 0)
    assert read_all(log)[21:] == sent[21:]  # everything after baseOffset, length, epoch, magic, crc


def test_a_retry_of_a_recompressed_batch_is_a_duplicate(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", LogConfig(compression_type="zstd"), clock=Clock(BASE_TS + 100))
    log.append_as_leader(client_batch(0, seq=0, transactional=False), 0)
    again = log.append_as_leader(client_batch(0, seq=0), 0)
    assert (again.first_offset, again.last_offset, again.duplicate) == (0, 11, True)
    assert log.log_end_offset == 12


def test_the_transactional_flag_survives_recompression(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", LogConfig(compression_type="gzip"), clock=Clock(BASE_TS + 100))
    log.append_as_leader(client_batch(2, transactional=True), 0)
    stored = read_header(read_all(log))
    assert stored.is_transactional and stored.compression == 1
    assert log.first_unstable_offset() == 0


def test_a_batch_larger_than_max_message_bytes_after_recompression_is_refused(tmp_path: Path) -> None:
    # Random bytes do not compress: gzip adds its framing to a batch exactly at the limit.
    records = [Record(-1, BASE_TS, b"k", random.Random(14).randbytes(800))]
    sent = build_batch(records, compression=0)
    log = open_log(tmp_path / "p", LogConfig(compression_type="gzip", max_message_bytes=len(sent)),
                   clock=Clock(BASE_TS + 100))
    with pytest.raises(RecordTooLargeError, match=r"after recompression to gzip"):
        log.append_as_leader(sent, 0)
    assert log.log_end_offset == 0


def test_compression_type_values_are_kafkas() -> None:
    assert LogConfig.from_topic_config({"compression.type": "lz4"}).target_codec == 3
    assert LogConfig.from_topic_config({}).target_codec is None
    with pytest.raises(InvalidConfigurationError, match=r"compression\.type"):
        LogConfig.from_topic_config({"compression.type": "LZ4"})
