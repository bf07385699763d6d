"""A broker's logs are never deleted because the ZooKeeper it starts against does not know them
(review s12, H1): a data dir keeps its cluster and broker id in ``meta.properties`` and a start
against an empty ZooKeeper, another cluster id or another broker id is refused; topics a ZooKeeper
with the right cluster id does not give the broker are renamed ``<topic>-<p>.<uuid>-stray``, kept.

Real ZooKeeper and ads-broker processes; the brokers are stopped and killed by PID."""

from __future__ import annotations

import contextlib
import re
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.embedded import BrokerProcess, ads_broker_process
from ads_broker.exceptions import BrokerError
from tests.integration.cluster.conftest import BrokerCluster, wait_until

RECORDS = 20
STRAY = re.compile(r"^precious-0\.[0-9a-f]{32}-stray$")


def _acknowledged_topic(brokers: BrokerCluster) -> None:
    """Broker 1 alone: topic ``precious`` with RECORDS records acknowledged with acks=all."""
    brokers.start(1)
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: admin.list_topics(timeout=10).controller_id == 1, "broker 1 registered and controller",
               timeout_s=120)
    admin.create_topics([NewTopic("precious", 1, 1)])["precious"].result(120)
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "enable.idempotence": True})
    acked: list[object] = []
    for i in range(RECORDS):
        producer.produce("precious", str(i).encode(), on_delivery=lambda e, m: e is None and acked.append(m))
    producer.flush(60)
    assert len(acked) == RECORDS


def _values(bootstrap: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition("precious", 0, 0)])
    out: list[bytes] = []
    try:
        for _ in range(120):
            if len(out) >= RECORDS:
                break
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                out.append(msg.value())
    finally:
        consumer.close()
    return out


def _refused(proc: BrokerProcess, log_path: Path, message: str) -> None:
    """``proc`` exits non-zero (before or after it listens), its log saying ``message``."""
    with contextlib.suppress(BrokerError):  # it may exit before it listens
        proc.start()
    assert proc.proc is not None
    wait_until(lambda: proc.proc is not None and proc.proc.poll() is not None, "the refused broker to exit",
               timeout_s=90)
    assert proc.proc.returncode != 0
    assert message in log_path.read_text(errors="replace")


def _segment_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.log"))


@pytest.mark.parametrize("has_meta", [True, False], ids=["meta.properties", "data-dir-from-before-meta.properties"])
def test_broker_started_on_an_empty_chroot_is_refused_and_keeps_its_data(
        zk_server: ZooKeeperServer, tmp_path: Path, has_meta: bool) -> None:
    """Also for a data dir without meta.properties that holds topics (every data dir written before
    it existed, at its first start after the upgrade: review s12-2, M2): it belongs to the
    configured cluster, and an empty ZooKeeper is refused the same way."""
    brokers = BrokerCluster(zk_server.connect_string(f"t-{uuid.uuid4().hex[:12]}"), tmp_path)
    try:
        _acknowledged_topic(brokers)
        brokers.procs[1].stop()
        if not has_meta:
            (brokers.data_dir(1) / "meta.properties").unlink()

        # The same data dir and cluster.id against a chroot with nothing in it (a typo, a reinstall).
        empty = f"t-{uuid.uuid4().hex[:12]}"
        log_path = tmp_path / "wrong.log"
        wrong = ads_broker_process(brokers.data_dir(1), log_path=log_path, config={
            "broker.id": "1", "cluster.id": brokers.cluster_id, "zookeeper.connect": zk_server.connect_string(empty)})
        with contextlib.suppress(BrokerError):  # it may exit before it listens
            wrong.start()
        assert wrong.proc is not None
        wait_until(lambda: (wrong.proc is not None and wrong.proc.poll() is not None)
                   or "ZooKeeper does not have" in log_path.read_text(errors="replace"),
                   "the broker to stop, or to compare its topics with the empty ZooKeeper", timeout_s=90)
        wrong.stop()
        assert (brokers.data_dir(1) / "precious-0").is_dir(), "the acknowledged records' directory is gone"
        assert wrong.proc.returncode != 0
        assert "has no cluster id (/cluster/id), but this broker's data dir belongs to cluster" in log_path.read_text(
            errors="replace")
        zk = KafkaZkClient(zk_server.connect_string(empty)).start()
        try:
            assert zk.get_cluster_id() is None, "the refused broker must not claim the empty ZooKeeper"
        finally:
            zk.close()
        assert (brokers.data_dir(1) / "meta.properties").exists() == has_meta  # the refused start wrote none

        # Back on the right chroot: every acknowledged record is there.
        brokers.start(1)
        assert _values(brokers.bootstrap) == [str(i).encode() for i in range(RECORDS)]
        meta = (brokers.data_dir(1) / "meta.properties").read_text()
        assert f"cluster.id={brokers.cluster_id}\n" in meta and "broker.id=1\n" in meta and "version=0\n" in meta
    finally:
        brokers.stop_all()


def test_topic_unknown_to_a_zookeeper_of_the_same_cluster_is_quarantined_not_deleted(
        zk_server: ZooKeeperServer, tmp_path: Path) -> None:
    brokers = BrokerCluster(zk_server.connect_string(f"t-{uuid.uuid4().hex[:12]}"), tmp_path)
    try:
        _acknowledged_topic(brokers)
        brokers.procs[1].stop()
        held = _segment_bytes(brokers.data_dir(1) / "precious-0")
        assert held > 0

        # A ZooKeeper restored from a backup older than the topic: its /cluster/id (the same znode,
        # created at the same zxid, as a restore keeps it), no topic. Played by removing the topic's
        # znodes by hand from this cluster's own chroot.
        restored = brokers.zk_connect
        zk = KafkaZkClient(restored).start()
        try:
            zk.client.delete("/brokers/topics/precious", recursive=True)
            zk.client.delete("/config/topics/precious", recursive=True)
        finally:
            zk.close()
        old = BrokerCluster(restored, tmp_path / "restored")
        old.cluster_id = brokers.cluster_id
        old.procs[1] = ads_broker_process(brokers.data_dir(1), log_path=tmp_path / "restored.log", config={
            "broker.id": "1", "cluster.id": brokers.cluster_id, "zookeeper.connect": restored})
        old.procs[1].start()
        try:
            wait_until(lambda: any(m in (tmp_path / "restored.log").read_text(errors="replace")
                                   for m in ("stray local topic", "deleting a local topic")),
                       "the start-up comparison with ZooKeeper", timeout_s=90)
            left = sorted(p.name for p in brokers.data_dir(1).iterdir() if p.name.startswith("precious-"))
            assert len(left) == 1 and STRAY.match(left[0]), left
            assert _segment_bytes(brokers.data_dir(1) / left[0]) == held, "the stray copy holds every byte"
            admin = AdminClient({"bootstrap.servers": old.bootstrap})
            wait_until(lambda: admin.list_topics(timeout=10).controller_id == 1, "broker 1 joined", timeout_s=120)
            assert "precious" not in admin.list_topics(timeout=10).topics, "a stray log is not served"
        finally:
            old.procs[1].stop()
        # Started again: the stray directory is left alone (never loaded, never deleted).
        old.procs[1].start()
        admin = AdminClient({"bootstrap.servers": old.bootstrap})
        wait_until(lambda: admin.list_topics(timeout=10).controller_id == 1, "broker 1 joined again", timeout_s=120)
        assert (brokers.data_dir(1) / left[0]).is_dir()
        old.procs[1].stop()
    finally:
        brokers.stop_all()


def test_another_zookeeper_with_the_same_cluster_id_is_refused(zk_server: ZooKeeperServer, tmp_path: Path) -> None:
    """Clusters left at the default ``cluster.id`` share it: a broker pointed at another such
    cluster's ZooKeeper (a chroot typo) matched meta.properties, registered there as that cluster's
    broker (electable on its partitions whose ISR named it) and set all its own topics aside as
    stray (second review s12, H2). meta.properties now also holds the creation zxid of the
    cluster's ``/cluster/id`` (a restore from a backup keeps it, another ZooKeeper or chroot does not)."""
    brokers = BrokerCluster(zk_server.connect_string(f"t-{uuid.uuid4().hex[:12]}"), tmp_path)
    try:
        _acknowledged_topic(brokers)
        brokers.procs[1].stop()
        assert "zookeeper.cluster.id.czxid=" in (brokers.data_dir(1) / "meta.properties").read_text()

        other = zk_server.connect_string(f"t-{uuid.uuid4().hex[:12]}")
        zk = KafkaZkClient(other).start()
        try:
            assert zk.get_or_create_cluster_id(brokers.cluster_id) == brokers.cluster_id  # the same id
        finally:
            zk.close()
        log_path = tmp_path / "other.log"
        _refused(ads_broker_process(brokers.data_dir(1), log_path=log_path, config={
            "broker.id": "1", "cluster.id": brokers.cluster_id, "zookeeper.connect": other}),
            log_path, "another ZooKeeper or chroot with the same cluster.id")
        assert (brokers.data_dir(1) / "precious-0").is_dir()  # old code: renamed -stray there
        zk = KafkaZkClient(other).start()
        try:
            assert zk.client.get_children("/brokers/ids") == [], "the refused broker must not register there"
        finally:
            zk.close()

        brokers.start(1)  # its own cluster: every acknowledged record
        assert _values(brokers.bootstrap) == [str(i).encode() for i in range(RECORDS)]
    finally:
        brokers.stop_all()


def test_data_dir_of_another_broker_or_cluster_is_refused(zk_server: ZooKeeperServer, tmp_path: Path) -> None:
    brokers = BrokerCluster(zk_server.connect_string(f"t-{uuid.uuid4().hex[:12]}"), tmp_path)
    try:
        _acknowledged_topic(brokers)
        brokers.procs[1].stop()
        settings = {"cluster.id": brokers.cluster_id, "zookeeper.connect": brokers.zk_connect}

        # Broker 1's disk mounted on broker 2 (swapped disks, a changed broker.id).
        log_path = tmp_path / "as-2.log"
        _refused(ads_broker_process(brokers.data_dir(1), log_path=log_path, config={**settings, "broker.id": "2"}),
                 log_path, "Configured broker.id 2 doesn't match stored broker.id Some(1) in meta.properties")
        # The right broker id, another cluster's settings.
        log_path = tmp_path / "other-cluster.log"
        _refused(ads_broker_process(brokers.data_dir(1), log_path=log_path,
                                    config={**settings, "broker.id": "1", "cluster.id": "another"}),
                 log_path, f"The Cluster ID another doesn't match stored clusterId Some({brokers.cluster_id})")

        # An existing data dir without meta.properties (from before it existed) is adopted.
        (brokers.data_dir(1) / "meta.properties").unlink()
        brokers.start(1)
        assert _values(brokers.bootstrap) == [str(i).encode() for i in range(RECORDS)]
        assert "broker.id=1\n" in (brokers.data_dir(1) / "meta.properties").read_text()
    finally:
        brokers.stop_all()
