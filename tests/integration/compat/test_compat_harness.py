"""compat/run.py's broker for librdkafka's security tests, checked without librdkafka's suite: the
listeners, certificates and SASL user it sets up must take the very client settings it writes into
test.conf for 0097 (SSL with a client certificate, mTLS required), 0135/0142 (SASL_SSL, SCRAM) and
0126 (SASL_SSL, OAUTHBEARER with a token from the harness's OIDC endpoint).
Also the harness's choices that decide which tests run how (sockem numbers without -E, subtest
passes, exclusions). One real broker (a few seconds).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "compat"))
import run  # noqa: E402  (compat/ is no package: run.py is a script)
from secure_listeners import SECURITY_TESTS, SecurityFixture  # noqa: E402


def parse_conf(text: str) -> dict[str, Any]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[run.Broker, SecurityFixture]]:
    work = tmp_path_factory.mktemp("compat-harness")
    security = SecurityFixture.create(work / "pki")
    broker = run.Broker(work, "default", (*run.BROKER_OVERRIDES, "auto.create.topics.enable=true"), security)
    broker.start()
    try:
        yield broker, security
    finally:
        broker.stop()
        security.close()


def deliver(conf: dict[str, Any], timeout_ms: int = 15000) -> list[Any]:
    """Produce one record with these settings; the errors reported (empty: delivered)."""
    errors: list[Any] = []
    delivered: list[bool] = []
    producer = Producer({**conf, "message.timeout.ms": timeout_ms, "broker.address.family": "v4", "log_level": 2,
                         "error_cb": errors.append})
    producer.produce(f"harness-{uuid.uuid4().hex[:8]}", b"v",
                     on_delivery=lambda err, _m: (errors.append(err) if err else delivered.append(True)))
    producer.flush(30)
    assert delivered or errors, "neither delivered nor failed"
    return [] if delivered else errors


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_the_security_tests_client_settings_reach_the_broker(secured: tuple[run.Broker, SecurityFixture],
                                                             protocol: str) -> None:
    broker, security = secured
    conf = {"bootstrap.servers": broker.address(protocol), **parse_conf(security.client_conf(protocol))}
    assert deliver(conf) == []


def test_0126s_oidc_client_settings_log_in_with_oauthbearer(secured: tuple[run.Broker, SecurityFixture]) -> None:
    """0126's test.conf: librdkafka fetches a token from the harness's endpoint and the SASL_SSL
    listener accepts it (KIP-768's validator against the endpoint's JWKS); a token from the
    expired-token endpoint is refused by librdkafka itself, as 0126 expects."""
    broker, security = secured
    conf = {"bootstrap.servers": broker.address("SASL_SSL"), **parse_conf(security.client_conf("SASL_SSL", "0126"))}
    issued = security.idp.tokens_issued
    assert deliver(conf) == []
    assert security.idp.tokens_issued > issued
    env = security.env()
    expired = deliver({**conf, "sasl.oauthbearer.token.endpoint.url": env["EXPIRED_TOKEN_OIDC_URL"]}, 3000)
    assert expired and "unexpired" in " ".join(str(e) for e in expired), expired


def test_the_cluster_has_the_security_tests_listeners_on_every_broker(tmp_path: Path) -> None:
    """``--cluster 3`` (0142's consumer subtest, replication factor 3): ``cluster up --listener SSL
    --listener SASL_SSL``, the SASL user in the cluster's ZooKeeper, each test.conf naming all three
    brokers' endpoints of its listener."""
    from tests.integration.cluster.conftest import _require_zookeeper

    _require_zookeeper()
    security = SecurityFixture.create(tmp_path / "pki")
    overrides = tuple(o for o in run.BROKER_OVERRIDES if not o.startswith("default.replication.factor="))
    cluster = run.Cluster(tmp_path, "default", (*overrides, "default.replication.factor=3"), 3, security)
    cluster.start()
    try:
        for protocol in ("SSL", "SASL_SSL"):
            assert len(set(cluster.address(protocol).split(","))) == 3
            conf = {"bootstrap.servers": cluster.address(protocol), **parse_conf(security.client_conf(protocol)),
                    "acks": "all"}
            assert deliver(conf, timeout_ms=60000) == [], protocol
    finally:
        cluster.stop()


def test_the_ssl_listener_requires_a_client_certificate(secured: tuple[run.Broker, SecurityFixture]) -> None:
    """0097 runs with SSL_client_auth=required: without a certificate the broker must refuse."""
    broker, security = secured
    conf = {"bootstrap.servers": broker.address("SSL"), **parse_conf(security.client_conf("SSL"))}
    for key in ("ssl.certificate.location", "ssl.key.location", "ssl.key.password"):
        del conf[key]
    errors = deliver(conf, timeout_ms=3000)
    assert errors and all(e.code() != KafkaError.NO_ERROR for e in errors)


def test_wrong_sasl_credentials_are_refused(secured: tuple[run.Broker, SecurityFixture]) -> None:
    broker, security = secured
    conf = {"bootstrap.servers": broker.address("SASL_SSL"), **parse_conf(security.client_conf("SASL_SSL")),
            "sasl.password": "not-" + security.password}
    assert any(e.code() == KafkaError._AUTHENTICATION for e in deliver(conf, timeout_ms=3000))


def test_the_kafka_acls_stand_in_adds_and_removes_a_topic_acl(secured: tuple[run.Broker, SecurityFixture]) -> None:
    """0109/0115/0119 call kafka-acls.sh through KAFKA_PATH; the stand-in must add and remove."""
    broker, _ = secured
    topic = f"acl-{uuid.uuid4().hex[:8]}"
    tool = [str(REPO / "compat" / "kafka" / "bin" / "kafka-acls.sh"), "--bootstrap-server", broker.bootstrap]
    binding = ["--deny-principal", "User:*", "--operation", "Read", "--deny-host", "*", "--topic", topic]
    env = {**os.environ, "COMPAT_PYTHON": sys.executable}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    match = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)

    def acls() -> list[tuple[str, str, str]]:
        found = admin.describe_acls(match, request_timeout=30).result(60)
        return [(b.principal, b.operation.name, b.permission_type.name) for b in found]

    added = subprocess.run([*tool, "--add", *binding], env=env, capture_output=True, text=True, timeout=60,
                           check=False)
    assert added.returncode == 0, added.stderr
    assert acls() == [("User:*", "READ", "DENY")]
    removed = subprocess.run([*tool, "--remove", "--force", *binding], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
    assert removed.returncode == 0, removed.stderr
    assert acls() == []


def test_trivup_ssl_variables_name_files_that_exist(tmp_path: Path) -> None:
    security = SecurityFixture.create(tmp_path)
    env = security.env()
    security.close()
    for name, value in env.items():
        if name not in ("SSL_password", "SSL_client_auth") and not name.endswith("_OIDC_URL"):
            assert Path(value).stat().st_size > 0, name
    assert env["SSL_client_auth"] == "required"


def test_sockem_numbers_run_without_minus_e() -> None:
    assert "-E" not in run.runner_argv(quick=False, local_only=False, sockem=True)
    assert run.runner_argv(quick=False, local_only=False, sockem=False) == ["./test-runner", "-p1", "-E", "-L"]


def test_a_number_run_in_passes_fails_if_one_pass_fails() -> None:
    ok = run.Result("0142", "PASS", 10.0, variants={"0142_reauthentication": "PASSED"})
    bad = run.Result("0142", "FAIL", 5.0, "boom", variants={"0142_reauthentication": "FAILED"})
    merged = run.merge_passes("0142", [ok, bad, ok], ("a:", "b:", "c:"))
    assert (merged.status, merged.seconds, merged.variants) == ("FAIL", 25.0, {"0142_reauthentication": "FAILED"})
    assert merged.reason == "[SUBTESTS=b:] boom"


def test_the_tests_that_now_run_are_not_excluded() -> None:
    exclusions = run.load_exclusions(REPO / "compat" / "exclusions")
    now_run = {"0049", "0053", "0064", "0068", "0075", "0076", "0088", "0094", "0110", "0115", "0119",
               *SECURITY_TESTS}
    assert now_run.isdisjoint(exclusions)
    assert "0126" in SECURITY_TESTS
