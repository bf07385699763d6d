"""`ads-broker` admin commands against a running broker, as an operator runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from ads_broker.embedded import BrokerProcess
from tests.kafka_helpers import produce_all


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ads_broker", *args], capture_output=True, text=True, timeout=120)


def test_topics_and_groups_commands(ads_broker: BrokerProcess, topic_name: str) -> None:
    b = ["-b", ads_broker.bootstrap]
    created = cli("topics", "create", topic_name, *b, "--partitions", "3", "--config", "retention.ms=123456")
    assert created.returncode == 0, created.stderr
    assert f"Created topic {topic_name} with 3 partition(s)." in created.stdout
    assert topic_name in cli("topics", "list", *b).stdout.split()
    produce_all(ads_broker.bootstrap, topic_name, [(None, b"x", 1)] * 4)
    described = cli("topics", "describe", topic_name, *b)
    assert described.returncode == 0, described.stderr
    assert "PartitionCount: 3" in described.stdout
    assert "Partition: 1\tLeader: 0\tReplicas: [0]\tIsr: [0]\tLogStartOffset: 0\tHighWatermark: 4" in described.stdout
    assert "retention.ms=123456  (set on the topic)" in described.stdout

    again = cli("topics", "create", topic_name, *b)
    assert again.returncode == 1 and "already exists" in again.stderr

    c = Consumer({"bootstrap.servers": ads_broker.bootstrap, "group.id": "cli-group", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic_name, 1, 3)], asynchronous=False)
    c.close()
    assert "cli-group" in cli("groups", "list", *b).stdout
    group = cli("groups", "describe", "cli-group", *b)
    assert group.returncode == 0, group.stderr
    assert f"{topic_name}-1\tcommitted: 3" in group.stdout

    deleted = cli("topics", "delete", topic_name, *b)
    assert deleted.returncode == 0 and f"Deleted topic {topic_name}." in deleted.stdout
    missing = cli("topics", "describe", topic_name, *b)
    assert missing.returncode == 1 and "error:" in missing.stderr


def test_dump_log_decodes_a_segment(ads_broker: BrokerProcess, tmp_path: Path, topic_name: str) -> None:
    produce_all(ads_broker.bootstrap, topic_name, [(b"key-1", b"payload-1", 0), (b"key-2", b"payload-2", 0)])
    segment = tmp_path / "broker-data" / f"{topic_name}-0" / ("0" * 20 + ".log")
    out = cli("dump-log", str(segment))
    assert out.returncode == 0, out.stderr
    assert "baseOffset: 0" in out.stdout and "payload-1" in out.stdout and "key-2" in out.stdout
    bad = cli("dump-log", str(tmp_path / "nope.log"))
    assert bad.returncode == 1 and "is not a file" in bad.stderr


def test_serve_refuses_bad_config_with_a_clear_message(tmp_path: Path) -> None:
    out = cli("serve", "--data-dir", str(tmp_path / "d"), "--override", "log.segment.bytes=tiny")
    assert out.returncode == 1
    assert "log.segment.bytes='tiny' is invalid" in out.stderr
    out = cli("serve", "--data-dir", str(tmp_path / "d"), "--override", "no.such.setting=1")
    assert out.returncode == 1 and "unknown broker config 'no.such.setting'" in out.stderr


def test_listeners_from_the_config_file_are_used(tmp_path: Path) -> None:
    from ads_broker.embedded import BrokerProcess, free_port

    port = free_port()
    props = tmp_path / "server.properties"
    props.write_text(f"listeners=127.0.0.1:{port}\nnum.partitions=2\n")
    argv = [sys.executable, "-m", "ads_broker", "serve", "--data-dir", str(tmp_path / "d"), "--config", str(props)]
    with BrokerProcess(argv, port, log_path=tmp_path / "broker.log") as broker:
        produce_all(broker.bootstrap, "auto", [(None, b"x", None)])
        assert f'"listen": "127.0.0.1:{port}"' in (tmp_path / "broker.log").read_text()


def test_bad_advertised_listener_is_a_clear_error(tmp_path: Path) -> None:
    out = cli("serve", "--data-dir", str(tmp_path / "d"), "--advertised-listener", "nonsense")
    assert out.returncode == 1
    assert "advertised.listeners='nonsense' is invalid: expected HOST:PORT" in out.stderr
    assert "Traceback" not in out.stderr
