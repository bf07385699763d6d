"""The authorizer's decisions (Kafka's AclAuthorizer rules) and the ACL file, without a broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ads_broker.config import BrokerConfig
from ads_broker.exceptions import ConfigError
from ads_broker.security.acl import (
    ALL,
    ALLOW,
    ALTER_CONFIGS,
    ANY,
    CLUSTER,
    CLUSTER_NAME,
    DELETE,
    DENY,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    GROUP,
    IDEMPOTENT_WRITE,
    LITERAL,
    MATCH,
    PREFIXED,
    READ,
    TOPIC,
    WRITE,
    Acl,
    AclError,
    AclFilter,
    AclIndex,
    AclStore,
    Authorizer,
    parse_super_users,
)

HOST = "10.0.0.5"


def authorizer(tmp_path: Path, *acls: Acl, super_users: str = "", allow_if_no_acl: bool = False) -> Authorizer:
    store = AclStore(tmp_path)
    store.save(acls)
    return Authorizer(store, parse_super_users(super_users), allow_if_no_acl)


def allow(name: str, op: int, principal: str = "User:alice", *, rtype: int = TOPIC, pattern: int = LITERAL,
          host: str = "*") -> Acl:
    return Acl(rtype, name, pattern, principal, host, op, ALLOW)


def deny(name: str, op: int, principal: str = "User:alice", *, rtype: int = TOPIC, pattern: int = LITERAL) -> Acl:
    return Acl(rtype, name, pattern, principal, "*", op, DENY)


def test_no_acl_found_follows_the_setting(tmp_path: Path) -> None:
    assert not authorizer(tmp_path).authorize("User:alice", HOST, READ, TOPIC, "t")
    assert authorizer(tmp_path, allow_if_no_acl=True).authorize("User:alice", HOST, READ, TOPIC, "t")
    # Any ACL on the resource, even for someone else, means "ACLs found": bob is denied.
    a = authorizer(tmp_path, allow("t", READ), allow_if_no_acl=True)
    assert not a.authorize("User:bob", HOST, READ, TOPIC, "t")


def test_implied_operations(tmp_path: Path) -> None:
    a = authorizer(tmp_path, allow("t", WRITE), allow("c", ALTER_CONFIGS), allow("d", DELETE))
    assert a.authorize("User:alice", HOST, DESCRIBE, TOPIC, "t")
    assert a.authorize("User:alice", HOST, DESCRIBE, TOPIC, "d")
    assert not a.authorize("User:alice", HOST, READ, TOPIC, "t")
    assert a.authorize("User:alice", HOST, DESCRIBE_CONFIGS, TOPIC, "c")
    assert not a.authorize("User:alice", HOST, DESCRIBE, TOPIC, "c")  # ALTER_CONFIGS implies only DESCRIBE_CONFIGS


def test_deny_wins_and_all(tmp_path: Path) -> None:
    a = authorizer(tmp_path, allow("t", ALL, "User:*"), deny("t", WRITE), deny("u", ALL), allow("u", READ))
    assert a.authorize("User:alice", HOST, READ, TOPIC, "t")
    assert not a.authorize("User:alice", HOST, WRITE, TOPIC, "t")
    assert a.authorize("User:bob", HOST, WRITE, TOPIC, "t")
    assert not a.authorize("User:alice", HOST, READ, TOPIC, "u")


def test_patterns_wildcard_and_hosts(tmp_path: Path) -> None:
    a = authorizer(tmp_path, allow("team-a.", READ, pattern=PREFIXED), allow("*", READ, "User:bob"),
                   allow("g", READ, rtype=GROUP, host="10.0.0.9"))
    assert a.authorize("User:alice", HOST, READ, TOPIC, "team-a.orders")
    assert not a.authorize("User:alice", HOST, READ, TOPIC, "team-b.orders")
    assert a.authorize("User:bob", HOST, READ, TOPIC, "anything")
    assert not a.authorize("User:alice", HOST, READ, GROUP, "g")
    assert a.authorize("User:alice", "10.0.0.9", READ, GROUP, "g")


def test_super_users(tmp_path: Path) -> None:
    a = authorizer(tmp_path, deny("t", ALL, "User:root"), super_users="User:root; User:ops")
    assert a.authorize("User:root", HOST, WRITE, TOPIC, "t")
    assert a.authorize("User:ops", HOST, ALL, CLUSTER, CLUSTER_NAME)


def test_authorize_any(tmp_path: Path) -> None:
    a = authorizer(tmp_path, allow("x", WRITE), deny("*", WRITE, "User:bob"), allow("y", WRITE, "User:bob"))
    assert a.authorize_any("User:alice", HOST, WRITE, TOPIC)
    assert not a.authorize_any("User:bob", HOST, WRITE, TOPIC)
    assert not a.authorize_any("User:carol", HOST, WRITE, TOPIC)
    assert not a.authorize("User:alice", HOST, IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME)


def test_create_delete_persist_and_filters(tmp_path: Path) -> None:
    a = authorizer(tmp_path)
    a.create([allow("t", READ), allow("pre", WRITE, pattern=PREFIXED), allow("t", READ)])
    assert len(a.acls) == 2
    assert Authorizer(AclStore(tmp_path), frozenset(), False).acls == a.acls  # persisted
    assert [x.resource_name for x in a.acls if AclFilter(TOPIC, "pre-fix", MATCH).matches(x)] == ["pre"]
    removed = a.delete([AclFilter(TOPIC, "t", LITERAL)])
    assert removed == [[allow("t", READ)]]
    assert json.loads((tmp_path / "__acls.json").read_text())["acls"][0]["resource_name"] == "pre"


def test_invalid_bindings_are_refused() -> None:
    with pytest.raises(AclError):
        Acl(TOPIC, "t", MATCH, "User:a", "*", READ, ALLOW).validate()
    with pytest.raises(AclError):
        Acl(CLUSTER, "other", LITERAL, "User:a", "*", READ, ALLOW).validate()
    with pytest.raises(AclError):
        Acl(TOPIC, "t", LITERAL, "alice", "*", READ, ALLOW).validate()


def test_a_running_authorizer_rereads_a_replaced_file(tmp_path: Path) -> None:
    a = authorizer(tmp_path)
    assert not a.authorize("User:alice", HOST, READ, TOPIC, "t")
    AclStore(tmp_path).save([allow("t", READ)])
    a._checked -= 2  # as if a second had passed
    assert a.authorize("User:alice", HOST, READ, TOPIC, "t")


def test_authorizer_class_setting() -> None:
    assert BrokerConfig.load(overrides={"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"})
    with pytest.raises(ConfigError):
        BrokerConfig.load(overrides={"authorizer.class.name": "com.example.Mine"})


# -- the ACL index: the same ACLs found as a scan of every ACL finds them (issue 12 item 4) ---------

_NAMES = st.text(alphabet="ab._*", min_size=1, max_size=5)
_ACLS = st.lists(st.builds(
    Acl, st.sampled_from((TOPIC, GROUP)), _NAMES, st.sampled_from((LITERAL, PREFIXED)),
    st.sampled_from(("User:alice", "User:bob", "User:*")), st.sampled_from(("*", HOST, "10.0.0.6")),
    st.sampled_from((ALL, READ, WRITE, DELETE, DESCRIBE, ALTER_CONFIGS, DESCRIBE_CONFIGS)),
    st.sampled_from((ALLOW, DENY))), max_size=25)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(acls=_ACLS, rtype=st.sampled_from((TOPIC, GROUP)), name=_NAMES)
def test_the_index_finds_exactly_the_acls_a_scan_finds(tmp_path: Path, acls: list[Acl], rtype: int,
                                                        name: str) -> None:
    """LITERAL by name plus the wildcard ``*``, PREFIXED by every prefix of the name: the index
    returns the ACLs whose pattern covers the resource, no more, no fewer (names from an alphabet
    of five characters, so prefixes, wildcards and '.'/'_' overlap often)."""
    scan = [a for a in dict.fromkeys(acls) if a.resource_type == rtype and a.applies_to(name)]
    found = AclIndex(dict.fromkeys(acls)).matching(rtype, name)
    assert sorted(found, key=repr) == sorted(scan, key=repr)
    a = authorizer(tmp_path, *acls)
    ops = (READ, WRITE, DELETE, DESCRIBE, ALTER_CONFIGS, DESCRIBE_CONFIGS)
    for principal in ("User:alice", "User:carol"):
        each = {op for op in ops if a.authorize(principal, HOST, op, rtype, name)}
        assert a.authorized_operations(principal, HOST, ops, rtype, name) == each


def test_the_index_follows_created_and_deleted_acls(tmp_path: Path) -> None:
    a = authorizer(tmp_path)
    a.create([allow("svc.", WRITE, pattern=PREFIXED), allow("*", READ)])
    assert a.authorized_operations("User:alice", HOST, (READ, WRITE, DELETE), TOPIC, "svc.x") == {READ, WRITE}
    a.delete([AclFilter(TOPIC, "svc.", PREFIXED)])
    assert a.authorized_operations("User:alice", HOST, (READ, WRITE, DELETE), TOPIC, "svc.x") == {READ}
    assert a.authorized_operations("User:root", HOST, (READ, WRITE), TOPIC, "x") == set()
    assert authorizer(tmp_path, super_users="User:root").authorized_operations(
        "User:root", HOST, (READ, WRITE), TOPIC, "x") == {READ, WRITE}


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(acls=_ACLS, names=st.lists(_NAMES, min_size=1, max_size=4),
       patterns=st.lists(st.sampled_from((LITERAL, PREFIXED, MATCH, ANY)), min_size=1, max_size=4))
def test_delete_removes_exactly_what_matching_every_acl_removes(tmp_path: Path, acls: list[Acl], names: list[str],
                                                                 patterns: list[int]) -> None:
    """DeleteAcls looks only at the named resource's ACLs for a filter naming one exactly (review
    s13-2, M1: every filter scanned every ACL); what it removes per filter must be what the scan
    of every ACL removes, in the same order."""
    filters = [AclFilter(resource_type=ANY, resource_name=n, pattern_type=p)
               for n, p in zip(names, patterns, strict=False)]
    filters.append(AclFilter(resource_type=TOPIC, resource_name=None, pattern_type=ANY, principal="User:alice"))
    a = authorizer(tmp_path, *acls)
    before = a.acls
    expected = [[acl for acl in before if f.matches(acl)] for f in filters]
    assert a.delete(filters) == expected
