"""Topic configs at run time against a real ads-broker process (issue 14): DescribeConfigs types,
sources and synonyms; AlterConfigs (33) and IncrementalAlterConfigs (44), validated with Kafka's
errors, effective at once and persisted across a restart; DescribeLogDirs (35). Every advertised
version of these APIs is sent at least once (raw requests, kafka-python's protocol classes)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreateTopicsRequest,
    DescribeConfigsRequest,
    DescribeLogDirsRequest,
    IncrementalAlterConfigsRequest,
)
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.producer import ProduceRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process
from ads_broker.log.records import Record, build_batch
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_api_versions import versions

pytestmark = pytest.mark.timeout(120)

# A static broker setting, so that sources and synonyms have all three kinds to show.
BROKER_CONFIG = {"log.retention.ms": "86400000", "offsets.topic.num.partitions": "1",
                 "transaction.state.log.num.partitions": "1"}
TOPIC, BROKER = 2, 4
TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
UNKNOWN_TOPIC_OR_PARTITION, MESSAGE_TOO_LARGE, INVALID_CONFIG, INVALID_REQUEST, INVALID_RECORD = 3, 10, 40, 42, 87


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("topic-configs") / "data"


@pytest.fixture(scope="module")
def broker(data_dir: Path) -> Iterator[BrokerProcess]:
    with ads_broker_process(data_dir, config=BROKER_CONFIG, log_path=data_dir.parent / "broker.log") as proc:
        yield proc


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[RawClient]:
    with RawClient(broker.bootstrap, client_id="topic-configs") as c:
        yield c


def create(c: RawClient, name: str, configs: dict[str, str] | None = None, partitions: int = 1) -> None:
    req = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=1, assignments=[],
        configs=[CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(name=k, value=v)
                 for k, v in (configs or {}).items()])], timeout_ms=10000, validate_only=False)
    result = c.request(req, 7).topics[0]
    assert result.error_code == 0, result.error_message


def describe(c: RawClient, name: str, keys: list[str] | None = None, *, resource_type: int = TOPIC,
             synonyms: bool = True, version: int = 4) -> dict[str, Any]:
    req = DescribeConfigsRequest(resources=[DescribeConfigsRequest.DescribeConfigsResource(
        resource_type=resource_type, resource_name=name, configuration_keys=keys)], include_synonyms=synonyms,
        include_documentation=False)
    [result] = c.request(req, version).results
    assert result.error_code == 0, result.error_message
    return {e.name: e for e in result.configs}


def synonyms_of(entry: Any) -> list[tuple[str, str | None, int]]:
    return [(s.name, s.value, s.source) for s in entry.synonyms]


def incremental(c: RawClient, name: str, ops: list[tuple[str, int, str | None]], *, resource_type: int = TOPIC,
                validate_only: bool = False, version: int = 1) -> tuple[int, str | None]:
    R = IncrementalAlterConfigsRequest.AlterConfigsResource
    req = IncrementalAlterConfigsRequest(resources=[R(resource_type=resource_type, resource_name=name, configs=[
        R.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops])], validate_only=validate_only)
    [result] = c.request(req, version).responses
    assert (result.resource_type, result.resource_name) == (resource_type, name)
    return result.error_code, result.error_message


def legacy_alter(c: RawClient, name: str, configs: dict[str, str], *, validate_only: bool = False,
                 version: int = 2) -> tuple[int, str | None]:
    R = AlterConfigsRequest.AlterConfigsResource
    req = AlterConfigsRequest(resources=[R(resource_type=TOPIC, resource_name=name, configs=[
        R.AlterableConfig(name=k, value=v) for k, v in configs.items()])], validate_only=validate_only)
    [result] = c.request(req, version).responses
    return result.error_code, result.error_message


def produce(c: RawClient, name: str, value: bytes, key: bytes | None = b"k") -> int:
    batch = build_batch([Record(offset=0, timestamp=int(time.time() * 1000), key=key, value=value, headers=[])])
    req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=name, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)])])
    return int(c.request(req, 9).responses[0].partition_responses[0].error_code)


# -- DescribeConfigs ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(DescribeConfigsRequest))
def test_describe_configs_reports_kafkas_config_types_from_v3(client: RawClient, topic_name: str,
                                                             version: int) -> None:
    create(client, topic_name)
    topic = describe(client, topic_name, version=version)
    broker = describe(client, "0", resource_type=BROKER, version=version)
    got = {k: topic[k].config_type for k in ("retention.ms", "cleanup.policy", "segment.bytes",
                                               "min.cleanable.dirty.ratio", "compression.type")}
    got |= {k: broker[k].config_type for k in ("log.retention.hours", "log.retention.ms", "auto.create.topics.enable",
                                                "authorizer.class.name", "ssl.key.password")}
    # ConfigType: BOOLEAN 1, STRING 2, INT 3, LONG 5, DOUBLE 6, LIST 7, CLASS 8, PASSWORD 9 (v3+; 0 before)
    expected = {"retention.ms": 5, "cleanup.policy": 7, "segment.bytes": 3, "min.cleanable.dirty.ratio": 6,
                "compression.type": 2, "log.retention.hours": 3, "log.retention.ms": 5,
                "auto.create.topics.enable": 1, "authorizer.class.name": 8, "ssl.key.password": 9}
    assert got == (expected if version >= 3 else dict.fromkeys(expected, 0))
    assert broker["ssl.key.password"].is_sensitive and broker["ssl.key.password"].value is None


def test_topic_config_sources_and_synonyms_as_kafka(client: RawClient, topic_name: str) -> None:
    create(client, topic_name, {"retention.ms": "3600000"})
    configs = describe(client, topic_name)
    retention, cleanup = configs["retention.ms"], configs["cleanup.policy"]
    assert (retention.value, retention.config_source) == ("3600000", TOPIC_CONFIG)
    assert synonyms_of(retention) == [("retention.ms", "3600000", TOPIC_CONFIG),
                                      ("log.retention.ms", "86400000", STATIC_BROKER_CONFIG),
                                      ("log.retention.hours", "168", DEFAULT_CONFIG)]
    assert (cleanup.value, cleanup.config_source) == ("delete", DEFAULT_CONFIG)
    assert synonyms_of(cleanup) == [("log.cleanup.policy", "delete", DEFAULT_CONFIG)]
    assert describe(client, topic_name, ["retention.ms"], synonyms=False)["retention.ms"].synonyms == []


def test_broker_retention_settings_as_kafka_describes_them(client: RawClient, topic_name: str) -> None:
    create(client, topic_name)
    topic = describe(client, topic_name, ["retention.ms"])["retention.ms"]
    # No topic override: the static log.retention.ms (it wins over log.retention.hours).
    assert (topic.value, topic.config_source) == ("86400000", STATIC_BROKER_CONFIG)
    assert synonyms_of(topic) == [("log.retention.ms", "86400000", STATIC_BROKER_CONFIG),
                                  ("log.retention.hours", "168", DEFAULT_CONFIG)]
    broker = describe(client, "0", ["log.retention.ms", "log.retention.minutes", "log.retention.hours"],
                      resource_type=BROKER)
    assert {k: (e.value, e.config_source, e.read_only) for k, e in broker.items()} == {
        # not read-only: dynamic broker configs, as in Kafka (test_dynamic_configs.py)
        "log.retention.ms": ("86400000", STATIC_BROKER_CONFIG, False),
        "log.retention.minutes": (None, DEFAULT_CONFIG, False),  # null unless set, as in Kafka
        "log.retention.hours": ("168", DEFAULT_CONFIG, False)}
    assert synonyms_of(broker["log.retention.hours"]) == [("log.retention.hours", "168", DEFAULT_CONFIG)]


@pytest.mark.parametrize("overrides", [{}, {"retention.ms": "3600000", "compression.type": "zstd"}])
def test_create_topics_reports_the_configs_describe_configs_reports(client: RawClient, topic_name: str,
                                                                    overrides: dict[str, str]) -> None:
    req = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
        name=topic_name, num_partitions=1, replication_factor=1, assignments=[],
        configs=[CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(name=k, value=v)
                 for k, v in overrides.items()])], timeout_ms=10000, validate_only=False)
    [result] = client.request(req, 7).topics
    created = {c.name: (c.value, c.config_source) for c in result.configs}
    assert created == {k: (e.value, e.config_source) for k, e in describe(client, topic_name).items()}
    assert created["retention.ms"] == (overrides.get("retention.ms", "86400000"),
                                       TOPIC_CONFIG if overrides else STATIC_BROKER_CONFIG)


def test_an_empty_key_list_describes_every_config(client: RawClient, topic_name: str) -> None:
    create(client, topic_name)
    everything = describe(client, topic_name, [])
    assert everything.keys() == describe(client, topic_name, None).keys()
    assert {"retention.ms", "cleanup.policy", "compression.type"} <= everything.keys()


def test_describe_broker_resource_names_as_kafka(client: RawClient) -> None:
    assert describe(client, "", resource_type=BROKER) == {}  # the dynamic cluster-wide defaults: none
    for name, message in (("7", "Unexpected broker id, expected 0 or empty string, but received 7"),
                          ("x", "Broker id must be an integer, but it is: x")):
        req = DescribeConfigsRequest(resources=[DescribeConfigsRequest.DescribeConfigsResource(
            resource_type=BROKER, resource_name=name, configuration_keys=None)], include_synonyms=False)
        [result] = client.request(req, 4).results
        assert (result.error_code, result.error_message) == (INVALID_REQUEST, message)


def test_a_resource_named_twice_is_described_once(client: RawClient, topic_name: str) -> None:
    """Each repeat of a resource would be a whole answer again: the broker resource with synonyms
    and documentation is ~20 KB, so a 10 KB request naming it 2,000 times was a 40 MB answer built
    and encoded on the event loop (review s13, H3). A repeat is INVALID_REQUEST and costs nothing."""
    create(client, topic_name)
    resources = [DescribeConfigsRequest.DescribeConfigsResource(resource_type=kind, resource_name=name,
                                                                configuration_keys=None)
                 for kind, name in ((TOPIC, topic_name), (BROKER, "0"), (TOPIC, topic_name), (BROKER, "0"),
                                    (BROKER, ""))]
    req = DescribeConfigsRequest(resources=resources, include_synonyms=True, include_documentation=True)
    results = client.request(req, 4).results
    assert [(r.resource_type, r.resource_name) for r in results] == [(TOPIC, topic_name), (BROKER, "0"),
                                                                     (TOPIC, topic_name), (BROKER, "0"), (BROKER, "")]
    assert [r.error_code for r in results] == [0, 0, INVALID_REQUEST, INVALID_REQUEST, 0]
    assert results[0].configs and results[1].configs
    assert results[2].configs == [] and results[3].configs == []  # old code: both answered in full again
    assert "named more than once" in results[2].error_message


# -- AlterConfigs / IncrementalAlterConfigs ----------------------------------------------------


def test_incremental_set_and_delete_take_effect_at_once(client: RawClient, topic_name: str) -> None:
    create(client, topic_name)
    assert produce(client, topic_name, b"x" * 5000) == 0
    assert incremental(client, topic_name, [("max.message.bytes", SET, "2000")]) == (0, None)
    entry = describe(client, topic_name, ["max.message.bytes"])["max.message.bytes"]
    assert (entry.value, entry.config_source) == ("2000", TOPIC_CONFIG)
    assert produce(client, topic_name, b"x" * 5000) == MESSAGE_TOO_LARGE
    assert incremental(client, topic_name, [("max.message.bytes", DELETE, None)]) == (0, None)
    entry = describe(client, topic_name, ["max.message.bytes"])["max.message.bytes"]
    assert (entry.value, entry.config_source) == ("1048588", DEFAULT_CONFIG)
    assert produce(client, topic_name, b"x" * 5000) == 0


def test_incremental_append_and_subtract_on_cleanup_policy(client: RawClient, topic_name: str) -> None:
    create(client, topic_name)
    assert produce(client, topic_name, b"keyless", key=None) == 0
    assert incremental(client, topic_name, [("cleanup.policy", APPEND, "compact")]) == (0, None)
    assert describe(client, topic_name, ["cleanup.policy"])["cleanup.policy"].value == "delete,compact"
    assert produce(client, topic_name, b"keyless", key=None) == INVALID_RECORD  # compacted: keys required
    assert incremental(client, topic_name, [("cleanup.policy", SUBTRACT, "compact")]) == (0, None)
    assert describe(client, topic_name, ["cleanup.policy"])["cleanup.policy"].value == "delete"
    assert produce(client, topic_name, b"keyless", key=None) == 0


def test_validate_only_changes_nothing(client: RawClient, topic_name: str) -> None:
    create(client, topic_name)
    assert incremental(client, topic_name, [("retention.ms", SET, "5000")], validate_only=True) == (0, None)
    assert legacy_alter(client, topic_name, {"retention.ms": "5000"}, validate_only=True) == (0, None)
    assert describe(client, topic_name, ["retention.ms"])["retention.ms"].config_source == STATIC_BROKER_CONFIG
    code, message = incremental(client, topic_name, [("retention.ms", SET, "soon")], validate_only=True)
    assert code == INVALID_CONFIG and message is not None and "retention.ms" in message


@pytest.mark.parametrize(("ops", "expected"), [
    ([("no.such.config", SET, "1")], (INVALID_CONFIG, "Unknown topic config name: no.such.config")),
    ([("retention.ms", APPEND, "1000")],
     (INVALID_REQUEST, "Config value append is not allowed for config key: retention.ms")),
    ([("compression.type", SUBTRACT, "gzip")],
     (INVALID_REQUEST, "Config value subtract is not allowed for config key: compression.type")),
    ([("retention.ms", SET, "1"), ("retention.ms", SET, "2")],
     (INVALID_REQUEST, "Error due to duplicate config keys : retention.ms")),
])
def test_incremental_refusals_are_kafkas_and_change_nothing(client: RawClient, topic_name: str,
                                                           ops: list[tuple[str, int, str | None]],
                                                           expected: tuple[int, str]) -> None:
    create(client, topic_name, {"segment.ms": "600000"})
    assert incremental(client, topic_name, [*ops]) == expected
    configs = describe(client, topic_name, ["segment.ms", "retention.ms"])
    assert [(e.name, e.config_source) for e in configs.values()] == [("retention.ms", STATIC_BROKER_CONFIG),
                                                                      ("segment.ms", TOPIC_CONFIG)]


@pytest.mark.parametrize(("key", "value"), [("retention.ms", "a week"), ("cleanup.policy", "shred"),
                                            ("compression.type", "brotli"), ("min.cleanable.dirty.ratio", "1.5")])
def test_a_bad_value_is_invalid_config_naming_the_key(client: RawClient, topic_name: str, key: str,
                                                       value: str) -> None:
    create(client, topic_name)
    for code, message in (incremental(client, topic_name, [(key, SET, value)]),
                          legacy_alter(client, topic_name, {key: value})):
        assert code == INVALID_CONFIG and message is not None and key in message and value in message
    assert describe(client, topic_name, [key])[key].config_source != TOPIC_CONFIG


def test_an_unknown_topic_is_unknown_topic_or_partition(client: RawClient, topic_name: str) -> None:
    assert incremental(client, topic_name, [("retention.ms", SET, "1000")])[0] == UNKNOWN_TOPIC_OR_PARTITION
    assert legacy_alter(client, topic_name, {"retention.ms": "1000"})[0] == UNKNOWN_TOPIC_OR_PARTITION


def test_legacy_alter_configs_replaces_the_whole_set(client: RawClient, topic_name: str) -> None:
    create(client, topic_name, {"retention.ms": "3600000", "max.message.bytes": "2000"})
    assert legacy_alter(client, topic_name, {"segment.ms": "600000"}) == (0, None)
    configs = describe(client, topic_name, ["retention.ms", "max.message.bytes", "segment.ms"])
    assert {k: (e.value, e.config_source) for k, e in configs.items()} == {
        "retention.ms": ("86400000", STATIC_BROKER_CONFIG), "max.message.bytes": ("1048588", DEFAULT_CONFIG),
        "segment.ms": ("600000", TOPIC_CONFIG)}
    assert produce(client, topic_name, b"x" * 5000) == 0  # the 2000-byte limit went with the set


def test_static_broker_configs_are_refused_as_kafka_refuses_them(client: RawClient) -> None:
    """Only the log.* defaults are dynamic (test_dynamic_configs.py); Kafka's answer for the rest."""
    code, message = incremental(client, "0", [("auto.create.topics.enable", SET, "false")], resource_type=BROKER)
    assert code == INVALID_REQUEST and message is not None
    assert message.startswith("Cannot update these configs dynamically: Set(auto.create.topics.enable)")
    entry = describe(client, "0", ["auto.create.topics.enable"], resource_type=BROKER)["auto.create.topics.enable"]
    assert (entry.value, entry.read_only) == ("true", True)


@pytest.mark.parametrize("version", versions(AlterConfigsRequest))
def test_alter_configs_at_every_version(client: RawClient, topic_name: str, version: int) -> None:
    create(client, topic_name)
    assert legacy_alter(client, topic_name, {"retention.ms": str(1000000 + version)}, version=version) == (0, None)
    entry = describe(client, topic_name, ["retention.ms"])["retention.ms"]
    assert (entry.value, entry.config_source) == (str(1000000 + version), TOPIC_CONFIG)


@pytest.mark.parametrize("version", versions(IncrementalAlterConfigsRequest))
def test_incremental_alter_configs_at_every_version(client: RawClient, topic_name: str, version: int) -> None:
    create(client, topic_name)
    assert incremental(client, topic_name, [("segment.ms", SET, str(600000 + version))], version=version) == (0, None)
    assert describe(client, topic_name, ["segment.ms"])["segment.ms"].value == str(600000 + version)


def earliest_offset(c: RawClient, name: str) -> int:
    req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
        name=name, partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=-2)])])
    part = c.request(req, 7).topics[0].partitions[0]
    assert part.error_code == 0
    return int(part.offset)


def test_altered_configs_survive_a_restart_and_retention_follows_at_once(tmp_path: Path, topic_name: str) -> None:
    config = {**BROKER_CONFIG, "log.retention.check.interval.ms": "100"}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as proc:
        with RawClient(proc.bootstrap) as c:
            create(c, topic_name, {"segment.bytes": "1024"})
            for _ in range(6):
                assert produce(c, topic_name, b"v" * 700) == 0  # one segment each
            assert incremental(c, topic_name, [("max.message.bytes", SET, "2000"),
                                               ("compression.type", SET, "gzip")]) == (0, None)
            assert legacy_alter(c, topic_name, {"max.message.bytes": "2000", "compression.type": "gzip",
                                                "segment.bytes": "1024", "retention.bytes": "1"}) == (0, None)
            deadline = time.monotonic() + 30
            while earliest_offset(c, topic_name) == 0:  # retention deletes every closed segment
                assert time.monotonic() < deadline, "retention.bytes=1 deleted nothing"
                time.sleep(0.1)
        proc.stop()
        proc.start()
        with RawClient(proc.bootstrap) as c:
            configs = describe(c, topic_name, ["max.message.bytes", "compression.type", "retention.bytes"])
            assert {k: (e.value, e.config_source) for k, e in configs.items()} == {
                "max.message.bytes": ("2000", TOPIC_CONFIG), "compression.type": ("gzip", TOPIC_CONFIG),
                "retention.bytes": ("1", TOPIC_CONFIG)}
            assert produce(c, topic_name, b"x" * 5000) == MESSAGE_TOO_LARGE
            assert earliest_offset(c, topic_name) > 0


# -- DescribeLogDirs ---------------------------------------------------------------------------


def segment_bytes(data_dir: Path, topic: str, partition: int) -> int:
    return sum(f.stat().st_size for f in (data_dir / f"{topic}-{partition}").glob("*.log"))


@pytest.mark.parametrize("version", versions(DescribeLogDirsRequest))
def test_describe_log_dirs_at_every_version(client: RawClient, data_dir: Path, topic_name: str,
                                            version: int) -> None:
    create(client, topic_name, partitions=2)
    assert produce(client, topic_name, b"y" * 300) == 0
    T = DescribeLogDirsRequest.DescribableLogDirTopic
    named = client.request(DescribeLogDirsRequest(topics=[T(topic=topic_name, partitions=[0, 1, 99]),
                                                          T(topic=topic_name + "-none", partitions=[0])]), version)
    everything = client.request(DescribeLogDirsRequest(topics=None), version)
    for resp in (named, everything):
        [log_dir] = resp.results
        assert (log_dir.error_code, log_dir.log_dir) == (0, str(data_dir.resolve()))
        [topic] = [t for t in log_dir.topics if t.name == topic_name]
        assert [(p.partition_index, p.partition_size, p.offset_lag, p.is_future_key) for p in topic.partitions] == [
            (0, segment_bytes(data_dir, topic_name, 0), 0, False), (1, 0, 0, False)]
        assert topic.partitions[0].partition_size > 300
        if version >= 4:
            assert log_dir.total_bytes > 0 and 0 <= log_dir.usable_bytes <= log_dir.total_bytes
    assert [t.name for t in named.results[0].topics] == [topic_name]
