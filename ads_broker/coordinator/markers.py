"""Transaction markers in cluster mode: each goes to its partition's leader (Kafka's
``TransactionMarkerChannelManager`` and the WriteTxnMarkers API).

:func:`write_marker` is the leader's side (used for this broker's own partitions and by the
WriteTxnMarkers handler): append the control batch as the coordinator's
(:data:`AppendOrigin.COORDINATOR`: only where this broker leads), wait until the ISR has it
(acks=all), and only then resolve the pending offsets of a ``__consumer_offsets`` partition.
:class:`TxnMarkerSender` is the coordinator's side: it asks the cluster's metadata who leads each
partition and writes locally or sends WriteTxnMarkers to that broker. Failed partitions are
returned so the coordinator retries them; the transaction stays in Prepare* until all succeed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog
from kafka.protocol.producer.transaction import WriteTxnMarkersRequest

from ads_broker.coordinator.offsets import OFFSETS_TOPIC, OffsetManager
from ads_broker.errors import (
    INVALID_PRODUCER_EPOCH,
    LEADER_NOT_AVAILABLE,
    NONE,
    PRODUCER_FENCED,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ads_broker.exceptions import BrokerError
from ads_broker.replication.replica_manager import AppendOrigin, EndTxnMarker, ReplicaManager

if TYPE_CHECKING:
    from ads_broker.cluster.node import ClusterNode

log = structlog.get_logger("ads_broker.transaction")

WRITE_TXN_MARKERS_VERSION = 1
#: Answers that end a marker's delivery although it was not written: the partition is gone, or a
#: newer epoch of the producer already wrote there (Kafka logs and drops those too).
FINAL_ERRORS = frozenset({UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH, PRODUCER_FENCED})


async def write_marker(replicas: ReplicaManager, offsets: OffsetManager, marker: EndTxnMarker, topic: str,
                       index: int, timeout_ms: int) -> int:
    """Write ``marker`` to ``topic``-``index`` as its leader and wait for the ISR; the error code.

    Kafka appends markers with acks=all, so an ISR below ``min.insync.replicas`` is
    NOT_ENOUGH_REPLICAS before anything is written (the coordinator retries): otherwise the marker
    would sit in the log unacknowledged and the retry would write a second one."""
    try:
        partition = replicas.get_partition(topic, index)
        partition.check_leader()
        partition.check_min_isr(-1)
        info = replicas.append_records(partition, marker, AppendOrigin.COORDINATOR)
        await replicas.wait_for_high_watermark(partition, info.last_offset + 1, timeout_ms)
    except BrokerError as e:
        return e.error_code
    if topic == OFFSETS_TOPIC:
        offsets.complete_transaction(marker.producer_id, marker.producer_epoch, index, marker.commit)
    return NONE


def marker_request(marker: EndTxnMarker, partitions: Iterable[tuple[str, int]]) -> Any:
    by_topic: dict[str, list[int]] = {}
    for topic, index in partitions:
        by_topic.setdefault(topic, []).append(index)
    request_marker: Any = WriteTxnMarkersRequest.WritableTxnMarker
    marker_topic: Any = request_marker.WritableTxnMarkerTopic
    return WriteTxnMarkersRequest(markers=[request_marker(
        producer_id=marker.producer_id, producer_epoch=marker.producer_epoch, transaction_result=marker.commit,
        topics=[marker_topic(name=t, partition_indexes=p) for t, p in sorted(by_topic.items())],
        coordinator_epoch=marker.coordinator_epoch)])


class TxnMarkerSender:
    """The coordinator's side (see the module docstring)."""

    def __init__(self, replicas: ReplicaManager, offsets: OffsetManager, cluster: ClusterNode,
                 timeout_ms: int) -> None:
        self.replicas = replicas
        self.offsets = offsets
        self.cluster = cluster
        self.timeout_ms = timeout_ms

    async def send(self, marker: EndTxnMarker, partitions: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Write ``marker`` to every partition's leader; the partitions still to retry."""
        snapshot = await self.cluster.snapshot(sorted({t for t, _ in partitions}))
        if not snapshot.complete or snapshot.stale:  # a stale answer may lack a live topic: retry
            return partitions
        failed: list[tuple[str, int]] = []
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for topic, index in partitions:
            view = snapshot.topics.get(topic)
            if view is None or index >= len(view.partitions):
                log.warning("transaction partition no longer exists; skipping its marker", topic=topic,
                            partition=index, producer_id=marker.producer_id)
                continue
            leader = view.partitions[index].leader
            if leader < 0:
                failed.append((topic, index))
            else:
                by_leader.setdefault(leader, []).append((topic, index))
        for leader, tps in sorted(by_leader.items()):
            codes = await self._send_to(leader, marker, tps)
            for tp in tps:
                code = codes.get(tp, LEADER_NOT_AVAILABLE)
                if code in FINAL_ERRORS:
                    log.warning("transaction marker refused", topic=tp[0], partition=tp[1], error_code=code,
                                producer_id=marker.producer_id, leader=leader)
                elif code != NONE:
                    failed.append(tp)
        return failed

    async def _send_to(self, leader: int, marker: EndTxnMarker, tps: list[tuple[str, int]]
                       ) -> dict[tuple[str, int], int]:
        if leader == self.cluster.broker_id:  # appended in order, ISR waits together (as WriteTxnMarkers)
            codes = await asyncio.gather(*(write_marker(self.replicas, self.offsets, marker, t, p, self.timeout_ms)
                                           for t, p in tps))
            return dict(zip(tps, codes, strict=True))
        address = await self.cluster.broker_address(leader)
        if address is None:
            return {}
        try:
            connection = await self.cluster.connect(address[0], address[1], f"txn-markers-{self.cluster.broker_id}")
        except (OSError, TimeoutError, EOFError, ConnectionError) as e:
            log.info("cannot reach a partition leader for transaction markers", leader=leader, error=repr(e))
            return {}
        except BrokerError as e:  # the inter-broker login was refused (SASL), or TLS is misconfigured
            log.warning("cannot log in to a partition leader for transaction markers", leader=leader, error=str(e))
            return {}
        try:
            response = await connection.request(marker_request(marker, tps), WRITE_TXN_MARKERS_VERSION,
                                                self.timeout_ms / 1000 + 5)
        except (OSError, TimeoutError, ConnectionError) as e:
            log.info("WriteTxnMarkers failed", leader=leader, error=repr(e))
            return {}
        finally:
            connection.close()
        return {(t.name, p.partition_index): p.error_code
                for m in response.markers for t in m.topics for p in t.partitions}
