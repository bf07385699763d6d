"""Which answers the server encodes off the event loop (``codec.encodes_slowly``; hostile review
F3 residual, issue 12)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import ProduceResponse

from ads_broker.protocol.codec import OFF_LOOP_RECORD_ERRORS, encodes_slowly

Partition = ProduceResponse.TopicProduceResponse.PartitionProduceResponse


def produce_answer(partitions: int, errors_each: int) -> Any:
    return ProduceResponse(throttle_time_ms=0, node_endpoints=[], responses=[
        ProduceResponse.TopicProduceResponse(name="t", partition_responses=[
            Partition(index=p, error_code=32, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                      error_message="One or more records have been rejected due to invalid timestamp",
                      record_errors=[(i, f"Timestamp of message with offset {i} is out of range")
                                     for i in range(errors_each)])
            for p in range(partitions)])])


def test_only_a_produce_answer_naming_many_record_errors_is_encoded_off_the_loop() -> None:
    assert not encodes_slowly(produce_answer(2, OFF_LOOP_RECORD_ERRORS // 2))
    assert encodes_slowly(produce_answer(2, OFF_LOOP_RECORD_ERRORS // 2 + 1))
    assert not encodes_slowly(ProduceResponse(throttle_time_ms=0, node_endpoints=[], responses=[]))
