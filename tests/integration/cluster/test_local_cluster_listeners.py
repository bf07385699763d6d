"""``ads-broker cluster up --listener SASL_SSL``: every broker of a real three-broker cluster gets a
SASL_SSL listener on a port of its own, listed in cluster.json; confluent-kafka produces with
acks=all to a topic replicated three ways and consumes it back in a group, through
SASL_SSL only (librdkafka's 0142 RF 3 subtest needs exactly this cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.cluster.local import STATE_FILE
from tests.integration.cluster.conftest import _require_zookeeper
from tests.integration.cluster.test_local_cluster import cli, read_all

pytest.importorskip("cryptography.x509")
from ads_broker.security import testcerts  # needs cryptography

PASSWORD = "pw-" + uuid.uuid4().hex[:12]


def _sasl_ssl(bootstrap: str, ca: Path, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": str(ca),
            "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "alice", "sasl.password": PASSWORD,
            "broker.address.family": "v4", **extra}


def test_cluster_up_with_a_sasl_ssl_listener_on_every_broker(tmp_path: Path) -> None:
    _require_zookeeper()
    ca, server = testcerts.server_files(tmp_path / "pki", "ads-cluster")
    props = tmp_path / "secure.properties"  # the security settings as a file, the rest as --override
    props.write_text(f"ssl.keystore.location={server}\nsasl.enabled.mechanisms=SCRAM-SHA-256\n")
    root = tmp_path / "cluster"
    out = cli("up", "--dir", str(root), "--brokers", "3", "--listener", "SASL_SSL", "--config", str(props),
              "--override", "offsets.topic.replication.factor=3").stdout
    try:
        state = json.loads((root / STATE_FILE).read_text())
        endpoints = [b["endpoints"] for b in state["brokers"]]
        assert [list(e) for e in endpoints] == [["PLAINTEXT", "SASL_SSL"]] * 3, endpoints
        addresses = [addr for e in endpoints for addr in e.values()]
        assert len(set(addresses)) == 6, addresses  # a port of its own for every listener of every broker
        sasl_ssl = ",".join(e["SASL_SSL"] for e in endpoints)
        assert f"SASL_SSL: bootstrap.servers={sasl_ssl}" in out, out
        status = cli("status", "--dir", str(root)).stdout
        assert all(f"SASL_SSL://{e['SASL_SSL']}" in status for e in endpoints), status

        users = subprocess.run([sys.executable, "-m", "ads_broker", "users", "add", "alice", "--zookeeper-connect",
                                state["zookeeper_connect"]], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "ADS_BROKER_USER_PASSWORD": PASSWORD}, check=False)
        assert users.returncode == 0, users.stderr

        conf = _sasl_ssl(sasl_ssl, ca)
        admin = AdminClient(conf)
        admin.create_topics([NewTopic("secure", 3, 3)])["secure"].result(60)
        metadata = admin.list_topics("secure", timeout=30)
        # Each broker advertises its SASL_SSL endpoint to a SASL_SSL client (not its PLAINTEXT one).
        assert sorted(f"{b.host}:{b.port}" for b in metadata.brokers.values()) == sorted(sasl_ssl.split(","))
        assert all(len(p.replicas) == 3 for p in metadata.topics["secure"].partitions.values())

        producer = Producer({**conf, "acks": "all", "enable.idempotence": True})
        errors: list[Any] = []
        for i in range(300):
            producer.produce("secure", str(i).encode(), on_delivery=lambda err, _m: errors.append(err) if err else None)
        assert producer.flush(60) == 0 and not errors, errors
        got = read_all(sasl_ssl, "secure", 3, **{k: v for k, v in conf.items() if k != "bootstrap.servers"})
        assert sorted(got) == sorted(str(i).encode() for i in range(300))
    finally:
        cli("down", "--dir", str(root), check=False)


@pytest.mark.parametrize(("args", "message"), [
    (["--listener", "PLAINTEXT"], "already has its PLAINTEXT listener"),
    (["--listener", "SASL_SSL", "--listener", "sasl_ssl"], "SASL_SSL given twice"),
    (["--listener", "SSL://x"], "letters, digits and underscores"),
    (["--override", "listeners=SSL://127.0.0.1:1"], "name the listeners besides PLAINTEXT with --listener"),
    (["--config", "/nonexistent/secure.properties"], "no such file"),
])
def test_bad_listener_options_are_clear_errors(tmp_path: Path, args: list[str], message: str) -> None:
    proc = cli("up", "--dir", str(tmp_path / "c"), *args, check=False)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "c" / STATE_FILE).exists()  # nothing started
