"""The group and transaction coordinators against clients that send what no Kafka client does.

Each case is answered with the code Kafka's coordinators answer, and nothing is written:

- an empty ``transactional.id`` in InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn
  is INVALID_REQUEST (Kafka's TransactionCoordinator), not a state or mapping error;
- AddPartitionsToTxn naming a partition of an internal topic is INVALID_TOPIC_EXCEPTION: its
  commit would have written a COMMIT marker into ``__transaction_state`` (Kafka relies on ACLs
  there, which this broker does not have yet).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
)

from ads_broker.embedded import ads_broker_process
from tests.integration.broker.adminclient import (
    OFFSETS_TOPIC,
    TXN_TOPIC,
    create_topics,
)
from tests.integration.broker.rawclient import RawClient

OFFSET_METADATA_TOO_LARGE = 12
INVALID_TOPIC_EXCEPTION = 17
INVALID_COMMIT_OFFSET_SIZE = 28
INVALID_REQUEST = 42
OPERATION_NOT_ATTEMPTED = 55


def _init(client: RawClient, txn_id: str) -> Any:
    return client.request(InitProducerIdRequest(transactional_id=txn_id, transaction_timeout_ms=60000,
                                                producer_id=-1, producer_epoch=-1), 4)


def _add(client: RawClient, txn_id: str, pid: int, epoch: int, partitions: dict[str, list[int]]) -> dict[str, int]:
    resp = client.request(AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=p)
                             for t, p in partitions.items()]), 3)
    return {f"{t.name}-{p.partition_index}": p.partition_error_code
            for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition}


def _end(client: RawClient, txn_id: str, pid: int, epoch: int, commit: bool = True) -> int:
    return int(client.request(EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                                            committed=commit), 3).error_code)


def test_an_empty_transactional_id_is_an_invalid_request(ads_broker: Any, topic_name: str) -> None:
    with RawClient(ads_broker.bootstrap) as client:
        assert create_topics(client, {topic_name: 1})[topic_name] == 0
        assert _init(client, "").error_code == INVALID_REQUEST
        assert _add(client, "", 1, 0, {topic_name: [0]}) == {f"{topic_name}-0": INVALID_REQUEST}
        assert client.request(AddOffsetsToTxnRequest(transactional_id="", producer_id=1, producer_epoch=0,
                                                     group_id="g"), 3).error_code == INVALID_REQUEST
        assert _end(client, "", 1, 0) == INVALID_REQUEST


def test_internal_partitions_cannot_join_a_transaction(tmp_path: Path, topic_name: str) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "broker.log"
    txn_id = f"tx-{topic_name}"
    with ads_broker_process(data_dir, log_path=log_path) as broker, RawClient(broker.bootstrap) as client:
        assert create_topics(client, {topic_name: 1})[topic_name] == 0
        init = _init(client, txn_id)
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        for internal in (TXN_TOPIC, OFFSETS_TOPIC):
            assert _add(client, txn_id, pid, epoch, {internal: [0], topic_name: [0]}) == {
                f"{internal}-0": INVALID_TOPIC_EXCEPTION, f"{topic_name}-0": OPERATION_NOT_ATTEMPTED}
        # The same transaction goes on with its ordinary partition, and commits.
        assert _add(client, txn_id, pid, epoch, {topic_name: [0]}) == {f"{topic_name}-0": 0}
        assert _end(client, txn_id, pid, epoch) == 0
    with ads_broker_process(data_dir, log_path=log_path):
        pass
    assert "undecodable records skipped" not in log_path.read_text(encoding="utf-8", errors="replace")
