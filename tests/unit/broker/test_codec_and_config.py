"""The server-side codec helpers and the broker config loader."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse

from ads_broker.config import BrokerConfig, parse_properties, split_override
from ads_broker.coordinator.offsets import (
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    java_string_hash,
    partition_for_group,
)
from ads_broker.exceptions import ConfigError, MalformedFrameError
from ads_broker.protocol.apis import decode_request
from ads_broker.protocol.codec import SendfileSlice, encode_response, splice_records

PartitionData = FetchResponse.FetchableTopicResponse.PartitionData


def fetch_response(records: list[bytes]) -> FetchResponse:
    parts = [PartitionData(partition_index=i, error_code=0, high_watermark=5, last_stable_offset=5,
                           log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=r)
             for i, r in enumerate(records)]
    return FetchResponse(throttle_time_ms=0, error_code=0, session_id=0,
                         responses=[FetchResponse.FetchableTopicResponse(topic="t", partitions=parts)])


@settings(max_examples=60, deadline=None)
@given(payloads=st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=4),
       version=st.sampled_from([4, 7, 11, 12]))
def test_spliced_fetch_response_is_byte_identical_to_direct_encoding(tmp_path_factory: pytest.TempPathFactory,
                                                                      payloads: list[bytes], version: int) -> None:
    """Placeholders replaced by file slices give exactly the bytes of encoding the records inline."""
    path = tmp_path_factory.mktemp("splice") / "segment"
    path.write_bytes(b"".join(payloads))
    fd = os.open(path, os.O_RDONLY)
    try:
        direct = encode_response(fetch_response(payloads), version, 42)
        tokens = [b"\x00TOKEN%02d\x00" % i for i in range(len(payloads))]
        encoded = encode_response(fetch_response(tokens), version, 42)
        placeholders, pos = [], 0
        for token, payload in zip(tokens, payloads, strict=True):
            placeholders.append((token, [SendfileSlice(fd, pos, len(payload))]))
            pos += len(payload)
        flexible = FetchResponse.flexible_version_q(version)
        chunks = splice_records(encoded, placeholders, flexible)
        spliced = b"".join(c.read() if isinstance(c, SendfileSlice) else c for c in chunks)
        assert spliced == direct
    finally:
        os.close(fd)


def test_decode_request_rejects_unknown_keys_and_short_frames() -> None:
    with pytest.raises(MalformedFrameError, match="unsupported api key 999"):
        decode_request(struct.pack(">hhi", 999, 0, 1) + b"\x00\x00")
    with pytest.raises(MalformedFrameError, match="shorter than a header"):
        decode_request(b"\x00\x03")
    unsupported = decode_request(struct.pack(">hhi", 3, 99, 7) + b"\x00\x00")
    assert unsupported.body is None and unsupported.correlation_id == 7


def test_config_file_overrides_and_validation(tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    props.write_text("# comment\nnum.partitions=3\nlog.segment.bytes = 2048\n\nauto.create.topics.enable=false\n")
    cfg = BrokerConfig.load(props, {"num.partitions": "5"})
    assert cfg["num.partitions"] == 5  # the command line wins over the file
    assert cfg["log.segment.bytes"] == 2048
    assert cfg["auto.create.topics.enable"] is False
    assert cfg.topic_defaults()["segment.bytes"] == "2048"
    assert cfg["advertised.listeners"] == cfg["listeners"]
    with pytest.raises(ConfigError, match=r"unknown broker config 'num\.partition'"):
        BrokerConfig.load(None, {"num.partition": "1"})
    with pytest.raises(ConfigError, match="below the minimum 1"):
        BrokerConfig.load(None, {"num.partitions": "0"})
    with pytest.raises(ConfigError, match="expected true or false"):
        BrokerConfig.load(None, {"auto.create.topics.enable": "yes"})
    with pytest.raises(ConfigError, match=r"server.properties:1: expected key=value"):
        parse_properties("garbage line\n", "server.properties")
    with pytest.raises(ConfigError, match=r"--override expects key=value"):
        split_override("novalue")
    with pytest.raises(ConfigError, match="cannot read config file"):
        BrokerConfig.load(tmp_path / "missing.properties")


def test_offsets_topic_record_format_and_group_placement() -> None:
    key = encode_key("group-1", "events", 7)
    assert decode_key(key) == ("group-1", "events", 7)
    assert decode_value(encode_value(1234, 5, "meta", 99)) == (1234, 5, "meta", 99)
    # Java's "hello".hashCode() and Kafka's partitionFor, checked by hand against the JVM values.
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2147483648
    assert partition_for_group("polygenelubricants", 50) == 0
    assert 0 <= partition_for_group("any-group", 50) < 50
