"""ACLs and SCRAM credentials shared by the whole cluster, in ZooKeeper, as Kafka (ZooKeeper mode)
keeps them (docs/SECURITY.md "Cluster mode: ACLs and users in ZooKeeper").

Znodes, with Kafka's encodings (``AclAuthorizer`` / ``ZkAclStore`` / ``ZkAclChangeStore``,
``AdminZkClient.changeConfigs`` for users, ``ScramCredentialUtils``), so Kafka's tools read them:

================================================  ===============================================
``/kafka-acl/<Type>/<name>``                      LITERAL ACLs of one resource:
                                                  ``{"version":1,"acls":[{"principal":"User:a",
                                                  "permissionType":"Allow","operation":"Read",
                                                  "host":"*"}]}``
``/kafka-acl-extended/prefixed/<Type>/<name>``    PREFIXED ACLs of one resource (same JSON)
``/kafka-acl-changes/acl_changes_<seq>``          ``Topic:name`` (a literal resource changed)
``/kafka-acl-extended-changes/acl_changes_<seq>`` ``{"version":1,"resourceType":"Topic","name":..,
                                                  "patternType":"PREFIXED"}``
``/config/users/<sanitized user>``                ``{"version":1,"config":{"SCRAM-SHA-256":
                                                  "salt=..,stored_key=..,server_key=..,iterations=4096"}}``
``/config/changes/config_change_<seq>``           ``{"version":2,"entity_path":"users/<user>"}``
================================================  ===============================================

A resource's ACLs are changed with a conditional write on the znode version read (create if
missing, delete when empty), retried on a conflict, so two brokers changing one resource at once
lose neither change (Kafka's ``updateResourceAcls``). Each change then creates a sequential
notification; every broker watches the change paths and re-reads the resources (users) named by
the notifications newer than the last it processed. The caches answer every authorization and
login; a lost ZooKeeper connection keeps them as last read (never allow-all, never deny-all), and
every reconnection re-reads everything (a notification may have been missed, or purged).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import queue
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import structlog
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from ads_broker.cluster.exceptions import ZooKeeperUnavailableError
from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.exceptions import ConfigError
from ads_broker.security.acl import (
    ALLOW,
    CLUSTER,
    DENY,
    GROUP,
    LITERAL,
    OPERATIONS,
    PREFIXED,
    TOPIC,
    TRANSACTIONAL_ID,
    Acl,
    AclError,
    AclFilter,
    Authorizer,
)
from ads_broker.security.scram import SCRAM_MECHANISMS, ScramCredential, altered

log = structlog.get_logger("ads_broker.security.zk")

LITERAL_ACL_PATH = "/kafka-acl"
PREFIXED_ACL_PATH = "/kafka-acl-extended/prefixed"
LITERAL_CHANGES_PATH = "/kafka-acl-changes"
EXTENDED_CHANGES_PATH = "/kafka-acl-extended-changes"
ACL_CHANGE_PREFIX = "acl_changes_"
USERS_CONFIG_PATH = "/config/users"
CONFIG_CHANGES_PATH = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
#: Kafka deletes change notifications older than this (``ZkNodeChangeNotificationListener``).
CHANGE_EXPIRATION_MS = 15 * 60 * 1000
#: Conflicting conditional writes are retried this often before giving up (Kafka: ``maxUpdateRetries``).
MAX_UPDATE_RETRIES = 30
#: Threads of :attr:`ZkSecurity.writer`: security writes are rare, so two at once are plenty.
WRITER_THREADS = 2
T = TypeVar("T")
SECURITY_PATHS = (LITERAL_ACL_PATH, PREFIXED_ACL_PATH, LITERAL_CHANGES_PATH, EXTENDED_CHANGES_PATH,
                  USERS_CONFIG_PATH, CONFIG_CHANGES_PATH)

#: Kafka's ``SecurityUtils.resourceTypeName`` (the ZooKeeper path segment) per resource type.
ZK_RESOURCE_TYPES = {TOPIC: "Topic", GROUP: "Group", CLUSTER: "Cluster", TRANSACTIONAL_ID: "TransactionalId"}
_RESOURCE_BY_ZK = {v: k for k, v in ZK_RESOURCE_TYPES.items()}


def resource_type_of(name: str) -> int | None:
    """A resource type from a znode segment or a change notification: ``Topic`` (our paths and
    notifications), ``TOPIC`` / ``TRANSACTIONAL_ID`` (Kafka's notifications write the enum name),
    any case; None for a type this broker does not authorize (``DelegationToken``, ``User``)."""
    wanted = name.replace("_", "").upper()
    return next((code for zk, code in _RESOURCE_BY_ZK.items() if zk.upper() == wanted), None)
_PATTERN_PATHS = {LITERAL: LITERAL_ACL_PATH, PREFIXED: PREFIXED_ACL_PATH}


def _camel(name: str) -> str:
    """``CLUSTER_ACTION`` -> ``ClusterAction`` (Kafka's ``SecurityUtils.operationName``)."""
    return "".join(part.capitalize() for part in name.split("_"))


_ZK_OPERATIONS = {code: _camel(name) for name, code in OPERATIONS.items() if name != "ANY"}
_OPERATION_BY_ZK = {v: k for k, v in _ZK_OPERATIONS.items()}
_ZK_PERMISSIONS = {ALLOW: "Allow", DENY: "Deny"}
_PERMISSION_BY_ZK = {v: k for k, v in _ZK_PERMISSIONS.items()}

Resource = tuple[int, str, int]  # (resource type, name, pattern type)


def sanitize_user(user: str) -> str:
    """Kafka's ``Sanitizer.sanitize``: a user name as a znode name (URL-encoded, ``*`` as ``%2A``)."""
    return urllib.parse.quote(user, safe="").replace("~", "%7E")


def check_znode_name(name: str) -> None:
    """A resource name is one znode name: no ``/`` (``team/x`` would be a znode under ``team``,
    which every broker's full read then takes for a resource with no JSON, and the ACL could never
    be removed), not ``.`` or ``..`` (ZooKeeper refuses relative paths)."""
    if "/" in name or name in (".", ".."):
        raise AclError(f"resource name {name!r} cannot be stored in ZooKeeper (cluster mode): a name may not "
                       "contain '/' or be '.' or '..'; use a prefixed ACL on the part before the '/'")


def acl_path(resource: Resource) -> str:
    rtype, name, pattern = resource
    check_znode_name(name)
    return f"{_PATTERN_PATHS[pattern]}/{ZK_RESOURCE_TYPES[rtype]}/{name}"


def encode_acls(acls: Iterable[Acl]) -> bytes:
    return json.dumps({"version": 1, "acls": [
        {"principal": a.principal, "permissionType": _ZK_PERMISSIONS[a.permission],
         "operation": _ZK_OPERATIONS[a.operation], "host": a.host} for a in acls]}).encode()


def decode_acls(resource: Resource, data: bytes) -> list[Acl]:
    """A resource znode's ACLs; :class:`ConfigError` naming the znode if it is not Kafka's JSON
    (the caller keeps the state in force: no ACL is guessed or dropped)."""
    rtype, name, pattern = resource
    if not data:  # a znode without data (created by hand, or as the parent of a nested name): no ACLs
        return []
    try:
        return [Acl(rtype, name, pattern, str(e["principal"]), str(e["host"]), _OPERATION_BY_ZK[str(e["operation"])],
                    _PERMISSION_BY_ZK[str(e["permissionType"])]) for e in json.loads(data).get("acls", [])]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"ZooKeeper node {acl_path(resource)} is not Kafka's ACL JSON ({type(e).__name__}: {e}); "
                          "fix or delete it (ads-broker acls remove --zookeeper-connect ...)") from e


def encode_credential(credential: ScramCredential) -> str:
    """Kafka's ``ScramCredentialUtils.credentialToString``."""
    b64 = ScramCredential.to_json(credential)
    return f"salt={b64['salt']},stored_key={b64['stored_key']},server_key={b64['server_key']}," \
           f"iterations={credential.iterations}"


def decode_credential(text: str) -> ScramCredential:
    fields = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    # base64 values may end in '=': split on the first '=' only keeps them whole
    return ScramCredential.from_json({"salt": fields["salt"], "stored_key": fields["stored_key"],
                                      "server_key": fields["server_key"], "iterations": fields["iterations"]})


def decode_user_config(data: bytes, path: str = USERS_CONFIG_PATH) -> dict[str, ScramCredential]:
    """A user znode's SCRAM credentials; :class:`ConfigError` naming the znode if unreadable."""
    try:
        config = dict(json.loads(data).get("config") or {})
        return {m: decode_credential(str(v)) for m, v in config.items() if m in SCRAM_MECHANISMS}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"ZooKeeper node {path} does not hold Kafka's SCRAM credentials ({type(e).__name__}: "
                          f"{e}); set them again (ads-broker users add --zookeeper-connect ...)") from e


class ZkSecurityData:
    """Reads and writes the ACL and user znodes of one ZooKeeper session (blocking calls; used by
    the brokers and by ``ads-broker acls|users --zookeeper-connect``)."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client

    def ensure_paths(self) -> None:
        for path in SECURITY_PATHS:
            self.client.ensure_path(path)
        for pattern_path in _PATTERN_PATHS.values():
            for zk_type in ZK_RESOURCE_TYPES.values():
                self.client.ensure_path(f"{pattern_path}/{zk_type}")

    # -- ACLs --
    def resource_acls(self, resource: Resource) -> tuple[list[Acl], int]:
        """The resource's ACLs and its znode version (-1: no znode)."""
        try:
            data, stat = self.client.get(acl_path(resource))
        except NoNodeError:
            return [], -1
        return decode_acls(resource, data), int(stat.version)

    def all_acls(self) -> dict[Resource, list[Acl]]:
        resources: list[Resource] = []
        for pattern, base in _PATTERN_PATHS.items():
            for rtype, zk_type in ZK_RESOURCE_TYPES.items():
                try:
                    names = self.client.get_children(f"{base}/{zk_type}")
                except NoNodeError:
                    continue
                resources += [(rtype, name, pattern) for name in names]
        pending = [(r, self.client.get_async(acl_path(r))) for r in resources]
        out: dict[Resource, list[Acl]] = {}
        for resource, answer in pending:
            try:
                data, _ = answer.get()
            except NoNodeError:
                continue
            if acls := decode_acls(resource, data):
                out[resource] = acls
        return out

    def update_resource(self, resource: Resource, change: Callable[[list[Acl]], list[Acl]]) -> list[Acl]:
        """Kafka's ``updateResourceAcls``: read, change, write conditionally on the version read
        (create when missing, delete when empty), retried on a conflict; then a change
        notification. Returns the resource's ACLs as written."""
        path = acl_path(resource)
        for _ in range(MAX_UPDATE_RETRIES):
            current, version = self.resource_acls(resource)
            new = list(dict.fromkeys(change(current)))
            if set(new) == set(current):
                return current
            try:
                if not new:
                    self.client.delete(path, version=version)
                elif version < 0:
                    self.client.create(path, encode_acls(new), makepath=True)
                else:
                    self.client.set(path, encode_acls(new), version=version)
            except (BadVersionError, NodeExistsError, NoNodeError, NotEmptyError):
                continue  # another writer got in between: read again
            self._notify_acl_change(resource)
            return new
        raise RuntimeError(f"ACLs of {path} not updated: {MAX_UPDATE_RETRIES} conflicting writes in a row")

    def _notify_acl_change(self, resource: Resource) -> None:
        rtype, name, pattern = resource
        if pattern == LITERAL:
            path, body = LITERAL_CHANGES_PATH, f"{ZK_RESOURCE_TYPES[rtype]}:{name}".encode()
        else:
            path = EXTENDED_CHANGES_PATH
            body = json.dumps({"version": 1, "resourceType": ZK_RESOURCE_TYPES[rtype], "name": name,
                               "patternType": "PREFIXED"}).encode()
        self.client.create(f"{path}/{ACL_CHANGE_PREFIX}", body, sequence=True, makepath=True)

    def create_acls(self, acls: Iterable[Acl]) -> dict[Resource, list[Acl]]:
        """Add ACLs; per resource touched, its ACLs as written."""
        by_resource: dict[Resource, list[Acl]] = {}
        for acl in acls:
            by_resource.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(acl)
        for _rtype, name, _pattern in by_resource:  # all refused before any is written
            check_znode_name(name)
        return {r: self.update_resource(r, lambda cur, add=add: cur + [a for a in add if a not in cur])  # type: ignore[misc]
                for r, add in by_resource.items()}

    def delete_acls(self, filters: list[AclFilter], known: Iterable[Acl]
                    ) -> tuple[list[list[Acl]], dict[Resource, list[Acl]]]:
        """Remove what each filter matches; the resources looked at are those of the ``known`` ACLs
        (the broker's cache, as Kafka's ``deleteAcls`` uses its ``aclCache``) that some filter
        matches, each re-read before its conditional write. Per filter the ACLs it removed, and per
        resource touched its ACLs as written."""
        resources = {(a.resource_type, a.resource_name, a.pattern_type) for a in known if any(f.matches(a)
                                                                                              for f in filters)}
        removed: list[list[Acl]] = [[] for _ in filters]
        written: dict[Resource, list[Acl]] = {}
        for resource in sorted(resources):
            gone: list[list[Acl]] = []

            def change(current: list[Acl], gone: list[list[Acl]] = gone) -> list[Acl]:
                gone[:] = [[a for a in current if f.matches(a)] for f in filters]
                dropped = {a for g in gone for a in g}
                return [a for a in current if a not in dropped]

            written[resource] = self.update_resource(resource, change)
            for i, g in enumerate(gone):
                removed[i] += g
        return removed, written

    # -- users --
    def user_credentials(self, user: str) -> tuple[dict[str, ScramCredential], int]:
        try:
            data, stat = self.client.get(path := f"{USERS_CONFIG_PATH}/{sanitize_user(user)}")
        except NoNodeError:
            return {}, -1
        return decode_user_config(data, path), int(stat.version)

    def all_users(self) -> dict[str, dict[str, ScramCredential]]:
        try:
            names = self.client.get_children(USERS_CONFIG_PATH)
        except NoNodeError:
            return {}
        pending = [(n, self.client.get_async(f"{USERS_CONFIG_PATH}/{n}")) for n in names]
        out: dict[str, dict[str, ScramCredential]] = {}
        for name, answer in pending:
            try:
                data, _ = answer.get()
            except NoNodeError:
                continue
            if creds := decode_user_config(data, f"{USERS_CONFIG_PATH}/{name}"):
                out[urllib.parse.unquote(name)] = creds
        return out

    def update_user(self, user: str, change: Callable[[dict[str, ScramCredential]], dict[str, ScramCredential]]
                    ) -> dict[str, ScramCredential]:
        """Change a user's SCRAM credentials (other config keys of the znode are kept), conditional
        on the version read and retried; then ``/config/changes`` (Kafka's ``changeConfigs``)."""
        path = f"{USERS_CONFIG_PATH}/{sanitize_user(user)}"
        for _ in range(MAX_UPDATE_RETRIES):
            try:
                data, stat = self.client.get(path)
                body: dict[str, Any] = json.loads(data)
                version = int(stat.version)
            except NoNodeError:
                body, version = {"version": 1, "config": {}}, -1
            config = dict(body.get("config") or {})
            current = {m: decode_credential(str(v)) for m, v in config.items() if m in SCRAM_MECHANISMS}
            new = change(dict(current))
            if new == current:  # nothing to change (e.g. deleting a user that has no credential): no write
                return current
            for m in SCRAM_MECHANISMS:
                config.pop(m, None)
            config.update({m: encode_credential(c) for m, c in sorted(new.items())})
            encoded = json.dumps({"version": 1, "config": config}).encode()
            try:
                if version < 0:
                    self.client.create(path, encoded, makepath=True)
                else:
                    self.client.set(path, encoded, version=version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue
            entity = json.dumps({"version": 2, "entity_path": f"users/{sanitize_user(user)}"}).encode()
            self.client.create(f"{CONFIG_CHANGES_PATH}/{CONFIG_CHANGE_PREFIX}", entity, sequence=True,
                               makepath=True)
            return new
        raise RuntimeError(f"{path} not updated: {MAX_UPDATE_RETRIES} conflicting writes in a row")

    def alter_user(self, user: str, deletions: list[str], upsertions: dict[str, ScramCredential]
                   ) -> dict[str, ScramCredential]:
        """One user's deletions, then upsertions, in one conditional write; the user's credentials
        as written (used by the brokers' store and by ``ads-broker users``)."""
        return self.update_user(user, lambda current: altered(current, deletions, upsertions))

    def delete_user(self, user: str, mechanism: str | None = None) -> tuple[bool, dict[str, ScramCredential]]:
        """Remove one mechanism's credential (or all of the user's): whether there was one, and the
        user's credentials as written."""
        found: list[str] = []

        def change(current: dict[str, ScramCredential]) -> dict[str, ScramCredential]:
            found[:] = [m for m in current if mechanism is None or m == mechanism]
            return {m: c for m, c in current.items() if m not in found}

        written = self.update_user(user, change)  # runs ``change``, which fills ``found``
        return bool(found), written

    # -- change notifications --
    def changes(self, path: str) -> list[tuple[int, str]]:
        """(sequence number, child name) of each notification under ``path``, oldest first."""
        try:
            children = self.client.get_children(path)
        except NoNodeError:
            return []
        return sorted((int(c[-10:]), c) for c in children if c[-10:].isdigit())


class ZkCredentialStore:
    """:class:`~ads_broker.security.scram.CredentialStore`'s interface over the users in ZooKeeper:
    reads from the cache :class:`ZkSecurity` keeps current, writes through to ZooKeeper (blocking:
    callers on the event loop run them in an executor)."""

    def __init__(self, security: ZkSecurity) -> None:
        self.security = security

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.security.users.get(user, {}).get(mechanism)

    def credentials(self, user: str) -> dict[str, ScramCredential]:
        return dict(self.security.users.get(user, {}))

    def users(self) -> dict[str, dict[str, ScramCredential]]:
        return {u: dict(m) for u, m in self.security.users.items()}

    def upsert(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        self.alter(user, [], {mechanism: credential})

    def alter(self, user: str, deletions: list[str], upsertions: dict[str, ScramCredential]) -> None:
        self.security.set_user(user, self.security.data.alter_user(user, deletions, upsertions))

    def alter_many(self, changes: dict[str, tuple[list[str], dict[str, ScramCredential]]]) -> None:
        for user, (deletions, upsertions) in changes.items():  # a znode per user, as Kafka's
            self.alter(user, deletions, upsertions)

    def delete(self, user: str, mechanism: str | None = None) -> bool:
        deleted, credentials = self.security.data.delete_user(user, mechanism)
        self.security.set_user(user, credentials)
        return deleted


class ZkAuthorizer(Authorizer):
    """The authorizer of a broker in cluster mode: the same decisions, on ACLs kept by
    :class:`ZkSecurity` (ZooKeeper), so a change made through any broker applies on every broker."""

    def __init__(self, super_users: frozenset[str], allow_if_no_acl: bool) -> None:
        super().__init__(None, super_users, allow_if_no_acl)
        self.security: ZkSecurity | None = None
        self._by_resource: dict[Resource, list[Acl]] = {}
        self._lock = threading.Lock()

    def check_storable(self, acl: Acl) -> None:
        check_znode_name(acl.resource_name)

    def replace_all(self, acls: dict[Resource, list[Acl]]) -> None:
        with self._lock:
            self._by_resource = {r: list(a) for r, a in acls.items() if a}
            self._set([a for r in sorted(self._by_resource) for a in self._by_resource[r]])

    def replace_resource(self, resource: Resource, acls: list[Acl]) -> None:
        with self._lock:
            if acls:
                self._by_resource[resource] = list(acls)
            else:
                self._by_resource.pop(resource, None)
            self._set([a for r in sorted(self._by_resource) for a in self._by_resource[r]])

    def create(self, new: Iterable[Acl]) -> None:
        assert self.security is not None, "the security store is not started"
        for resource, acls in self.security.data.create_acls(new).items():
            self.replace_resource(resource, acls)

    def delete(self, filters: list[AclFilter]) -> list[list[Acl]]:
        assert self.security is not None, "the security store is not started"
        removed, written = self.security.data.delete_acls(filters, self.acls)
        for resource, acls in written.items():
            self.replace_resource(resource, acls)
        return removed


class ZkSecurity:
    """The broker's ZooKeeper session for ACLs and users (Kafka's ``AclAuthorizer`` opens a
    session of its own too): loads everything at start, follows the change notifications, keeps
    the last state read while ZooKeeper is away and re-reads everything on every reconnection."""

    def __init__(self, connect: str, session_timeout_ms: int, authorizer: ZkAuthorizer | None) -> None:
        self.zk = KafkaZkClient(connect, session_timeout_ms=session_timeout_ms,
                                connection_timeout_ms=session_timeout_ms)
        self.data = ZkSecurityData(self.zk.client)
        self.authorizer = authorizer
        if authorizer is not None:
            authorizer.security = self
        #: user -> mechanism -> credential, replaced whole on each change (readers need no lock)
        self.users: dict[str, dict[str, ScramCredential]] = {}
        self.credentials = ZkCredentialStore(self)
        self._users_lock = threading.Lock()
        self._last_seen: dict[str, int] = {}
        self._events: queue.Queue[str | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._connected = True
        #: The threads CreateAcls, DeleteAcls and AlterUserScramCredentials write ZooKeeper on
        #: (:meth:`write`). Their own: a write waits for ZooKeeper (kazoo queues a request while the
        #: connection is away and answers it only on reconnection), and must not hold the event
        #: loop's default executor, which the rest of the broker shares, meanwhile.
        self.writer = concurrent.futures.ThreadPoolExecutor(max_workers=WRITER_THREADS,
                                                            thread_name_prefix="zk-security-write")

    # -- life cycle --
    def start(self) -> None:
        """Connect and read everything (blocking); raises ZooKeeperUnavailableError."""
        self.zk.start()
        try:
            self.data.ensure_paths()
            self._reload_all()
        except BaseException:
            self.zk.close()  # an open client keeps kazoo's threads, and the process, alive
            raise
        self.zk.add_state_listener(self._on_state)
        self._worker = threading.Thread(target=self._run, name="zk-security", daemon=True)
        self._worker.start()
        for path in (LITERAL_CHANGES_PATH, EXTENDED_CHANGES_PATH, CONFIG_CHANGES_PATH):
            self.zk.client.ChildrenWatch(path, lambda _children: self._events.put("changes"))
        log.info("ACLs and SCRAM credentials read from ZooKeeper", zookeeper=self.zk.connect,
                 acls=len(self.authorizer.acls) if self.authorizer is not None else None, users=len(self.users))

    def close(self) -> None:
        self._events.put(None)
        if self._worker is not None:
            self._worker.join(timeout=5)
        self.zk.close()
        self.writer.shutdown(wait=False, cancel_futures=True)

    @property
    def connected(self) -> bool:
        """False from a lost ZooKeeper connection (SUSPENDED or LOST) until the next CONNECTED."""
        return self._connected

    async def write(self, change: Callable[..., T], *args: Any, timeout_s: float) -> T:
        """Run a blocking ZooKeeper change on :attr:`writer`, waiting at most ``timeout_s``.

        Fails at once with :class:`ZooKeeperUnavailableError` while the connection is lost: the
        write could not land before ZooKeeper is back, and queued it would pin a writer thread
        until then (forever, if ZooKeeper hangs). A write that was running when the connection
        went may still land once ZooKeeper is back, as with Kafka's ZooKeeper client."""
        if not self._connected:
            raise ZooKeeperUnavailableError(
                f"ZooKeeper ({self.zk.connect}) is unreachable from this broker: the change was not made. "
                "ACLs and SCRAM credentials are stored in ZooKeeper in cluster mode; retry when it is back")
        future = asyncio.get_running_loop().run_in_executor(self.writer, change, *args)
        return await asyncio.wait_for(future, timeout_s)

    def set_user(self, user: str, credentials: dict[str, ScramCredential]) -> None:
        with self._users_lock:
            users = dict(self.users)
            if credentials:
                users[user] = dict(credentials)
            else:
                users.pop(user, None)
            self.users = users

    # -- events (kazoo's thread hands them to the worker thread) --
    def _on_state(self, state: KazooState) -> None:
        if state == KazooState.CONNECTED:
            if not self._connected:
                self._connected = True
                self._events.put("reload")
        else:
            self._connected = False
            log.warning("ZooKeeper connection lost: the ACLs and SCRAM credentials last read stay in force; "
                        "all are read again on reconnection", state=str(state), zookeeper=self.zk.connect)

    def _run(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            try:
                if event == "reload":
                    self._reload_all()
                    log.info("ZooKeeper connection back: ACLs and SCRAM credentials read again",
                             acls=len(self.authorizer.acls) if self.authorizer is not None else None,
                             users=len(self.users))
                else:
                    self._process_changes()
            except Exception as e:  # ZooKeeper gone again: the state listener queues a reload
                log.warning("cannot read ACL or user changes from ZooKeeper; keeping the state in force",
                            error=f"{type(e).__name__}: {e}"[:300])

    def _reload_all(self) -> None:
        """Read every ACL and user. The ACLs and the users are read independently: an unreadable
        ACL znode must not also keep a deleted user's credential in force (and at run time the
        error is logged and the state in force kept for that part only; at start it is raised)."""
        # Notifications are listed first: a change made during the reads has a newer one.
        latest = {path: (seqs[-1][0] if (seqs := self.data.changes(path)) else -1)
                  for path in (LITERAL_CHANGES_PATH, EXTENDED_CHANGES_PATH, CONFIG_CHANGES_PATH)}
        failed: Exception | None = None
        if self.authorizer is not None:
            try:
                self.authorizer.replace_all(self.data.all_acls())
            except ConfigError as e:
                failed = e
                log.error("cannot read the ACLs from ZooKeeper; the ACLs in force stay", error=str(e)[:500])
        try:
            users = self.data.all_users()
            with self._users_lock:
                self.users = users
        except ConfigError as e:
            failed = failed or e
            log.error("cannot read the SCRAM credentials from ZooKeeper; the credentials in force stay",
                      error=str(e)[:500])
        self._last_seen = latest
        if failed is not None and self._worker is None:  # at start: refuse to serve on a guess
            raise failed

    def _process_changes(self) -> None:
        now_ms = time.time() * 1000
        for path in (LITERAL_CHANGES_PATH, EXTENDED_CHANGES_PATH, CONFIG_CHANGES_PATH):
            last = self._last_seen.get(path, -1)
            for seq, child in self.data.changes(path):
                node = f"{path}/{child}"
                try:
                    data, stat = self.zk.client.get(node)
                except NoNodeError:
                    continue
                if seq > last:
                    try:
                        self._apply_change(path, data)
                    except (ConfigError, ValueError, KeyError, TypeError, AttributeError) as e:
                        # Kafka's ZkNodeChangeNotificationListener logs and moves on: one bad
                        # notification must not stop every later change from applying. What it
                        # named may have changed: read everything again.
                        log.error("ignoring a change notification this broker cannot apply; reading all ACLs and "
                                  "users again", znode=node, data=data[:200].decode(errors="replace"),
                                  error=f"{type(e).__name__}: {e}"[:300])
                        self._events.put("reload")
                    self._last_seen[path] = last = seq
                if now_ms - stat.ctime > CHANGE_EXPIRATION_MS:  # Kafka purges old notifications
                    with contextlib.suppress(NoNodeError):
                        self.zk.client.delete(node)

    def _apply_change(self, path: str, data: bytes) -> None:
        if path == CONFIG_CHANGES_PATH:
            entity = str(json.loads(data).get("entity_path", ""))
            kind, _, name = entity.partition("/")
            if kind == "users" and name:
                user = urllib.parse.unquote(name)
                creds, _ = self.data.user_credentials(user)
                self.set_user(user, creds)
                log.info("SCRAM credentials changed", user=user, mechanisms=sorted(creds))
            return
        if self.authorizer is None:
            return
        if path == LITERAL_CHANGES_PATH:  # "Topic:name" (ours) or "TOPIC:name" (Kafka's ResourceType.toString)
            zk_type, _, name = data.decode().partition(":")
            pattern = LITERAL
        else:
            obj = json.loads(data)
            zk_type, name = str(obj["resourceType"]), str(obj["name"])
            pattern = PREFIXED if str(obj.get("patternType", "")).upper() == "PREFIXED" else LITERAL
        rtype = resource_type_of(zk_type)
        if rtype is None:
            log.info("ignoring an ACL change of a resource type this broker does not authorize", type=zk_type,
                     name=name)
            return
        resource: Resource = (rtype, name, pattern)
        acls, _ = self.data.resource_acls(resource)
        self.authorizer.replace_resource(resource, acls)
        log.info("ACLs changed", resource_type=ZK_RESOURCE_TYPES[resource[0]], name=resource[1],
                 pattern="PREFIXED" if resource[2] == PREFIXED else "LITERAL", acls=len(acls))
