"""The cluster's ACL and user caches (``ZkSecurity``) against a real ZooKeeper: a change
notification this broker cannot apply (garbage, a resource type it does not authorize, Kafka's
own ``TOPIC:name`` form) is logged and skipped, and the changes after it still apply (found by the
review of 2026-11-27: one bad notification stopped every later ACL and credential change on that
broker, so a deleted user kept logging in there). Kafka's ``ZkNodeChangeNotificationListener``
logs and moves on too. No broker process: the cache class itself, on a real ZooKeeper session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ads_broker.security.acl import ALLOW, DENY, LITERAL, READ, TOPIC, Acl
from ads_broker.security.scram import ScramCredential
from ads_broker.security.zk_store import (
    CONFIG_CHANGES_PATH,
    EXTENDED_CHANGES_PATH,
    LITERAL_CHANGES_PATH,
    USERS_CONFIG_PATH,
    ZkAuthorizer,
    ZkCredentialStore,
    ZkSecurity,
)
from tests.integration.cluster.conftest import SESSION_TIMEOUT_MS, wait_until

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def securities(zk_connect: str) -> Iterator[tuple[ZkSecurity, ZkSecurity]]:
    """Two brokers' caches on one cluster's znodes: one writes, the other must see it."""
    a = ZkSecurity(zk_connect, SESSION_TIMEOUT_MS, ZkAuthorizer(frozenset(), False))
    b = ZkSecurity(zk_connect, SESSION_TIMEOUT_MS, ZkAuthorizer(frozenset(), False))
    a.start()
    b.start()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_changes_after_a_notification_that_cannot_be_applied_still_apply(
        securities: tuple[ZkSecurity, ZkSecurity]) -> None:
    writer, reader = securities
    ZkCredentialStore(writer).upsert("mallory", "SCRAM-SHA-256", ScramCredential.from_password(
        "SCRAM-SHA-256", "pw-of-mallory"))
    wait_until(lambda: "mallory" in reader.users, "the user to reach the other broker")
    client = writer.zk.client
    # Garbage, a type no broker here authorizes, and Kafka's own literal and extended forms.
    client.create(f"{LITERAL_CHANGES_PATH}/acl_changes_", b"\xff not a resource", sequence=True)
    client.create(f"{LITERAL_CHANGES_PATH}/acl_changes_", b"DELEGATION_TOKEN:t1", sequence=True)
    client.create(f"{EXTENDED_CHANGES_PATH}/acl_changes_", b"{not json", sequence=True)
    assert writer.authorizer is not None and reader.authorizer is not None
    writer.authorizer.create([Acl(TOPIC, "orders", LITERAL, "User:mallory", "*", READ, DENY)])
    client.create(f"{LITERAL_CHANGES_PATH}/acl_changes_", b"TOPIC:orders", sequence=True)
    ZkCredentialStore(writer).delete("mallory")
    wait_until(lambda: "mallory" not in reader.users, "the deletion to reach the other broker")
    wait_until(lambda: [a.permission for a in reader.authorizer.acls] == [DENY], "the DENY to apply")
    writer.authorizer.create([Acl(TOPIC, "orders", LITERAL, "User:alice", "*", READ, ALLOW)])
    wait_until(lambda: len(reader.authorizer.acls) == 2, "a later ACL to apply too")


def test_deleting_a_user_without_credentials_writes_nothing(securities: tuple[ZkSecurity, ZkSecurity]) -> None:
    """Before (review finding 9): ``/config/users/nobody`` was created with an empty config, and a
    notification sent to every broker, for a user that never existed."""
    writer, _reader = securities
    client = writer.zk.client
    changes_before = client.get_children(CONFIG_CHANGES_PATH)
    assert ZkCredentialStore(writer).delete("nobody") is False
    assert client.exists(f"{USERS_CONFIG_PATH}/nobody") is None
    assert client.get_children(CONFIG_CHANGES_PATH) == changes_before


def test_one_users_deletions_and_upsertions_are_one_write(securities: tuple[ZkSecurity, ZkSecurity]) -> None:
    """AlterUserScramCredentials deleting SCRAM-SHA-512 and setting SCRAM-SHA-256 for one user is
    one conditional write and one notification (review finding 8: each was its own write, so every
    broker could see, and a failure between them could leave, the user with no credential)."""
    writer, reader = securities
    store = ZkCredentialStore(writer)
    old = ScramCredential.from_password("SCRAM-SHA-512", "old-pw")
    new = ScramCredential.from_password("SCRAM-SHA-256", "new-pw")
    store.upsert("svc", "SCRAM-SHA-512", old)
    wait_until(lambda: "svc" in reader.users, "the user to reach the other broker")
    changes_before = len(writer.zk.client.get_children(CONFIG_CHANGES_PATH))
    store.alter("svc", ["SCRAM-SHA-512"], {"SCRAM-SHA-256": new})
    assert len(writer.zk.client.get_children(CONFIG_CHANGES_PATH)) == changes_before + 1
    wait_until(lambda: reader.users.get("svc") == {"SCRAM-SHA-256": new}, "the other broker to see the change")


def test_users_cli_against_zookeeper_adds_lists_and_deletes(zk_connect: str) -> None:
    """``ads-broker users add|list|delete --zookeeper-connect`` (a real process each, real
    ZooKeeper): the same writes the brokers' store makes; deleting a user that is gone fails."""
    import subprocess
    import sys

    def users(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ads_broker", "users", *args, "--zookeeper-connect", zk_connect],
                              capture_output=True, text=True, timeout=60, check=False,
                              env={**__import__("os").environ, "ADS_BROKER_USER_PASSWORD": "pw-of-bob"})

    assert users("add", "bob", "--mechanism", "SCRAM-SHA-256").returncode == 0
    assert "bob\tSCRAM-SHA-256 (iterations=4096)" in users("list").stdout
    assert users("delete", "bob").returncode == 0
    again = users("delete", "bob")
    assert again.returncode != 0 and "no user 'bob'" in again.stderr + again.stdout
    assert "bob" not in users("list").stdout
