"""The ZooKeeper encodings of ACLs and SCRAM credentials are Kafka's (``ZkAclStore``'s JSON,
``ScramCredentialUtils.credentialToString``, ``Sanitizer``), so Kafka's tools and ours read each
other's znodes (docs/SECURITY.md "Cluster mode")."""

from __future__ import annotations

import json

import pytest

from ads_broker.exceptions import ConfigError
from ads_broker.security.acl import (
    ALLOW,
    CLUSTER,
    CLUSTER_ACTION,
    DENY,
    IDEMPOTENT_WRITE,
    LITERAL,
    PREFIXED,
    TOPIC,
    TRANSACTIONAL_ID,
    Acl,
)
from ads_broker.security.scram import ScramCredential
from ads_broker.security.zk_store import (
    acl_path,
    decode_acls,
    decode_credential,
    decode_user_config,
    encode_acls,
    encode_credential,
    sanitize_user,
)


def test_acl_json_and_paths_are_kafkas() -> None:
    acls = [Acl(CLUSTER, "kafka-cluster", LITERAL, "User:broker", "*", CLUSTER_ACTION, ALLOW),
            Acl(CLUSTER, "kafka-cluster", LITERAL, "User:eve", "10.0.0.5", IDEMPOTENT_WRITE, DENY)]
    assert json.loads(encode_acls(acls)) == {"version": 1, "acls": [
        {"principal": "User:broker", "permissionType": "Allow", "operation": "ClusterAction", "host": "*"},
        {"principal": "User:eve", "permissionType": "Deny", "operation": "IdempotentWrite", "host": "10.0.0.5"}]}
    assert decode_acls((CLUSTER, "kafka-cluster", LITERAL), encode_acls(acls)) == acls
    assert acl_path((TOPIC, "events", LITERAL)) == "/kafka-acl/Topic/events"
    assert acl_path((TRANSACTIONAL_ID, "dedupe-", PREFIXED)) == "/kafka-acl-extended/prefixed/TransactionalId/dedupe-"


def test_scram_credential_string_is_kafkas() -> None:
    credential = ScramCredential.from_password("SCRAM-SHA-256", "secret", 4096, salt=b"\x01" * 16)
    text = encode_credential(credential)
    fields = dict(part.split("=", 1) for part in text.split(","))
    assert list(fields) == ["salt", "stored_key", "server_key", "iterations"]
    assert fields["salt"] == "AQEBAQEBAQEBAQEBAQEBAQ==" and fields["iterations"] == "4096"
    assert decode_credential(text) == credential
    body = json.dumps({"version": 1, "config": {"SCRAM-SHA-256": text, "producer_byte_rate": "1024"}}).encode()
    assert decode_user_config(body) == {"SCRAM-SHA-256": credential}  # other user configs are not credentials


def test_user_names_are_sanitized_as_kafka_does() -> None:
    assert sanitize_user("alice") == "alice"
    assert sanitize_user("CN=a b/c*") == "CN%3Da%20b%2Fc%2A"


def test_a_znode_that_is_not_kafkas_json_is_named_in_the_error() -> None:
    for bad in (b"not json", b'{"version":1,"acls":[{"principal":"User:a","operation":"Fly"}]}'):
        with pytest.raises(ConfigError, match="/kafka-acl/Topic/events is not Kafka's ACL JSON"):
            decode_acls((TOPIC, "events", LITERAL), bad)
    with pytest.raises(ConfigError, match="/config/users/bob does not hold Kafka's SCRAM credentials"):
        decode_user_config(b'{"version":1,"config":{"SCRAM-SHA-256":"salt=AA=="}}', "/config/users/bob")


def test_resource_types_of_kafkas_notifications_and_ours() -> None:
    from ads_broker.security.zk_store import resource_type_of
    assert [resource_type_of(n) for n in ("Topic", "TOPIC", "topic", "TransactionalId", "TRANSACTIONAL_ID")] == [
        TOPIC, TOPIC, TOPIC, TRANSACTIONAL_ID, TRANSACTIONAL_ID]
    assert resource_type_of("DELEGATION_TOKEN") is None and resource_type_of("User") is None


@pytest.mark.parametrize("name", ["team/x", "..", ".", "/"])
def test_a_name_that_is_not_one_znode_name_is_refused_before_anything_is_written(name: str) -> None:
    from ads_broker.security.acl import GROUP, AclError
    with pytest.raises(AclError, match="cannot be stored in ZooKeeper"):
        acl_path((GROUP, name, LITERAL))
    assert decode_acls((GROUP, "team", LITERAL), b"") == []  # a data-less parent znode holds no ACLs
