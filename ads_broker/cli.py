"""`ads-broker` command line: serve, topic and group admin, dump-log, cut-unsynced (fault tests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import structlog
import typer

from ads_broker import __version__
from ads_broker.exceptions import BrokerError

app = typer.Typer(help="Kafka-wire-compatible log broker written in Python (the ADS broker core).",
                  no_args_is_help=True, pretty_exceptions_enable=False)
topics_app = typer.Typer(help="Create, list, describe and delete topics (through the Kafka protocol).",
                         no_args_is_help=True)
groups_app = typer.Typer(help="List and describe consumer groups.", no_args_is_help=True)
users_app = typer.Typer(help="SASL users: salted SCRAM credentials in the data dir or, for a cluster, in "
                             "ZooKeeper (docs/SECURITY.md).",
                        no_args_is_help=True)
app.add_typer(topics_app, name="topics")
app.add_typer(groups_app, name="groups")
acls_app = typer.Typer(help="ACLs in the data dir or, for a cluster, in ZooKeeper, as kafka-acls.sh manages them "
                            "(docs/SECURITY.md).",
                       no_args_is_help=True)
app.add_typer(users_app, name="users")
cluster_app = typer.Typer(help="A development cluster on this machine: ZooKeeper and N brokers (docs/CLUSTER.md).",
                          no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")
app.add_typer(acls_app, name="acls")

Bootstrap = Annotated[str, typer.Option("--bootstrap-server", "-b", help="HOST:PORT of a broker")]


def configure_logging(level: str = "info", json: bool = True) -> None:
    """Structured logs: one JSON object per line on stderr (console rendering with --log-format console)."""
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False),
    ]
    structlog.configure(processors=processors,
                        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr), cache_logger_on_first_use=True)


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


@app.command()
def serve(
    data_dir: Annotated[Path, typer.Option(help="log directory (topics, offsets, checkpoints)")],
    listen: Annotated[str | None, typer.Option(help="HOST:PORT to listen on [default: listeners from "
                                                    "--config, else 127.0.0.1:9092]")] = None,
    advertised_listener: Annotated[str | None, typer.Option(help="HOST:PORT given to clients")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="server.properties-style file")] = None,
    override: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, Kafka config names; repeatable")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error")] = "info",
    log_format: Annotated[str, typer.Option(help="json or console")] = "json",
) -> None:
    """Run the broker until SIGTERM/SIGINT (graceful: flush, checkpoint, clean-shutdown marker)."""
    from ads_broker import memtrace
    from ads_broker.config import BrokerConfig, split_override
    from ads_broker.server import BrokerServer

    configure_logging(log_level, json=log_format == "json")
    try:
        overrides = dict(split_override(o) for o in override or [])
        if listen:
            overrides.setdefault("listeners", listen)
        if advertised_listener:
            overrides["advertised.listeners"] = advertised_listener
        overrides["log.dirs"] = str(data_dir)
        cfg = BrokerConfig.load(config, overrides)
        server = BrokerServer(data_dir, cfg)
        memtrace.start_from_env()  # ADS_BROKER_TRACEMALLOC: leak hunts only (docs/FUZZING.md)
        asyncio.run(server.run_until_signalled())
    except BrokerError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot serve: {e}")


@app.command()
def configs() -> None:
    """List the broker config names this broker knows, with their defaults."""
    from ads_broker.config import SETTINGS

    for s in SETTINGS:
        default = "null" if s.default is None else s.default  # Kafka's word for an unset default
        typer.echo(f"{s.name}={default}" + (f"    # {s.doc}" if s.doc else ""))


@app.command("dump-log")
def dump_log(
    path: Annotated[Path, typer.Argument(help="a segment file, e.g. data/t-0/00000000000000000000.log")],
) -> None:
    """Decode a segment file batch by batch and record by record, like kafka-dump-log."""
    from ads_broker.log.dump import dump_log as dump

    if not path.is_file():
        fail(f"{path} is not a file; pass a .log segment file")
    try:
        for line in dump(path):
            typer.echo(line)
    except BrokerError as e:
        fail(f"{path}: {e}")


@app.command("cut-unsynced")
def cut_unsynced(
    data_dir: Annotated[Path, typer.Option(help="data dir of a STOPPED (SIGKILLed) broker that ran with "
                                                "ADS_BROKER_FAULT_FILE set")],
) -> None:
    """Tests only: play a power cut, truncating every segment to its last fsynced length."""
    from ads_broker.faults import cut_to_synced

    if not data_dir.is_dir():
        fail(f"{data_dir} is not a directory; pass the broker's --data-dir")
    try:
        cuts = cut_to_synced(data_dir)
    except OSError as e:
        fail(f"cannot cut {data_dir}: {e}")
    for cut in cuts:
        typer.echo(f"{cut.path}\t{cut.size} -> {cut.synced} bytes ({cut.lost_bytes} lost)")
    typer.echo(f"Cut {len(cuts)} segment(s), {sum(c.lost_bytes for c in cuts)} bytes.")


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    # Producer-type handles default to allow.auto.create.topics=true: `describe` of a missing topic
    # would create it on a broker with auto.create.topics.enable.
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000, "allow.auto.create.topics": False})


def _result(future: Any, what: str) -> Any:
    from confluent_kafka import KafkaException

    try:
        return future.result(timeout=30)
    except KafkaException as e:
        fail(f"{what}: {e.args[0].str() if e.args else e}")
    except TimeoutError:
        fail(f"{what}: no answer from the broker within 30 s")


@topics_app.command("create")
def topics_create(
    topic: str, bootstrap: Bootstrap = "127.0.0.1:9092",
    partitions: Annotated[int, typer.Option(help="number of partitions")] = 1,
    replication_factor: Annotated[int, typer.Option(help="replicas per partition (cluster mode); -1: the "
                                                         "broker's default.replication.factor")] = -1,
    config: Annotated[list[str] | None, typer.Option(help="KEY=VALUE topic config; repeatable")] = None,
) -> None:
    """Create a topic."""
    from confluent_kafka.admin import NewTopic

    from ads_broker.config import split_override

    try:
        cfg = dict(split_override(c) for c in config or [])
    except BrokerError as e:
        fail(str(e))
    admin = _admin(bootstrap)  # must outlive its futures: a destroyed client fails them
    futures = admin.create_topics([NewTopic(topic, partitions, replication_factor, config=cfg)],
                                  request_timeout=30)
    _result(futures[topic], f"create topic {topic!r}")
    typer.echo(f"Created topic {topic} with {partitions} partition(s).")


@topics_app.command("list")
def topics_list(bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """List topics."""
    md = _admin(bootstrap).list_topics(timeout=30)
    for name in sorted(md.topics):
        typer.echo(name)


@topics_app.command("describe")
def topics_describe(topic: str, bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """Partitions, offsets and configs of a topic."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import ConfigResource

    admin = _admin(bootstrap)
    md = admin.list_topics(topic, timeout=30)
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None:
        fail(f"topic {topic!r}: {tmd.error.str() if tmd is not None and tmd.error else 'unknown'}")
    assert tmd is not None
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ads-broker-cli", "enable.auto.commit": False})
    try:
        typer.echo(f"Topic: {topic}\tPartitionCount: {len(tmd.partitions)}")
        for p in sorted(tmd.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            pm = tmd.partitions[p]
            typer.echo(f"\tPartition: {p}\tLeader: {pm.leader}\tReplicas: {list(pm.replicas)}\tIsr: {list(pm.isrs)}"
                       f"\tLogStartOffset: {low}\tHighWatermark: {high}")
    finally:
        consumer.close()
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = _result(admin.describe_configs([res])[res], f"describe configs of {topic!r}")
    for name in sorted(entries):
        e = entries[name]
        typer.echo(f"\t{name}={e.value}" + ("" if e.is_default else "  (set on the topic)"))


@topics_app.command("delete")
def topics_delete(topic: str, bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """Delete a topic and its data."""
    admin = _admin(bootstrap)
    futures = admin.delete_topics([topic], request_timeout=30)
    _result(futures[topic], f"delete topic {topic!r}")
    typer.echo(f"Deleted topic {topic}.")


@groups_app.command("list")
def groups_list(bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """List consumer groups with their state."""
    admin = _admin(bootstrap)
    result = _result(admin.list_consumer_groups(request_timeout=30), "list groups")
    for g in sorted(result.valid, key=lambda g: g.group_id):
        typer.echo(f"{g.group_id}\t{g.state.name}")


@groups_app.command("describe")
def groups_describe(group: str, bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """Members, assignments and committed offsets of a group."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = _admin(bootstrap)
    desc = _result(admin.describe_consumer_groups([group], request_timeout=30)[group], f"describe group {group!r}")
    typer.echo(f"Group: {group}\tState: {desc.state.name}\tProtocol: {desc.partition_assignor}")
    for m in desc.members:
        assigned = m.assignment.topic_partitions if m.assignment else []
        parts = ", ".join(f"{tp.topic}-{tp.partition}" for tp in assigned)
        typer.echo(f"\tMember: {m.member_id}\tClient: {m.client_id}@{m.host}\tAssigned: {parts}")
    offsets = _result(admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group],
                      f"committed offsets of {group!r}")
    for tp in sorted(offsets.topic_partitions, key=lambda t: (t.topic, t.partition)):
        typer.echo(f"\t{tp.topic}-{tp.partition}\tcommitted: {tp.offset}")


DataDir = Annotated[Path | None, typer.Option(help="the broker's data directory (a single node)")]
ZkConnect = Annotated[str | None, typer.Option(
    "--zookeeper-connect", help="zookeeper.connect of a cluster (HOST:PORT[/chroot]): ACLs and users live there, "
                                "shared by every broker (Kafka's kafka-acls / kafka-configs --zookeeper)")]


def _target(data_dir: Path | None, zookeeper_connect: str | None) -> None:
    if (data_dir is None) == (zookeeper_connect is None):
        fail("give --data-dir (a single-node broker's data dir) or --zookeeper-connect (a cluster), not both")


@contextlib.contextmanager
def _zookeeper(connect: str) -> Iterator[Any]:
    """The ACL and user znodes of the cluster at ``connect`` (a ZooKeeperUnavailableError fails)."""
    from ads_broker.cluster.exceptions import ZooKeeperUnavailableError
    from ads_broker.cluster.zookeeper import KafkaZkClient
    from ads_broker.security.zk_store import ZkSecurityData

    try:
        zk = KafkaZkClient(connect, connection_timeout_ms=10000).start()
    except ZooKeeperUnavailableError as e:
        fail(f"{e}; is ZooKeeper running, and is --zookeeper-connect the brokers' zookeeper.connect?")
        raise
    try:
        data = ZkSecurityData(zk.client)
        data.ensure_paths()
        yield data
    finally:
        zk.close()


@users_app.command("add")
def users_add(
    user: str,
    data_dir: DataDir = None,
    zookeeper_connect: ZkConnect = None,
    password: Annotated[str | None, typer.Option(help="[default: prompt; or ADS_BROKER_USER_PASSWORD]",
                                                 envvar="ADS_BROKER_USER_PASSWORD")] = None,
    mechanism: Annotated[list[str] | None, typer.Option(
        help="SCRAM-SHA-256 and/or SCRAM-SHA-512; repeatable [default: both]")] = None,
    iterations: Annotated[int, typer.Option(help="PBKDF2 iterations (4096..16384)")] = 4096,
) -> None:
    """Add a user or change its password (takes effect on running brokers at the next login)."""
    from ads_broker.security.scram import (
        MAX_ITERATIONS,
        MIN_ITERATIONS,
        SCRAM_MECHANISMS,
        CredentialStore,
        ScramCredential,
        validate_user_name,
    )

    _target(data_dir, zookeeper_connect)
    try:
        validate_user_name(user)
    except ValueError as e:
        fail(str(e))
    mechanisms = mechanism or list(SCRAM_MECHANISMS)
    for m in mechanisms:
        if m not in SCRAM_MECHANISMS:
            fail(f"unknown mechanism {m!r}; expected {' or '.join(SCRAM_MECHANISMS)}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        fail(f"--iterations must be in {MIN_ITERATIONS}..{MAX_ITERATIONS} (Kafka's bounds)")
    if password is None:
        password = typer.prompt("password", hide_input=True, confirmation_prompt=True)
    if not password:
        fail("the password is empty")
    credentials = {m: ScramCredential.from_password(m, password, iterations) for m in mechanisms}
    if zookeeper_connect is not None:
        with _zookeeper(zookeeper_connect) as zk:
            zk.alter_user(user, [], credentials)
    else:
        assert data_dir is not None
        store = CredentialStore(data_dir)
        try:
            for m, credential in credentials.items():
                store.upsert(user, m, credential)
        except (BrokerError, OSError) as e:
            fail(str(e))
    typer.echo(f"user {user}: {', '.join(mechanisms)}")


@users_app.command("delete")
def users_delete(
    user: str,
    data_dir: DataDir = None,
    zookeeper_connect: ZkConnect = None,
    mechanism: Annotated[str | None, typer.Option(help="only this mechanism's credential")] = None,
) -> None:
    """Delete a user (or one of its mechanisms); open connections stay authenticated."""
    from ads_broker.security.scram import CredentialStore

    _target(data_dir, zookeeper_connect)
    where = zookeeper_connect or str(data_dir)
    if zookeeper_connect is not None:
        with _zookeeper(zookeeper_connect) as zk:
            deleted, _ = zk.delete_user(user, mechanism)
    else:
        assert data_dir is not None
        try:
            deleted = CredentialStore(data_dir).delete(user, mechanism)
        except (BrokerError, OSError) as e:
            fail(str(e))
    if not deleted:
        fail(f"no user {user!r}" + (f" with {mechanism}" if mechanism else "") + f" in {where}")
    typer.echo(f"deleted {user}" + (f" ({mechanism})" if mechanism else ""))


@users_app.command("list")
def users_list(data_dir: DataDir = None, zookeeper_connect: ZkConnect = None) -> None:
    """Users and their mechanisms (iterations); never a secret."""
    from ads_broker.security.scram import CredentialStore

    _target(data_dir, zookeeper_connect)
    if zookeeper_connect is not None:
        with _zookeeper(zookeeper_connect) as zk:
            users = zk.all_users()
    else:
        assert data_dir is not None
        try:
            users = CredentialStore(data_dir).users()
        except BrokerError as e:
            fail(str(e))
    for name, creds in sorted(users.items()):
        typer.echo(f"{name}\t" + ", ".join(f"{m} (iterations={c.iterations})" for m, c in sorted(creds.items())))


@users_app.command("migrate")
def users_migrate(
    data_dir: Annotated[Path, typer.Option(help="the data dir whose __scram_credentials.json moves")],
    zookeeper_connect: Annotated[str, typer.Option("--zookeeper-connect", help="the cluster's zookeeper.connect")],
) -> None:
    """Move a data dir's SCRAM credentials into the cluster's ZooKeeper, once, so the broker can
    join the cluster: a credential ZooKeeper already has for a user and mechanism is kept (it may
    be newer); the file is renamed to __scram_credentials.json.migrated."""
    from ads_broker.security.scram import CREDENTIALS_FILE, CredentialStore

    path = data_dir / CREDENTIALS_FILE
    if not path.exists():
        fail(f"{path} does not exist: nothing to migrate")
    try:
        local = CredentialStore(data_dir).users()
    except BrokerError as e:
        fail(str(e))
    with _zookeeper(zookeeper_connect) as zk:
        for user, creds in sorted(local.items()):
            kept: list[str] = []

            def merge(current: dict[str, Any], creds: dict[str, Any] = creds, kept: list[str] = kept) -> dict[str, Any]:
                kept[:] = [m for m in creds if m in current]
                return {**creds, **current}

            zk.update_user(user, merge)
            added = [m for m in sorted(creds) if m not in kept]
            typer.echo(f"user {user}: " + (f"added {', '.join(added)}" if added else "nothing added")
                       + (f"; kept ZooKeeper's {', '.join(kept)}" if kept else ""))
    path.rename(path.with_name(CREDENTIALS_FILE + ".migrated"))
    typer.echo(f"renamed {path} to {CREDENTIALS_FILE}.migrated")


Principals = Annotated[list[str] | None, typer.Option(help="User:name or User:*; repeatable")]
Names = Annotated[list[str] | None, typer.Option(help="repeatable")]


def _acl_bindings(allow_principal: list[str] | None, deny_principal: list[str] | None, allow_host: list[str] | None,
                  deny_host: list[str] | None, operation: list[str] | None, topic: list[str] | None,
                  group: list[str] | None, cluster: bool, transactional_id: list[str] | None,
                  resource_pattern_type: str) -> list[Any]:
    """kafka-acls.sh's product: every principal x host x operation x resource given."""
    from ads_broker.security.acl import (
        ALLOW,
        CLUSTER,
        CLUSTER_NAME,
        DENY,
        GROUP,
        OPERATIONS,
        PATTERN_TYPES,
        TOPIC,
        TRANSACTIONAL_ID,
        Acl,
        AclError,
    )

    pattern = PATTERN_TYPES.get(resource_pattern_type.upper(), 0)
    if pattern not in (PATTERN_TYPES["LITERAL"], PATTERN_TYPES["PREFIXED"]):
        fail(f"--resource-pattern-type must be LITERAL or PREFIXED, not {resource_pattern_type!r}")
    resources = ([(TOPIC, t) for t in topic or []] + [(GROUP, g) for g in group or []]
                 + [(TRANSACTIONAL_ID, t) for t in transactional_id or []]
                 + ([(CLUSTER, CLUSTER_NAME)] if cluster else []))
    if not resources:
        fail("name at least one resource: --topic, --group, --transactional-id or --cluster")
    ops = []
    for name in operation or []:
        code = OPERATIONS.get(name.upper().replace("-", "_"), 0)
        if code in (0, OPERATIONS["ANY"]):
            fail(f"unknown operation {name!r}; expected one of {', '.join(k for k in OPERATIONS if k != 'ANY')}")
        ops.append(code)
    acls = []
    for permission, principals, hosts in ((ALLOW, allow_principal, allow_host), (DENY, deny_principal, deny_host)):
        for principal in principals or []:
            for host in hosts or ["*"]:
                for op in ops:
                    for rtype, name in resources:
                        acl = Acl(rtype, name, pattern if rtype != CLUSTER else PATTERN_TYPES["LITERAL"],
                                  principal, host, op, permission)
                        try:
                            acl.validate()
                        except AclError as e:
                            fail(str(e))
                        acls.append(acl)
    return acls


@acls_app.command("add")
def acls_add(
    data_dir: DataDir = None,
    zookeeper_connect: ZkConnect = None,
    allow_principal: Principals = None,
    deny_principal: Principals = None,
    allow_host: Annotated[list[str] | None, typer.Option(help="IP address or * [default: *]")] = None,
    deny_host: Annotated[list[str] | None, typer.Option(help="IP address or * [default: *]")] = None,
    operation: Annotated[list[str] | None, typer.Option(
        help="READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, "
             "IDEMPOTENT_WRITE or ALL; repeatable")] = None,
    topic: Names = None,
    group: Names = None,
    cluster: Annotated[bool, typer.Option("--cluster", help="the Cluster resource")] = False,
    transactional_id: Names = None,
    resource_pattern_type: Annotated[str, typer.Option(help="LITERAL or PREFIXED")] = "LITERAL",
) -> None:
    """Add ACLs (kafka-acls.sh --add); running brokers pick them up (a second for a data dir, a
    ZooKeeper notification for a cluster)."""
    from ads_broker.security.acl import AclError, AclStore

    _target(data_dir, zookeeper_connect)
    acls = _acl_bindings(allow_principal, deny_principal, allow_host, deny_host, operation, topic, group, cluster,
                         transactional_id, resource_pattern_type)
    if not acls:
        fail("give --allow-principal or --deny-principal and at least one --operation")
    if zookeeper_connect is not None:
        with _zookeeper(zookeeper_connect) as zk:
            try:
                zk.create_acls(acls)
            except AclError as e:  # a name that is not one znode name; nothing was written
                fail(str(e))
    else:
        assert data_dir is not None
        store = AclStore(data_dir)
        try:
            current = store.load()
            store.save(current + [a for a in dict.fromkeys(acls) if a not in current])
        except (KeyError, ValueError, OSError) as e:
            fail(str(e))
    for acl in acls:
        typer.echo(f"added {acl.describe()}")


@acls_app.command("remove")
def acls_remove(
    data_dir: DataDir = None,
    zookeeper_connect: ZkConnect = None,
    allow_principal: Principals = None,
    deny_principal: Principals = None,
    allow_host: Annotated[list[str] | None, typer.Option(help="IP address or * [default: *]")] = None,
    deny_host: Annotated[list[str] | None, typer.Option(help="IP address or * [default: *]")] = None,
    operation: Names = None,
    topic: Names = None,
    group: Names = None,
    cluster: Annotated[bool, typer.Option("--cluster", help="the Cluster resource")] = False,
    transactional_id: Names = None,
    resource_pattern_type: Annotated[str, typer.Option(help="LITERAL or PREFIXED")] = "LITERAL",
) -> None:
    """Remove the ACLs given (kafka-acls.sh --remove); without principals and operations, every
    ACL on the resources given."""
    from ads_broker.security.acl import CLUSTER, AclStore

    _target(data_dir, zookeeper_connect)
    if allow_principal or deny_principal:
        bindings = _acl_bindings(allow_principal, deny_principal, allow_host, deny_host, operation, topic, group,
                                 cluster, transactional_id, resource_pattern_type)
    else:
        resources = {(2, t) for t in topic or []} | {(3, g) for g in group or []} | {
            (5, t) for t in transactional_id or []} | ({(CLUSTER, "kafka-cluster")} if cluster else set())
        if not resources:
            fail("name at least one resource: --topic, --group, --transactional-id or --cluster")
    pattern = resource_pattern_type.upper()

    def to_remove(current: list[Any]) -> list[Any]:
        if allow_principal or deny_principal:
            return [a for a in current if a in set(bindings)]
        return [a for a in current if (a.resource_type, a.resource_name) in resources
                and (a.resource_type == CLUSTER or a.to_json()["pattern_type"] == pattern)]

    if zookeeper_connect is not None:
        with _zookeeper(zookeeper_connect) as zk:
            current = [a for acls in zk.all_acls().values() for a in acls]
            gone = to_remove(current)
            for resource in sorted({(a.resource_type, a.resource_name, a.pattern_type) for a in gone}):
                zk.update_resource(resource, lambda cur: [a for a in cur if a not in gone])
    else:
        assert data_dir is not None
        store = AclStore(data_dir)
        try:
            current = store.load()
        except (KeyError, ValueError, OSError) as e:
            fail(str(e))
        gone = to_remove(current)
        if gone:
            try:
                store.save([a for a in current if a not in gone])
            except OSError as e:
                fail(str(e))
    for acl in gone:
        typer.echo(f"removed {acl.describe()}")
    if not gone:
        fail("no matching ACL")


@acls_app.command("list")
def acls_list(
    data_dir: DataDir = None,
    zookeeper_connect: ZkConnect = None,
    principal: Annotated[str | None, typer.Option(help="only this principal's ACLs")] = None,
    topic: Annotated[str | None, typer.Option(help="only ACLs that apply to this topic")] = None,
    group: Annotated[str | None, typer.Option(help="only ACLs that apply to this group")] = None,
) -> None:
    """The ACLs, one per line: RESOURCE:PATTERN:NAME PRINCIPAL PERMISSION OPERATION from host HOST."""
    from ads_broker.security.acl import GROUP, MATCH, TOPIC, AclFilter, AclStore

    _target(data_dir, zookeeper_connect)
    if zookeeper_connect is not None:
        with _zookeeper(zookeeper_connect) as zk:
            acls = [a for _, found in sorted(zk.all_acls().items()) for a in found]
    else:
        assert data_dir is not None
        try:
            acls = AclStore(data_dir).load()
        except (KeyError, ValueError, OSError) as e:
            fail(str(e))
    filters = [AclFilter(principal=principal)]
    if topic is not None:
        filters.append(AclFilter(TOPIC, topic, MATCH))
    if group is not None:
        filters.append(AclFilter(GROUP, group, MATCH))
    for acl in acls:
        if all(f.matches(acl) for f in filters):
            typer.echo(acl.describe())


@acls_app.command("migrate")
def acls_migrate(
    data_dir: Annotated[Path, typer.Option(help="the data dir whose __acls.json moves")],
    zookeeper_connect: Annotated[str, typer.Option("--zookeeper-connect", help="the cluster's zookeeper.connect")],
) -> None:
    """Add a data dir's ACLs to the cluster's ZooKeeper, once, so the broker can join the cluster
    (each ACL added is printed: review them, an ACL revoked elsewhere comes back if the file still
    has it); the file is renamed to __acls.json.migrated."""
    from ads_broker.security.acl import ACL_FILE, AclStore

    store = AclStore(data_dir)
    if not store.path.exists():
        fail(f"{store.path} does not exist: nothing to migrate")
    try:
        acls = store.load()
    except (KeyError, ValueError, OSError) as e:
        fail(str(e))
    with _zookeeper(zookeeper_connect) as zk:
        zk.create_acls(acls)
    for acl in acls:
        typer.echo(f"added {acl.describe()}")
    store.path.rename(store.path.with_name(ACL_FILE + ".migrated"))
    typer.echo(f"renamed {store.path} to {ACL_FILE}.migrated")


ClusterDir = Annotated[Path, typer.Option("--dir", help="the cluster's root: data dirs, logs, cluster.json")]


@cluster_app.command("up")
def cluster_up(
    root: ClusterDir = Path("ads-cluster"),
    brokers: Annotated[int, typer.Option(help="number of brokers (ids 1..N)")] = 3,
    base_port: Annotated[int | None, typer.Option(help="broker i listens on BASE_PORT + i - 1 [default: free "
                                                       "ports, kept for the next up]")] = None,
    zookeeper: Annotated[str | None, typer.Option(help="zookeeper.connect of a running ZooKeeper [default: start "
                                                       "one from Debian's zookeeper package]")] = None,
    override: Annotated[list[str] | None, typer.Option(help="KEY=VALUE for every broker; repeatable")] = None,
    listener: Annotated[list[str] | None, typer.Option(
        help="a listener every broker gets besides PLAINTEXT (SSL, SASL_SSL, SASL_PLAINTEXT, or a name of "
             "listener.security.protocol.map), each on a port of its own listed in cluster.json; repeatable. "
             "Its ssl.*/sasl.* settings come with --override or --config")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="server.properties-style file for every broker (--override wins over it)")] = None,
) -> None:
    """Start ZooKeeper and the brokers in the background; return once all are registered."""
    from ads_broker.cluster.exceptions import ClusterError
    from ads_broker.cluster.local import up
    from ads_broker.config import split_override

    try:
        overrides = dict(split_override(o) for o in override or [])
        state = up(root, brokers=brokers, base_port=base_port, zookeeper=zookeeper, overrides=overrides,
                   listeners=listener or [], config_file=config)
    except (BrokerError, ClusterError, OSError) as e:
        fail(f"cluster up: {e}")
    typer.echo(f"cluster {state.cluster_id}: {len(state.brokers)} broker(s) up, zookeeper.connect="
               f"{state.zookeeper_connect}")
    typer.echo(f"bootstrap.servers={state.bootstrap}")
    for name in state.listener_names[1:]:
        typer.echo(f"{name}: bootstrap.servers={state.bootstrap_for(name)}")
    typer.echo(f"stop it with: ads-broker cluster down --dir {root}")


@cluster_app.command("down")
def cluster_down(
    root: ClusterDir = Path("ads-cluster"),
    timeout: Annotated[float, typer.Option(help="seconds each broker gets for its controlled shutdown")] = 60.0,
) -> None:
    """Stop the brokers (controlled shutdown, one at a time), then ZooKeeper; the data is kept."""
    from ads_broker.cluster.exceptions import ClusterError
    from ads_broker.cluster.local import down

    try:
        lines = down(root, timeout)
    except ClusterError as e:
        fail(f"cluster down: {e}")
    for line in lines:
        typer.echo(line)


@cluster_app.command("status")
def cluster_status(root: ClusterDir = Path("ads-cluster")) -> None:
    """Each process of the cluster: running or not, its address and log. Exit 1 unless all run."""
    from ads_broker.cluster.exceptions import ClusterError
    from ads_broker.cluster.local import status

    try:
        state, lines = status(root)
    except ClusterError as e:
        fail(f"cluster status: {e}")
    for line in lines:
        typer.echo(line)
    typer.echo(f"bootstrap.servers={state.bootstrap}")
    if any("not running" in line for line in lines):
        raise typer.Exit(1)


def main() -> None:
    app(prog_name="ads-broker")
