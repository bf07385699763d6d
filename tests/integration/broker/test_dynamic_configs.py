"""Dynamic broker configs (IncrementalAlterConfigs/AlterConfigs on the BROKER resource): the log.*
defaults of topic configs changed at run time, applied to existing topics at once, described with
Kafka's sources and synonyms, and kept across a restart. Real ads-broker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kafka.protocol.admin import AlterConfigsRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_topic_configs import (
    BROKER,
    DELETE,
    INVALID_CONFIG,
    INVALID_REQUEST,
    MESSAGE_TOO_LARGE,
    SET,
    create,
    describe,
    incremental,
    produce,
    synonyms_of,
)

pytestmark = pytest.mark.timeout(120)

DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, DEFAULT_CONFIG = 2, 3, 5


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def broker(data_dir: Path) -> Iterator[BrokerProcess]:
    with ads_broker_process(data_dir, log_path=data_dir.parent / "broker.log") as proc:
        yield proc


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[RawClient]:
    with RawClient(broker.bootstrap, client_id="dynamic-configs") as c:
        yield c


def legacy_broker_alter(c: RawClient, name: str, configs: dict[str, str]) -> tuple[int, str | None]:
    R = AlterConfigsRequest.AlterConfigsResource
    req = AlterConfigsRequest(resources=[R(resource_type=BROKER, resource_name=name, configs=[
        R.AlterableConfig(name=k, value=v) for k, v in configs.items()])], validate_only=False)
    [result] = c.request(req, 2).responses
    return result.error_code, result.error_message


def test_a_dynamic_default_applies_to_existing_topics_and_the_broker_own_wins(client: RawClient) -> None:
    create(client, "plain")
    create(client, "own", {"max.message.bytes": "10000"})
    big = b"x" * 5000
    assert produce(client, "plain", big) == 0

    # the cluster-wide default: every topic without its own value follows at once
    assert incremental(client, "", [("message.max.bytes", SET, "2000")], resource_type=BROKER) == (0, None)
    assert produce(client, "plain", big) == MESSAGE_TOO_LARGE
    assert produce(client, "own", big) == 0  # a topic's own config still wins
    entry = describe(client, "plain", ["max.message.bytes"])["max.message.bytes"]
    assert (entry.value, entry.config_source) == ("2000", DYNAMIC_DEFAULT_BROKER_CONFIG)

    # this broker's own dynamic config wins over the cluster-wide one
    assert incremental(client, "0", [("message.max.bytes", SET, "8000")], resource_type=BROKER) == (0, None)
    assert produce(client, "plain", big) == 0
    entry = describe(client, "0", ["message.max.bytes"], resource_type=BROKER)["message.max.bytes"]
    assert (entry.value, entry.config_source, entry.read_only) == ("8000", DYNAMIC_BROKER_CONFIG, False)
    assert synonyms_of(entry) == [("message.max.bytes", "8000", DYNAMIC_BROKER_CONFIG),
                                  ("message.max.bytes", "2000", DYNAMIC_DEFAULT_BROKER_CONFIG),
                                  ("message.max.bytes", "1048588", DEFAULT_CONFIG)]
    # the empty name describes the cluster-wide dynamic defaults only
    defaults = describe(client, "", resource_type=BROKER)
    assert {k: (e.value, e.config_source) for k, e in defaults.items()} == {
        "message.max.bytes": ("2000", DYNAMIC_DEFAULT_BROKER_CONFIG)}

    # DELETE returns to the next layer
    assert incremental(client, "0", [("message.max.bytes", DELETE, None)], resource_type=BROKER) == (0, None)
    assert produce(client, "plain", big) == MESSAGE_TOO_LARGE
    assert incremental(client, "", [("message.max.bytes", DELETE, None)], resource_type=BROKER) == (0, None)
    assert produce(client, "plain", big) == 0
    assert describe(client, "", resource_type=BROKER) == {}


def test_dynamic_configs_survive_a_restart(broker: BrokerProcess, data_dir: Path) -> None:
    with RawClient(broker.bootstrap) as c:
        create(c, "t")
        assert incremental(c, "", [("log.retention.ms", SET, "3600000"), ("log.cleanup.policy", SET, "compact")],
                           resource_type=BROKER) == (0, None)
    broker.stop()
    broker.start()
    with RawClient(broker.bootstrap) as c:
        configs = describe(c, "t", ["retention.ms", "cleanup.policy"])
        assert {k: (e.value, e.config_source) for k, e in configs.items()} == {
            "retention.ms": ("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG),
            "cleanup.policy": ("compact", DYNAMIC_DEFAULT_BROKER_CONFIG)}
        assert produce(c, "t", b"v", key=None) != 0  # a compacted topic refuses keyless records: in force


def test_bad_requests_change_nothing(client: RawClient, data_dir: Path) -> None:
    create(client, "t")
    code, message = incremental(client, "", [("auto.create.topics.enable", SET, "false")], resource_type=BROKER)
    assert code == INVALID_REQUEST and message and message.startswith(
        "Cannot update these configs dynamically: Set(auto.create.topics.enable)")
    code, message = incremental(client, "", [("log.retention.nonsense", SET, "1")], resource_type=BROKER)
    assert code == INVALID_CONFIG and message and "log.retention.nonsense" in message
    code, message = incremental(client, "", [("log.segment.bytes", SET, "huge")], resource_type=BROKER)
    assert code == INVALID_CONFIG and message and "log.segment.bytes" in message and "huge" in message
    code, message = incremental(client, "", [("log.segment.bytes", SET, "10")], resource_type=BROKER)
    assert code == INVALID_CONFIG and message and "minimum" in message
    code, message = incremental(client, "7", [("log.segment.bytes", SET, "100000")], resource_type=BROKER)
    assert code == INVALID_REQUEST and message and "Unexpected broker id" in message
    # validate_only: accepted, not applied
    assert incremental(client, "", [("message.max.bytes", SET, "2000")], resource_type=BROKER,
                       validate_only=True) == (0, None)
    assert describe(client, "", resource_type=BROKER) == {}
    assert produce(client, "t", b"x" * 5000) == 0
    assert not (data_dir / "dynamic-broker-configs.json").exists()


def test_legacy_alter_configs_replaces_the_whole_dynamic_set(client: RawClient) -> None:
    assert incremental(client, "", [("message.max.bytes", SET, "2000"), ("log.retention.ms", SET, "60000")],
                       resource_type=BROKER) == (0, None)
    assert legacy_broker_alter(client, "", {"log.retention.ms": "120000"}) == (0, None)
    defaults = describe(client, "", resource_type=BROKER)
    assert {k: e.value for k, e in defaults.items()} == {"log.retention.ms": "120000"}


def test_confluent_kafka_admin_alters_a_broker_default(broker: BrokerProcess) -> None:
    """The path operators use (kafka-configs --entity-type brokers --entity-default, librdkafka)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
        ConfigEntry("log.retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(30)
    described = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")])
    [configs] = [f.result(30) for f in described.values()]
    entry = configs["log.retention.ms"]
    assert entry.value == "7200000" and not entry.is_read_only
    assert entry.source == DYNAMIC_BROKER_CONFIG
