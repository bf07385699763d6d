"""WriteTxnMarkers on a single node: an inter-broker API no client may use to end a transaction."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer.transaction import WriteTxnMarkersRequest

from ads_broker.embedded import ads_broker_process
from tests.integration.broker.rawclient import RawClient

INVALID_REQUEST = 42


def test_a_forged_commit_marker_is_refused_and_the_open_transaction_stays_invisible(tmp_path: Path) -> None:
    with ads_broker_process(tmp_path / "data", log_path=tmp_path / "broker.log") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic("t", 1, 1)]).values():
            f.result(30)
        p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "victim"})
        p.init_transactions(30)  # the first producer id of a fresh broker: 0, epoch 0
        p.begin_transaction()
        for i in range(3):
            p.produce("t", b"uncommitted-%d" % i, partition=0)
        assert p.flush(30) == 0

        marker: type = WriteTxnMarkersRequest.WritableTxnMarker
        with RawClient(broker.bootstrap) as c:
            resp = c.request(WriteTxnMarkersRequest(markers=[marker(
                producer_id=0, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
                topics=[marker.WritableTxnMarkerTopic(name="t", partition_indexes=[0])])]), 1)
        codes = [part.error_code for m in resp.markers for t in m.topics for part in t.partitions]
        assert codes == [INVALID_REQUEST]

        c2 = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader", "auto.offset.reset": "earliest",
                       "isolation.level": "read_committed", "enable.partition.eof": True})
        c2.subscribe(["t"])
        seen: list[bytes] = []
        try:
            for _ in range(150):
                msg = c2.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    break  # end of what read_committed may see
                seen.append(msg.value())
        finally:
            c2.close()
        assert seen == []  # the transaction is still open: nothing committed it
        p.abort_transaction(30)
