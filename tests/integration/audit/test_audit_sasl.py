"""``spark-audit run`` against a broker that lets only authenticated clients in (SASL/SCRAM), with
the credentials in a Secrets Manager secret (``--kafka-secret``), as the nightly EMR Serverless job
of ops/terraform/modules/spark_audit runs it. A real ads-broker process with a SCRAM listener;
moto's server on loopback stands in for Secrets Manager (boto3 finds it through AWS_ENDPOINT_URL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from tests.unit.audit import scenario as sc

PASSWORD = "pw-" + uuid.uuid4().hex[:10]
EVENTS = 12


@pytest.fixture
def scram_broker(tmp_path: Path) -> Iterator[tuple[BrokerProcess, str]]:
    """An ads-broker with user ``audit`` (SCRAM-SHA-256): (process, bootstrap of its SASL listener)."""
    data = tmp_path / "broker"
    added = subprocess.run([sys.executable, "-m", "ads_broker", "users", "add", "audit", "--data-dir", str(data)],
                           env={**os.environ, "ADS_BROKER_USER_PASSWORD": PASSWORD}, capture_output=True,
                           text=True, timeout=60, check=False)
    assert added.returncode == 0, added.stderr
    plain, sasl = free_port(), free_port()
    with ads_broker_process(data, port=plain, log_path=tmp_path / "broker.log", config={
            "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256"}) as broker:
        yield broker, f"127.0.0.1:{sasl}"


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Secrets Manager client on moto's server (loopback); boto3 in the CLI finds the same server."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                           "AWS_EC2_METADATA_DISABLED": "true"}.items():
            monkeypatch.setenv(key, value)
        yield boto3.client("secretsmanager")
    finally:
        server.stop()


def _produce(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(EVENTS):
        producer.produce(topic, key=f"m-{i}".encode(), value=sc.event(f"m-{i}", i),
                         timestamp=int((sc.START + timedelta(minutes=i)).timestamp() * 1000))
    assert producer.flush(30) == 0


def _run(bootstrap: str, topic: str, out: Path, *extra: str) -> Any:
    from typer.testing import CliRunner

    from spark_audit.cli import app

    return CliRunner().invoke(app, [
        "run", "--bootstrap", bootstrap, "--input", topic, "--output", f"{topic}.out", "--dlq", "",
        "--date", sc.DAY, "--out", str(out), "--master", "local[2]", *extra])


def test_the_audit_reads_through_a_scram_listener_with_the_secrets_credentials(
        spark: Any, scram_broker: tuple[BrokerProcess, str], secrets: Any, topic_name: str, tmp_path: Path) -> None:
    broker, sasl_bootstrap = scram_broker
    for topic in (topic_name, f"{topic_name}.out"):
        _produce(broker.bootstrap, topic)  # through the plaintext listener, as an operator's setup
    arn = secrets.create_secret(Name=f"AmazonMSK_audit-{uuid.uuid4().hex[:6]}",
                                SecretString=json.dumps({"username": "audit", "password": PASSWORD}))["ARN"]

    done = _run(sasl_bootstrap, topic_name, tmp_path / "report", "--kafka-secret", arn,
                "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=SCRAM-SHA-256")

    assert done.exit_code == 0, done.output
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert (report["input_messages"], report["output_messages"], report["missing"]) == (EVENTS, EVENTS, 0)
    assert PASSWORD not in done.output
    assert PASSWORD not in (tmp_path / "report" / "report.json").read_text()


def test_a_secret_that_cannot_be_read_stops_the_audit_before_spark_with_its_name(
        scram_broker: tuple[BrokerProcess, str], secrets: Any, topic_name: str, tmp_path: Path) -> None:
    _, sasl_bootstrap = scram_broker
    missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:AmazonMSK_nope-abcdef"
    done = _run(sasl_bootstrap, topic_name, tmp_path / "r1", "--kafka-secret", missing)
    assert done.exit_code == 1
    assert f"cannot read the Kafka secret {missing}: ResourceNotFoundException" in done.output
    assert not (tmp_path / "r1").exists()

    plain = secrets.create_secret(Name=f"AmazonMSK_bad-{uuid.uuid4().hex[:6]}", SecretString="user:pw")["ARN"]
    done = _run(sasl_bootstrap, topic_name, tmp_path / "r2", "--kafka-secret", plain)
    assert done.exit_code == 1
    assert f"the Kafka secret {plain} is not a JSON object" in done.output
    assert "user:pw" not in done.output
