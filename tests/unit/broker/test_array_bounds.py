"""The per-request array bound in the codec (issue 12, hole 5), on encoded request frames."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.metadata import MetadataRequest

from ads_broker.exceptions import MalformedFrameError
from ads_broker.protocol.apis import decode_request
from ads_broker.protocol.codec import ARRAY_BUDGET


def metadata_frame(n: int, version: int) -> bytes:
    req = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=f"t{i}") for i in range(n)],
                          allow_auto_topic_creation=False)
    req.API_VERSION = version
    req.with_header(correlation_id=7, client_id="unit")
    return bytes(req.encode(version=version, header=True, framed=False))


@pytest.mark.parametrize("version", [1, 9, 12])  # classic and compact (flexible) arrays
def test_arrays_over_the_budget_do_not_decode(version: int) -> None:
    saved = ARRAY_BUDGET.max_elements
    ARRAY_BUDGET.max_elements = 100
    try:
        assert len(decode_request(metadata_frame(100, version)).body.topics) == 100
        with pytest.raises(MalformedFrameError, match=r"request\.max\.array\.elements"):
            decode_request(metadata_frame(101, version))
        # The budget is per request, not cumulative.
        assert len(decode_request(metadata_frame(100, version)).body.topics) == 100
    finally:
        ARRAY_BUDGET.max_elements = saved


def test_an_array_length_beyond_the_frame_fails_before_allocating() -> None:
    frame = struct.pack(">hhih", 3, 1, 1, 1) + b"x" + struct.pack(">i", 2**31 - 1)
    with pytest.raises(MalformedFrameError, match="bytes remaining"):
        decode_request(frame)


def test_responses_decoded_in_the_same_process_are_not_counted() -> None:
    """The decoders are patched process-wide, but only a request's decode is budgeted: a broker's
    own clients (replica fetchers) and a test process's clients decode responses with any number
    of elements, and those never drain a later request's budget (before: a test process that had
    read one 90,000-topic Metadata answer failed every later client decode)."""
    from kafka.protocol.metadata import MetadataResponse
    saved = ARRAY_BUDGET.max_elements
    ARRAY_BUDGET.max_elements = 100
    try:
        response = MetadataResponse(throttle_time_ms=0, brokers=[], cluster_id="c", controller_id=0, topics=[
            MetadataResponse.MetadataResponseTopic(error_code=3, name=f"t{i}", is_internal=False, partitions=[])
            for i in range(150)])
        encoded = bytes(response.encode(version=9, header=False, framed=False))
        assert len(decode_request(metadata_frame(100, 9)).body.topics) == 100  # a request used its whole budget
        for _ in range(3):
            assert len(MetadataResponse[9].decode(memoryview(encoded)).topics) == 150
        assert len(decode_request(metadata_frame(100, 9)).body.topics) == 100
        with pytest.raises(MalformedFrameError, match=r"request\.max\.array\.elements"):
            decode_request(metadata_frame(101, 9))
    finally:
        ARRAY_BUDGET.max_elements = saved
