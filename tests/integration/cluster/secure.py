"""A three-broker cluster whose brokers talk SASL_PLAINTEXT (SCRAM-SHA-256) to each other, with
the ACL authorizer on: each broker has a SASL_PLAINTEXT listener (the inter-broker one, first, so
Metadata names it) and a PLAINTEXT one (``User:ANONYMOUS``, where an attacker without credentials
connects). Users are created offline in every data dir with ``ads-broker users add`` before the
first start, as an operator would: ``broker`` (the brokers' own principal, in ``super.users``),
``admin`` (in ``super.users``) and ``mallory`` (may read and write the test topics, nothing on the
cluster).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import AdminClient

from ads_broker.embedded import free_port
from tests.integration.broker.test_acls import acl_add, cli
from tests.integration.cluster.conftest import IDS, BrokerCluster, wait_until

PASSWORD = "pw-" + uuid.uuid4().hex[:12]
USERS = ("broker", "admin", "mallory")
MECHANISM = "SCRAM-SHA-256"
JAAS = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="{PASSWORD}";'


@dataclass
class SaslCluster:
    brokers: BrokerCluster
    sasl_ports: dict[int, int] = field(default_factory=dict)
    plain_ports: dict[int, int] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        """The SASL listeners (what Metadata names: the first listener)."""
        return ",".join(f"127.0.0.1:{p}" for p in self.sasl_ports.values())

    def sasl(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.sasl_ports[broker_id]}"

    def plain(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.plain_ports[broker_id]}"

    def client_conf(self, user: str = "admin", **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": MECHANISM, "sasl.username": user, "sasl.password": PASSWORD,
                "broker.address.family": "v4", **extra}

    def admin(self) -> AdminClient:
        return AdminClient(self.client_conf())


def start_three_sasl(brokers: BrokerCluster, topic_prefix: str = "t-", **config: str) -> SaslCluster:
    """Brokers 1-3 with SASL_PLAINTEXT between them; returns once all three are registered."""
    cluster = SaslCluster(brokers)
    for broker_id in IDS:
        data_dir = brokers.data_dir(broker_id)
        data_dir.mkdir(parents=True, exist_ok=True)
        for user in USERS:
            out = cli("users", "add", user, "--mechanism", MECHANISM, data_dir=data_dir, password=PASSWORD)
            assert out.returncode == 0, out.stderr
        acl_add(data_dir, "--allow-principal", "User:mallory", "--operation", "READ", "--operation", "WRITE",
                "--topic", topic_prefix, "--resource-pattern-type", "PREFIXED")
        sasl, plain = free_port(), free_port()
        cluster.sasl_ports[broker_id], cluster.plain_ports[broker_id] = sasl, plain
        brokers.start(broker_id, port=plain, **{
            "listeners": f"SASL_PLAINTEXT://127.0.0.1:{sasl},PLAINTEXT://127.0.0.1:{plain}",
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_plaintext.{MECHANISM.lower()}.sasl.jaas.config": JAAS,
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:broker;User:admin",
            "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1",
            **config})
    admin = cluster.admin()
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == list(IDS), "three registered brokers")
    return cluster
