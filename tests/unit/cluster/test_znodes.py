"""Kafka's znode encodings (ads_broker/cluster/zookeeper.py): what Kafka's own tools read and write."""

from __future__ import annotations

import json

from ads_broker.cluster.zookeeper import BrokerRegistration, LeaderAndIsr, split_chroot


def test_partition_state_json_is_kafkas() -> None:
    kafka = b'{"controller_epoch":3,"leader":2,"version":1,"leader_epoch":7,"isr":[2,3]}'
    state = LeaderAndIsr.from_json(kafka, partition_epoch=11)
    assert state == LeaderAndIsr(leader=2, leader_epoch=7, isr=(2, 3), controller_epoch=3, partition_epoch=11)
    assert json.loads(state.to_json()) == json.loads(kafka)


def test_broker_registration_reads_a_kafka_broker_znode() -> None:
    kafka = (b'{"features":{},"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT","SSL":"SSL"},'
             b'"endpoints":["PLAINTEXT://h:9092","SSL://h:9093"],"rack":"r1","jmx_port":-1,"host":"h",'
             b'"timestamp":"1700000000000","port":9092,"version":5}')
    reg = BrokerRegistration.from_json(4, kafka)
    assert (reg.broker_id, reg.host, reg.port, reg.rack, reg.cluster_id) == (4, "h", 9092, "r1", "")
    assert reg.endpoints == ("PLAINTEXT://h:9092", "SSL://h:9093")
    ours = json.loads(BrokerRegistration(4, "h", 9092, "c1", endpoints=reg.endpoints, rack="r1",
                                         timestamp_ms=1700000000000).to_json())
    assert ours["version"] == 5 and ours["cluster_id"] == "c1"
    assert {k: v for k, v in ours.items() if k != "cluster_id"} == {
        **json.loads(kafka), "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"}}


def test_split_chroot() -> None:
    assert split_chroot("127.0.0.1:2181/ads") == ("127.0.0.1:2181", "/ads")
    assert split_chroot("a:1,b:2/x/y/") == ("a:1,b:2", "/x/y")
    assert split_chroot("a:1") == ("a:1", "")
    assert split_chroot("a:1/") == ("a:1", "")
