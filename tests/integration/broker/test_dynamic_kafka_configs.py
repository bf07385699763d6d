"""Kafka's dynamic broker configs that ads-broker accepts and keeps without using them (issue 14,
librdkafka's test 0081): the SASL login configs of Kafka's ``DynamicListenerConfig`` (per broker id
only) and the thread counts of ``DynamicThreadPool``, through AlterConfigs (33) and
IncrementalAlterConfigs (44) of the BROKER resource, against a real ads-broker process: Kafka's
types and rules, Kafka's errors, described as DYNAMIC_BROKER_CONFIG and kept across a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from ads_broker.embedded import BrokerProcess, ads_broker_process
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_dynamic_configs import legacy_broker_alter
from tests.integration.broker.test_topic_configs import (
    BROKER,
    DELETE,
    INVALID_CONFIG,
    INVALID_REQUEST,
    SET,
    describe,
    incremental,
)

pytestmark = pytest.mark.timeout(120)

RELOGIN = "sasl.kerberos.min.time.before.relogin"
DYNAMIC_BROKER_CONFIG, DEFAULT_CONFIG = 2, 5
LONG, SHORT, LIST = 5, 4, 7


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with ads_broker_process(tmp_path / "data", log_path=tmp_path / "broker.log") as proc:
        yield proc


def test_librdkafka_alters_a_kafka_sasl_broker_config_of_this_broker(broker: BrokerProcess) -> None:
    """0081's AlterConfigs and IncrementalAlterConfigs of the broker id: accepted, described with
    Kafka's type and source (no longer read-only), and kept across a restart."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.alter_configs([ConfigResource(ResourceType.BROKER, "0", set_config={RELOGIN: "58000"})]).values():
        f.result(30)
    with RawClient(broker.bootstrap) as c:
        entry = describe(c, "0", [RELOGIN], resource_type=BROKER)[RELOGIN]
        assert (entry.value, entry.config_source, entry.config_type, entry.read_only) == (
            "58000", DYNAMIC_BROKER_CONFIG, LONG, False)
    resource = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
        ConfigEntry(RELOGIN, "59000", incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(30)
    broker.stop()
    broker.start()
    with RawClient(broker.bootstrap) as c:
        entry = describe(c, "0", [RELOGIN], resource_type=BROKER)[RELOGIN]
        assert (entry.value, entry.config_source) == ("59000", DYNAMIC_BROKER_CONFIG)
        assert incremental(c, "0", [(RELOGIN, DELETE, None)], resource_type=BROKER) == (0, None)
        entry = describe(c, "0", [RELOGIN], resource_type=BROKER)[RELOGIN]
        assert (entry.value, entry.config_source) == ("60000", DEFAULT_CONFIG)  # Kafka's default


def test_kafka_rules_for_the_sasl_login_configs(broker: BrokerProcess) -> None:
    """Per broker only (Kafka's PerBrokerConfigs), and Kafka's types: LONG, SHORT, DOUBLE, LIST."""
    with RawClient(broker.bootstrap) as c:
        assert incremental(c, "", [(RELOGIN, SET, "58000")], resource_type=BROKER) == (
            INVALID_REQUEST, "Cannot update these configs at default cluster level, broker id must be specified: "
                             f"Set({RELOGIN})")
        code, message = legacy_broker_alter(c, "", {RELOGIN: "58000"})
        assert code == INVALID_REQUEST and message and "broker id must be specified" in message
        code, message = incremental(c, "0", [(RELOGIN, SET, "soon")], resource_type=BROKER)
        assert code == INVALID_CONFIG and message and RELOGIN in message and "soon" in message
        code, message = incremental(c, "0", [("sasl.login.refresh.buffer.seconds", SET, "40000")],
                                    resource_type=BROKER)
        assert code == INVALID_CONFIG and message and "SHORT" in message
        code, message = incremental(c, "0", [("sasl.kerberos.ticket.renew.jitter", SET, "x")], resource_type=BROKER)
        assert code == INVALID_CONFIG and message and "sasl.kerberos.ticket.renew.jitter" in message
        assert describe(c, "", resource_type=BROKER) == {}  # nothing was kept
        ops = [("sasl.kerberos.principal.to.local.rules", SET, "DEFAULT"),
               ("sasl.login.refresh.buffer.seconds", SET, "120")]
        assert incremental(c, "0", ops, resource_type=BROKER) == (0, None)
        described = describe(c, "0", ["sasl.kerberos.principal.to.local.rules", "sasl.login.refresh.buffer.seconds"],
                             resource_type=BROKER)
        assert {k: (e.value, e.config_type) for k, e in described.items()} == {
            "sasl.kerberos.principal.to.local.rules": ("DEFAULT", LIST),
            "sasl.login.refresh.buffer.seconds": ("120", SHORT)}


def test_thread_counts_within_half_and_double_as_kafka(broker: BrokerProcess) -> None:
    """0081's IncrementalAlterConfigs helper sets background.threads=9 then DELETEs it, with a
    log.cleanup.policy APPEND/SUBTRACT; Kafka's DynamicThreadPool refuses a jump past double or
    below half the current value."""
    with RawClient(broker.bootstrap) as c:
        assert incremental(c, "0", [("background.threads", SET, "9"), ("log.cleanup.policy", 2, "compact")],
                           resource_type=BROKER) == (0, None)
        described = describe(c, "0", ["background.threads", "log.cleanup.policy"], resource_type=BROKER)
        assert {k: e.value for k, e in described.items()} == {"background.threads": "9",
                                                              "log.cleanup.policy": "delete,compact"}
        assert incremental(c, "0", [("background.threads", DELETE, ""), ("log.cleanup.policy", 3, "compact")],
                           resource_type=BROKER) == (0, None)
        assert describe(c, "0", resource_type=BROKER)["background.threads"].value == "10"
        assert incremental(c, "", [("num.io.threads", SET, "17")], resource_type=BROKER) == (
            INVALID_REQUEST, "Dynamic thread count update validation failed for num.io.threads=17, value should not "
                             "be greater than double the current value 8")
        assert incremental(c, "", [("num.io.threads", SET, "3")], resource_type=BROKER) == (
            INVALID_REQUEST, "Dynamic thread count update validation failed for num.io.threads=3, value should be at "
                             "least half the current value 8")
        code, message = incremental(c, "", [("num.replica.fetchers", SET, "0")], resource_type=BROKER)
        assert code == INVALID_CONFIG and message and "minimum" in message
        assert incremental(c, "", [("num.io.threads", SET, "16")], resource_type=BROKER) == (0, None)
        assert describe(c, "", resource_type=BROKER)["num.io.threads"].value == "16"
