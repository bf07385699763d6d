"""Broker configuration: Kafka's config names, a properties file plus command-line overrides.

``BrokerConfig.load(path, overrides)`` reads a Kafka-style ``server.properties`` file (``key=value``
lines, ``#`` comments), applies ``--override key=value`` pairs on top and validates every value
against the table below. Unknown keys are an error (a typo must not silently fall back to a
default). Topic-level defaults (``log.segment.bytes`` → ``segment.bytes`` …) are derived from the
broker settings exactly as Kafka derives them, and CreateTopics configs override them per topic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from ads_broker.exceptions import ConfigError, InvalidConfigurationError
from ads_broker.log.config import COMPRESSION_TYPES
from ads_broker.security.acl import AUTHORIZER_CLASSES
from ads_broker.security.listeners import (
    DEFAULT_PROTOCOL_MAP,
    parse_endpoints,
    validate_listeners,
    validate_protocol_map,
)

LONG_MAX = 2**63 - 1


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError("expected true or false")
    return lowered == "true"


def _listen(value: str) -> str:
    """``listeners``/``advertised.listeners``: ``NAME://HOST:PORT`` entries or a bare ``HOST:PORT``."""
    return validate_listeners(value)


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise ValueError("expected a TCP port, 0 to 65535")
    return port


def _authorizer_class(value: str) -> str:
    if value and value not in AUTHORIZER_CLASSES:
        raise ValueError(f"unknown authorizer {value!r}: use one of {', '.join(sorted(AUTHORIZER_CLASSES))}")
    return value


def _java_integer(bits: int, kind: str) -> Callable[[str], int]:
    """Kafka's SHORT/INT/LONG parse: an integer within the Java type's range."""
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def parse(value: str) -> int:
        number = int(value)
        if not low <= number <= high:
            raise ValueError(f"expected a {kind} ({low} to {high})")
        return number
    return parse


_short = _java_integer(16, "SHORT")
_long = _java_integer(64, "LONG")


def _optional(value: str) -> str | None:
    """A STRING config whose default is null (Kafka's ``sasl.kerberos.service.name``)."""
    return value or None


def _security_protocol(value: str) -> str:
    from ads_broker.security.interbroker import validate_security_protocol

    return validate_security_protocol(value)


def _jaas_config(value: str) -> str:
    """Checked as a JAAS entry; a bad one is a ConfigError that never shows the value (a password)."""
    if value:
        from ads_broker.security.sasl_client import parse_jaas_config

        parse_jaas_config(value)
    return value


def _jwks_url(value: str) -> str:
    if value and not value.lower().startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL of the JWKS (file URLs are not read)")
    return value


def _compression_type(value: str) -> str:
    if value not in COMPRESSION_TYPES:
        raise ValueError(f"expected one of {', '.join(COMPRESSION_TYPES)}")
    return value


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    parse: Callable[[str], Any]
    default: Any
    minimum: int | None = None
    doc: str = ""
    topic_name: str | None = None  # the topic-level name this broker default feeds


SETTINGS: tuple[Setting, ...] = (
    Setting("listeners", _listen, "127.0.0.1:9092",
            doc="NAME://HOST:PORT entries the broker binds (a bare HOST:PORT is PLAINTEXT); docs/SECURITY.md"),
    Setting("advertised.listeners", lambda v: _listen(v) if v else v, "",
            doc="NAME://HOST:PORT given to clients of each listener in Metadata (default: listeners)"),
    Setting("broker.id", int, 0, 0, doc="this node's id"),
    Setting("cluster.id", str, "ads-cluster", doc="cluster id returned in Metadata"),
    Setting("num.partitions", int, 1, 1, doc="partitions of auto-created topics"),
    Setting("default.replication.factor", int, 1, 1),
    Setting("auto.create.topics.enable", _bool, True),
    Setting("delete.topic.enable", _bool, True),
    Setting("message.max.bytes", int, 1048588, 0, topic_name="max.message.bytes"),
    Setting("log.segment.bytes", int, 1073741824, 14, topic_name="segment.bytes"),
    Setting("log.roll.ms", int, 604800000, 1, topic_name="segment.ms"),
    # Kafka's precedence: log.retention.ms, else log.retention.minutes, else log.retention.hours
    # (BrokerConfig.log_retention_time_ms); the first two are null unless set.
    Setting("log.retention.ms", int, None, topic_name="retention.ms",
            doc="retention of a topic's data (default: log.retention.minutes, else log.retention.hours)"),
    Setting("log.retention.minutes", int, None, doc="retention in minutes, if log.retention.ms is not set"),
    Setting("log.retention.hours", int, 168,
            doc="retention in hours, if neither log.retention.ms nor log.retention.minutes is set"),
    Setting("log.retention.bytes", int, -1, -1, topic_name="retention.bytes"),
    Setting("log.retention.check.interval.ms", int, 300000, 1),
    Setting("log.flush.interval.messages", int, LONG_MAX, 1, topic_name="flush.messages"),
    Setting("log.flush.interval.ms", int, LONG_MAX, 0, topic_name="flush.ms"),
    Setting("log.flush.scheduler.interval.ms", int, 1000, 1, doc="how often the flusher checks flush.ms"),
    Setting("log.index.interval.bytes", int, 4096, 0, topic_name="index.interval.bytes"),
    Setting("log.index.size.max.bytes", int, 10485760, 4, topic_name="segment.index.bytes"),
    Setting("log.message.timestamp.type", str, "CreateTime", topic_name="message.timestamp.type"),
    Setting("compression.type", _compression_type, "producer", topic_name="compression.type",
            doc="codec client batches are stored with: producer (as sent), uncompressed, gzip, snappy, lz4 or zstd; "
                "other than producer, the broker recompresses batches sent with another codec"),
    # -- log: record validation and segment files (issue 12: timestamps, file descriptors) --
    Setting("log.message.timestamp.before.max.ms", int, LONG_MAX, 0, topic_name="message.timestamp.before.max.ms",
            doc="a CreateTime record older than this (vs the broker clock) is refused with INVALID_TIMESTAMP"),
    Setting("log.message.timestamp.after.max.ms", int, 3600000, 0, topic_name="message.timestamp.after.max.ms",
            doc="a CreateTime record further in the future than this is refused with INVALID_TIMESTAMP "
                "(Kafka 4.0's default; one far-future record would pin retention and segment rolls)"),
    Setting("log.open.segment.files.max", int, 512, 1,
            doc="not a Kafka setting: idle read descriptors of segment files kept open (LRU); inactive segments "
                "hold no write descriptors, so open files are about 3 per partition plus this"),
    Setting("log.cleanup.policy", str, "delete", topic_name="cleanup.policy"),
    Setting("log.segment.delete.delay.ms", int, 60000, 0, topic_name="file.delete.delay.ms"),
    Setting("log.cleaner.enable", _bool, True, doc="run the log cleaner (compaction) thread"),
    Setting("log.cleaner.dedupe.buffer.size", int, 134217728, 1024,
            doc="bytes of the cleaner's key->offset map (24 bytes per key); a full map cleans a prefix"),
    Setting("log.cleaner.io.buffer.size", int, 524288, 0,
            doc="bytes of the cleaner's I/O buffers (read and write buffer a quarter each, the rest for the pass's "
                "other allocations); a pass allocates at most dedupe.buffer.size + this"),
    Setting("log.cleaner.io.max.bytes.per.second", float, 1.7976931348623157e308, 1,
            doc="cleaner I/O throttle (bytes read plus written per second)"),
    Setting("log.cleaner.backoff.ms", int, 15000, 0, doc="cleaner sleep when no log is cleanable"),
    Setting("log.cleaner.min.cleanable.ratio", float, 0.5, 0, topic_name="min.cleanable.dirty.ratio"),
    Setting("log.cleaner.delete.retention.ms", int, 86400000, 0, topic_name="delete.retention.ms"),
    Setting("log.cleaner.min.compaction.lag.ms", int, 0, 0, topic_name="min.compaction.lag.ms"),
    Setting("log.cleaner.max.compaction.lag.ms", int, 2**63 - 1, 1, topic_name="max.compaction.lag.ms"),
    Setting("producer.id.expiration.ms", int, 86400000, 1),
    Setting("producer.id.expiration.check.interval.ms", int, 600000, 1),
    Setting("group.initial.rebalance.delay.ms", int, 100, 0,
            doc="Kafka's default is 3000; a small delay lets a lone consumer join in well under a second"),
    Setting("group.min.session.timeout.ms", int, 6000, 0),
    Setting("group.max.session.timeout.ms", int, 1800000, 0),
    Setting("group.max.size", int, 2**31 - 1, 1),
    Setting("offsets.topic.num.partitions", int, 50, 1),
    Setting("offsets.topic.replication.factor", int, 3, 1,
            doc="cluster mode: replicas of __consumer_offsets; until this many brokers are alive the topic is not "
                "created and FindCoordinator answers COORDINATOR_NOT_AVAILABLE (a single node always uses 1)"),
    Setting("offsets.commit.timeout.ms", int, 5000, 1,
            doc="cluster mode: how long an offset commit (and a transaction state change) waits for the ISR to "
                "replicate it before COORDINATOR_NOT_AVAILABLE"),
    Setting("offsets.retention.minutes", int, 10080, 1,
            doc="committed offsets of a group without members expire this long after it became empty "
                "(standalone commits: after their commit time); KIP-211"),
    Setting("offsets.retention.ms", int, -1, -1,
            doc="not a Kafka setting: the same retention in milliseconds, used instead of "
                "offsets.retention.minutes when set (as log.retention.ms overrides log.retention.minutes); -1: unset"),
    Setting("offsets.retention.check.interval.ms", int, 600000, 1,
            doc="how often the group coordinator removes expired committed offsets"),
    Setting("transaction.max.timeout.ms", int, 900000, 1,
            doc="the largest transaction.timeout.ms a transactional producer may ask for"),
    Setting("transaction.state.log.num.partitions", int, 50, 1, doc="partitions of __transaction_state"),
    Setting("transaction.state.log.replication.factor", int, 3, 1,
            doc="cluster mode: replicas of __transaction_state; until this many brokers are alive the topic is not "
                "created and FindCoordinator answers COORDINATOR_NOT_AVAILABLE (a single node always uses 1)"),
    Setting("transaction.state.log.min.isr", int, 2, 1,
            doc="cluster mode: min.insync.replicas of __transaction_state (capped at its replication factor)"),
    Setting("transaction.abort.timed.out.transaction.cleanup.interval.ms", int, 10000, 1,
            doc="how often the coordinator aborts transactions older than their timeout"),
    Setting("transactional.id.expiration.ms", int, 604800000, 1,
            doc="a transactional id idle this long (no open transaction) is forgotten"),
    # -- admin and coordinator limits: partitions (CreateTopics, CreatePartitions, auto-creation), offset commits --
    Setting("max.broker.partitions", int, 4000, 1,
            doc="partitions this broker may hold in all, internal topics included (KIP-578's name); beyond it "
                "CreateTopics/CreatePartitions get POLICY_VIOLATION"),
    Setting("max.partitions.per.topic", int, 1000, 1,
            doc="partitions one topic may have (not a Kafka setting); beyond it POLICY_VIOLATION"),
    Setting("max.partitions.per.request", int, 1000, 1,
            doc="new partitions one CreateTopics/CreatePartitions request may create in all (not a Kafka setting): "
                "bounds the work one request does on the event loop; beyond it POLICY_VIOLATION"),
    Setting("offset.metadata.max.bytes", int, 4096, 0,
            doc="longest metadata string of an offset commit; longer is OFFSET_METADATA_TOO_LARGE"),
    Setting("socket.request.max.bytes", int, 104857600, 1),
    Setting("fetch.max.bytes", int, 57671680, 0),
    Setting("max.request.partition.size.limit", int, 2000, 1,
            doc="partitions one DescribeTopicPartitions response may carry at most (the request's own limit "
                "is capped by it)"),
    Setting("max.incremental.fetch.session.cache.slots", int, 1000, 0,
            doc="incremental fetch sessions (KIP-227) the broker keeps; 0: none (every fetch is a full one)"),
    Setting("min.incremental.fetch.session.eviction.ms", int, 120000, 0,
            doc="not a Kafka setting (Kafka's fixed 120000): a fetch session unused this long may be evicted by "
                "any new one; one created longer ago than this, by a new one with more partitions"),
    Setting("num.recovery.threads.per.data.dir", int, 1, 1),
    Setting("log.dirs", str, "", doc="set by --data-dir"),
    # -- network: connections, request memory, listeners, TLS, SASL (issue 12; docs/SECURITY.md) --
    Setting("queued.max.request.bytes", int, 104857600, -1,
            doc="bytes of received and queued requests held at once (all connections); reading pauses above "
                "it. Kafka's default is -1 (unbounded); -1 disables the bound here too"),
    Setting("max.connections", int, 2**31 - 1, 0,
            doc="connections the broker holds; a new one above it is closed at accept"),
    Setting("max.connections.per.ip", int, 2**31 - 1, 0,
            doc="connections from one IP address; a new one above it is closed at accept"),
    Setting("connections.max.idle.ms", int, 600000, 1,
            doc="a connection that neither sends nor receives for this long is closed"),
    Setting("listener.security.protocol.map", validate_protocol_map, DEFAULT_PROTOCOL_MAP,
            doc="NAME:PROTOCOL pairs; PROTOCOL is PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    Setting("ssl.keystore.type", str, "PEM", doc="PEM only (JKS/PKCS12 are JVM formats)"),
    Setting("ssl.keystore.location", str, "",
            doc="PEM file with the server certificate chain and its private key (or use the two settings below)"),
    Setting("ssl.keystore.certificate.chain", str, "", doc="the server certificate chain, PEM text"),
    Setting("ssl.keystore.key", str, "", doc="the server private key, PEM text"),
    Setting("ssl.key.password", str, "", doc="password of an encrypted private key"),
    Setting("ssl.truststore.type", str, "PEM", doc="PEM only"),
    Setting("ssl.truststore.location", str, "", doc="PEM file of CA certificates that sign client certificates"),
    Setting("ssl.truststore.certificates", str, "", doc="CA certificates, PEM text"),
    Setting("ssl.client.auth", str, "none", doc="required, requested or none: client certificates (mTLS)"),
    Setting("ssl.enabled.protocols", str, "TLSv1.2,TLSv1.3", doc="TLS versions accepted"),
    Setting("ssl.cipher.suites", str, "", doc="OpenSSL cipher list for TLS 1.2 (default: Python's)"),
    Setting("ssl.principal.mapping.rules", str, "DEFAULT",
            doc="DEFAULT only: the principal is User:<the certificate subject's full DN>"),
    Setting("sasl.enabled.mechanisms", str, "SCRAM-SHA-256,SCRAM-SHA-512",
            doc="SASL mechanisms offered: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (users: `ads-broker users`)"),
    Setting("sasl.server.max.receive.size", int, 524288, 1,
            doc="largest frame a SASL listener reads before the client has authenticated (Kafka's cap)"),
    Setting("connections.max.reauth.ms", int, 0, 0,
            doc="KIP-368: a positive value is the session lifetime given to SASL clients when they authenticate; "
                "a connection that has not re-authenticated when it ends is closed at its next request. 0: sessions "
                "last as long as their connection. Per listener and mechanism: "
                "listener.name.<listener>.<mechanism>.connections.max.reauth.ms"),
    # -- SASL/OAUTHBEARER (ads_broker/security/oauthbearer.py, docs/SECURITY.md "OAUTHBEARER"); each also per
    #    listener and mechanism: listener.name.<listener>.oauthbearer.<setting> --
    Setting("sasl.server.callback.handler.class", str, "",
            doc="OAUTHBEARER's token validator: org.apache.kafka.common.security.oauthbearer."
                "OAuthBearerValidatorCallbackHandler (signed JWTs checked against sasl.oauthbearer.jwks.endpoint.url); "
                "empty: Kafka's unsecured validator, which needs the listener's OAuthBearerLoginModule "
                "sasl.jaas.config entry (unsigned tokens: tests only)"),
    Setting("sasl.oauthbearer.jwks.endpoint.url", _jwks_url, "",
            doc="http(s) URL of the identity provider's JWKS (the keys that sign tokens)"),
    Setting("sasl.oauthbearer.jwks.endpoint.refresh.ms", int, 3600000, 1,
            doc="how often the JWKS is fetched again (a token naming an unknown kid fetches it at once, at most "
                "every 10 s)"),
    Setting("sasl.oauthbearer.expected.audience", str, "",
            doc="comma-separated audiences; a token's aud must contain one (empty: a token with an aud is refused)"),
    Setting("sasl.oauthbearer.expected.issuer", str, "", doc="a token's iss must equal this (empty: not checked)"),
    Setting("sasl.oauthbearer.sub.claim.name", str, "sub", doc="the claim that names the principal (User:<value>)"),
    Setting("sasl.oauthbearer.scope.claim.name", str, "scope", doc="the claim that holds the token's scope"),
    Setting("sasl.oauthbearer.clock.skew.seconds", int, 30, 0,
            doc="clock difference allowed when checking a token's exp, iat and nbf"),
    # -- authorization (ACLs: ads_broker/security/acl.py, docs/SECURITY.md) --
    Setting("authorizer.class.name", _authorizer_class, "",
            doc="empty: no authorization; kafka.security.authorizer.AclAuthorizer, "
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer or ads_broker.security.acl.AclAuthorizer: "
                "every request is checked against the ACLs (`ads-broker acls`)"),
    Setting("super.users", str, "", doc="principals allowed everything, separated by ';' (User:admin;User:ops)"),
    Setting("allow.everyone.if.no.acl.found", _bool, False,
            doc="allow an action on a resource that no ACL matches (Kafka's default: false)"),
    Setting("request.max.array.elements", int, 100000, 1,
            doc="array elements (topics, partitions, ... all arrays together) one request may carry; a longer "
                "request closes its connection (not a Kafka setting: Kafka bounds arrays by the frame only)"),
    # -- cluster mode: ZooKeeper, controller (ads_broker/cluster/, docs/CLUSTER.md) --
    Setting("zookeeper.connect", str, "",
            doc="HOST:PORT[,HOST:PORT...][/chroot] of ZooKeeper; empty: single-node mode, no ZooKeeper"),
    Setting("zookeeper.session.timeout.ms", int, 18000, 1,
            doc="a broker whose ZooKeeper session is silent this long is declared dead by the controller"),
    Setting("zookeeper.connection.timeout.ms", int, 18000, 1, doc="how long start-up waits to reach ZooKeeper"),
    Setting("unclean.leader.election.enable", _bool, False, topic_name="unclean.leader.election.enable",
            doc="elect a live replica outside the ISR when no ISR member is alive: acknowledged writes it "
                "lacks are lost (docs/CLUSTER.md)"),
    Setting("controlled.shutdown.enable", _bool, True,
            doc="on SIGTERM, ask the controller to move this broker's leaderships away before stopping"),
    Setting("controlled.shutdown.max.retries", int, 3, 1,
            doc="attempts at a controlled shutdown that fail (ZooKeeper unreachable) before the broker stops "
                "without one"),
    Setting("controlled.shutdown.retry.backoff.ms", int, 5000, 0,
            doc="pause between two attempts at a controlled shutdown"),
    # -- replication (ads_broker/replication/, docs/REPLICATION.md) --
    Setting("replica.lag.time.max.ms", int, 30000, 1,
            doc="a follower not caught up to the leader's log end for this long leaves the ISR"),
    Setting("replica.fetch.wait.max.ms", int, 500, 0,
            doc="how long a follower's fetch waits at the leader for new records"),
    Setting("replica.fetch.max.bytes", int, 1048576, 1,
            doc="bytes a follower asks per partition per fetch (a larger first batch is still sent whole)"),
    Setting("replica.fetch.response.max.bytes", int, 10485760, 0,
            doc="bytes a follower asks for in one fetch of all the partitions it follows on one leader "
                "(the first partition's first batch is still sent whole)"),
    Setting("replica.fetch.backoff.ms", int, 1000, 0,
            doc="how long a follower waits after a failed fetch (leader unreachable, error) before the next"),
    Setting("replica.high.watermark.checkpoint.interval.ms", int, 5000, 1,
            doc="how often each replica's high watermark is written to replication-offset-checkpoint in the "
                "data dir (also at shutdown); a broker restarted as its partitions' only in-sync replica serves "
                "what was committed up to it"),
    # -- inter-broker connections (ads_broker/security/interbroker.py; docs/SECURITY.md "Inter-broker listener") --
    Setting("inter.broker.listener.name", str, "",
            doc="the listener other brokers are reached on (replica fetchers, transaction markers); empty: the "
                "listener named like security.inter.broker.protocol. Only one of the two may be set"),
    Setting("security.inter.broker.protocol", _security_protocol, "PLAINTEXT",
            doc="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL: the inter-broker listener is the one of this name"),
    Setting("sasl.mechanism.inter.broker.protocol", str, "GSSAPI",
            doc="the SASL mechanism brokers log in to each other with (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; "
                "Kafka's default GSSAPI is not supported). The login is the inter-broker listener's "
                "listener.name.<listener>.<mechanism>.sasl.jaas.config username and password"),
    Setting("sasl.jaas.config", _jaas_config, "",
            doc="a JAAS login entry; only per listener and mechanism, as Kafka's brokers take it: "
                "listener.name.<listener>.<mechanism>.sasl.jaas.config"),
    Setting("ssl.endpoint.identification.algorithm", str, "https",
            doc="https: a broker connecting to another broker's TLS listener checks the certificate's host name; "
                "empty: it does not"),
    # -- metrics: the Prometheus endpoint (ads_broker/metrics.py, docs/BROKER.md "Metrics") --
    Setting("min.insync.replicas", int, 1, 1, topic_name="min.insync.replicas",
            doc="in-sync replicas an acks=all write needs; a partition with fewer is under its minimum ISR "
                "(kafka_cluster_partition_underminisr). One node has one in-sync replica"),
    Setting("metrics.port", _port, 0, 0,
            doc="not a Kafka setting (Kafka serves JMX; its exporters map it): serve Prometheus /metrics on this "
                "port under the JMX exporter's names; 0 (the default): no endpoint"),
    Setting("metrics.host", str, "127.0.0.1", doc="address the metrics endpoint binds (loopback by default)"),
    Setting("metrics.topic.labels.max", int, 100, 0,
            doc="not a Kafka setting: topics labelled by name in the per-topic byte and message counters "
                "(the first ones seen); later topics are counted under topic=\"(other)\", which bounds the series"),
    # -- Kafka dynamic broker configs that ads-broker accepts, validates (Kafka's types) and keeps, but does not
    #    use (issue 14, librdkafka 0081): dynamic_config.py, docs/BROKER.md "Dynamic broker configs" --
    *(Setting(name, parse, default, doc=f"Kafka's {what}; accepted (server.properties, or dynamically per broker "
                                        "id) and described for Kafka's tools, not used: ads-broker has no "
                                        "GSSAPI/OAUTHBEARER login")
      for name, parse, default, what in (
          ("sasl.kerberos.service.name", _optional, None, "Kerberos service name"),
          ("sasl.kerberos.kinit.cmd", str, "/usr/bin/kinit", "Kerberos kinit command"),
          ("sasl.kerberos.ticket.renew.window.factor", float, 0.8, "Kerberos ticket renew window factor"),
          ("sasl.kerberos.ticket.renew.jitter", float, 0.05, "Kerberos ticket renew jitter"),
          ("sasl.kerberos.min.time.before.relogin", _long, 60000, "Kerberos login refresh thread sleep (ms)"),
          ("sasl.kerberos.principal.to.local.rules", str, "DEFAULT", "Kerberos principal-to-short-name rules"),
          ("sasl.login.refresh.window.factor", float, 0.8, "OAUTHBEARER login refresh window factor"),
          ("sasl.login.refresh.window.jitter", float, 0.05, "OAUTHBEARER login refresh jitter"),
          ("sasl.login.refresh.min.period.seconds", _short, 60, "OAUTHBEARER login refresh minimum period"),
          ("sasl.login.refresh.buffer.seconds", _short, 300, "OAUTHBEARER login refresh buffer"))),
    *(Setting(name, int, default, 1, doc=f"Kafka's {what}; accepted (server.properties, or dynamically within half "
                                         "to double the current value, as Kafka's DynamicThreadPool) and described "
                                         "for Kafka's tools, not used: ads-broker serves requests on one event loop")
      for name, default, what in (
          ("background.threads", 10, "background task threads"),
          ("num.io.threads", 8, "request handler threads"),
          ("num.replica.fetchers", 1, "replica fetcher threads per source broker"))),
)
_BY_NAME = {s.name: s for s in SETTINGS}

LISTENER_PREFIX = "listener.name."
#: What Kafka lets ``listener.name.<listener>.<key>`` set per listener that this broker has: the
#: TLS settings and the SASL mechanisms (docs/SECURITY.md, "Per-listener settings").
LISTENER_KEYS = frozenset({
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.certificate.chain", "ssl.keystore.key",
    "ssl.key.password", "ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.certificates",
    "ssl.client.auth", "ssl.enabled.protocols", "ssl.cipher.suites", "ssl.principal.mapping.rules",
    "sasl.enabled.mechanisms", "connections.max.reauth.ms", "ssl.endpoint.identification.algorithm",
})
#: Kafka's ``ListenerMechanismConfigs`` this broker has: ``listener.name.<listener>.<mechanism>.<key>``
#: (the mechanism in lower case, ``scram-sha-256``) sets them for one mechanism of one listener.
#: The OAUTHBEARER settings (``listener.name.<listener>.oauthbearer.sasl.oauthbearer.jwks.endpoint.url``).
OAUTHBEARER_KEYS = frozenset({
    "sasl.server.callback.handler.class", "sasl.oauthbearer.jwks.endpoint.url",
    "sasl.oauthbearer.jwks.endpoint.refresh.ms", "sasl.oauthbearer.expected.audience",
    "sasl.oauthbearer.expected.issuer", "sasl.oauthbearer.sub.claim.name", "sasl.oauthbearer.scope.claim.name",
    "sasl.oauthbearer.clock.skew.seconds",
})
LISTENER_MECHANISM_KEYS = frozenset({"connections.max.reauth.ms", "sasl.jaas.config"} | OAUTHBEARER_KEYS)


def _listener_override(key: str, raw: str, source: str, listener_names: set[str]) -> tuple[str, str, Any]:
    """(LISTENER, setting, typed value) of one ``listener.name.<listener>.<setting>`` entry; a clear
    ConfigError for an unknown listener or a setting Kafka does not take per listener."""
    rest = key[len(LISTENER_PREFIX):]
    listener, _, name = rest.partition(".")
    if not listener or not name:
        raise ConfigError(f"{source}: {key!r} is not listener.name.<listener>.<setting>")
    if listener.upper() not in listener_names:
        raise ConfigError(f"{source}: {key}: no listener named {listener.upper()} in listeners "
                          f"({', '.join(sorted(listener_names))}); use one of those names")
    mechanism, _, base = name.partition(".")
    if base in LISTENER_MECHANISM_KEYS:
        # listener.name.<listener>.<mechanism>.<key>: stored as "<mechanism>.<key>" (lower case, as Kafka's
        # ListenerName.saslMechanismPrefix), read by BrokerConfig.connections_max_reauth_ms
        if mechanism.upper() not in _sasl_mechanisms():
            raise ConfigError(f"{source}: {key}: {mechanism!r} is not a SASL mechanism of this broker; use "
                              f"listener.name.<listener>.<mechanism>.{base} with <mechanism> one of "
                              f"{', '.join(m.lower() for m in _sasl_mechanisms())}")
        if base in OAUTHBEARER_KEYS and mechanism.upper() != "OAUTHBEARER":
            raise ConfigError(f"{source}: {key}: {base} applies to OAUTHBEARER only; use "
                              f"listener.name.<listener>.oauthbearer.{base}")
        return listener.upper(), f"{mechanism.lower()}.{base}", _parse_setting(_BY_NAME[base], raw, source)
    if name not in LISTENER_KEYS:
        raise ConfigError(f"{source}: {key}: {name!r} cannot be set per listener; per-listener settings are "
                          f"{', '.join(sorted(LISTENER_KEYS))}, and <mechanism>.connections.max.reauth.ms, "
                          "<mechanism>.sasl.jaas.config and oauthbearer.<OAUTHBEARER setting>")
    value = _parse_setting(_BY_NAME[name], raw, source)
    if name == "sasl.enabled.mechanisms":
        from ads_broker.security.scram import MECHANISMS

        for mechanism in (m.strip() for m in value.split(",") if m.strip()):
            if mechanism not in MECHANISMS:
                raise ConfigError(f"{source}: {key}: {mechanism!r} is not one of {', '.join(MECHANISMS)}")
    return listener.upper(), name, value


def _sasl_mechanisms() -> tuple[str, ...]:
    from ads_broker.security.scram import MECHANISMS

    return MECHANISMS


def attribute_name(setting: str) -> str:
    """The Python attribute of a dotted setting name: ``log.segment.bytes`` -> ``log_segment_bytes``."""
    return setting.replace(".", "_")


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """The broker settings as typed attributes, built once from the validated values of
    :data:`SETTINGS` (``settings.log_segment_bytes`` is ``log.segment.bytes``). Every setting of
    the table has an attribute of its parsed type (a unit test checks it)."""

    listeners: str
    advertised_listeners: str
    broker_id: int
    cluster_id: str
    num_partitions: int
    default_replication_factor: int
    auto_create_topics_enable: bool
    delete_topic_enable: bool
    message_max_bytes: int
    log_segment_bytes: int
    log_roll_ms: int
    log_retention_ms: int | None
    log_retention_minutes: int | None
    log_retention_hours: int
    log_retention_bytes: int
    log_retention_check_interval_ms: int
    log_flush_interval_messages: int
    log_flush_interval_ms: int
    log_flush_scheduler_interval_ms: int
    log_index_interval_bytes: int
    log_index_size_max_bytes: int
    log_message_timestamp_type: str
    compression_type: str
    log_message_timestamp_before_max_ms: int
    log_message_timestamp_after_max_ms: int
    log_open_segment_files_max: int
    log_cleanup_policy: str
    log_segment_delete_delay_ms: int
    log_cleaner_enable: bool
    log_cleaner_dedupe_buffer_size: int
    log_cleaner_io_buffer_size: int
    log_cleaner_io_max_bytes_per_second: float
    log_cleaner_backoff_ms: int
    log_cleaner_min_cleanable_ratio: float
    log_cleaner_delete_retention_ms: int
    log_cleaner_min_compaction_lag_ms: int
    log_cleaner_max_compaction_lag_ms: int
    producer_id_expiration_ms: int
    producer_id_expiration_check_interval_ms: int
    group_initial_rebalance_delay_ms: int
    group_min_session_timeout_ms: int
    group_max_session_timeout_ms: int
    group_max_size: int
    offsets_topic_num_partitions: int
    offsets_topic_replication_factor: int
    offsets_commit_timeout_ms: int
    offsets_retention_minutes: int
    offsets_retention_ms: int
    offsets_retention_check_interval_ms: int
    transaction_max_timeout_ms: int
    transaction_state_log_num_partitions: int
    transaction_state_log_replication_factor: int
    transaction_state_log_min_isr: int
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int
    transactional_id_expiration_ms: int
    max_broker_partitions: int
    max_partitions_per_topic: int
    max_partitions_per_request: int
    offset_metadata_max_bytes: int
    socket_request_max_bytes: int
    fetch_max_bytes: int
    max_request_partition_size_limit: int
    max_incremental_fetch_session_cache_slots: int
    min_incremental_fetch_session_eviction_ms: int
    num_recovery_threads_per_data_dir: int
    log_dirs: str
    queued_max_request_bytes: int
    max_connections: int
    max_connections_per_ip: int
    connections_max_idle_ms: int
    listener_security_protocol_map: str
    ssl_keystore_type: str
    ssl_keystore_location: str
    ssl_keystore_certificate_chain: str
    ssl_keystore_key: str
    ssl_key_password: str
    ssl_truststore_type: str
    ssl_truststore_location: str
    ssl_truststore_certificates: str
    ssl_client_auth: str
    ssl_enabled_protocols: str
    ssl_cipher_suites: str
    ssl_principal_mapping_rules: str
    sasl_enabled_mechanisms: str
    sasl_server_max_receive_size: int
    connections_max_reauth_ms: int
    sasl_server_callback_handler_class: str
    sasl_oauthbearer_jwks_endpoint_url: str
    sasl_oauthbearer_jwks_endpoint_refresh_ms: int
    sasl_oauthbearer_expected_audience: str
    sasl_oauthbearer_expected_issuer: str
    sasl_oauthbearer_sub_claim_name: str
    sasl_oauthbearer_scope_claim_name: str
    sasl_oauthbearer_clock_skew_seconds: int
    authorizer_class_name: str
    super_users: str
    allow_everyone_if_no_acl_found: bool
    request_max_array_elements: int
    # cluster mode (ZooKeeper)
    zookeeper_connect: str
    zookeeper_session_timeout_ms: int
    zookeeper_connection_timeout_ms: int
    unclean_leader_election_enable: bool
    controlled_shutdown_enable: bool
    controlled_shutdown_max_retries: int
    controlled_shutdown_retry_backoff_ms: int
    # replication
    replica_lag_time_max_ms: int
    replica_fetch_wait_max_ms: int
    replica_fetch_max_bytes: int
    replica_fetch_response_max_bytes: int
    replica_fetch_backoff_ms: int
    replica_high_watermark_checkpoint_interval_ms: int
    # inter-broker connections
    inter_broker_listener_name: str
    security_inter_broker_protocol: str
    sasl_mechanism_inter_broker_protocol: str
    sasl_jaas_config: str
    ssl_endpoint_identification_algorithm: str
    # metrics
    min_insync_replicas: int
    metrics_port: int
    metrics_host: str
    metrics_topic_labels_max: int
    # Kafka dynamic broker configs accepted and kept, not used (issue 14, 0081)
    sasl_kerberos_service_name: str | None
    sasl_kerberos_kinit_cmd: str
    sasl_kerberos_ticket_renew_window_factor: float
    sasl_kerberos_ticket_renew_jitter: float
    sasl_kerberos_min_time_before_relogin: int
    sasl_kerberos_principal_to_local_rules: str
    sasl_login_refresh_window_factor: float
    sasl_login_refresh_window_jitter: float
    sasl_login_refresh_min_period_seconds: int
    sasl_login_refresh_buffer_seconds: int
    background_threads: int
    num_io_threads: int
    num_replica_fetchers: int

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> BrokerSettings:
        names = {f.name for f in fields(cls)}
        return cls(**{attribute_name(k): v for k, v in values.items() if attribute_name(k) in names})


def _parse_setting(setting: Setting, raw: str, source: str) -> Any:
    try:
        value = setting.parse(raw.strip())
    except ValueError as e:
        raise ConfigError(f"{source}: {setting.name}={raw!r} is invalid: {e}") from None
    if setting.minimum is not None and value < setting.minimum:
        raise ConfigError(f"{source}: {setting.name}={raw!r} is below the minimum {setting.minimum}")
    return value


def parse_properties(text: str, source: str) -> dict[str, str]:
    """``key=value`` lines as in Kafka's server.properties; ``#``/``!`` comments, blank lines."""
    props: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            raise ConfigError(f"{source}:{number}: expected key=value, got {stripped!r}")
        props[key.strip()] = value.strip()
    return props


def _listener_overrides(entries: Mapping[str, tuple[str, str]],
                        listeners: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The validated ``listener.name.*`` entries by listener (each TLS listener's context and SASL
    mechanisms are built from :meth:`BrokerConfig.for_listener` in ads_broker/server.py), and the
    same typed values by the key as it was written (DescribeConfigs lists them)."""
    names = {e.name for e in parse_endpoints(listeners)}
    out: dict[str, dict[str, Any]] = {}
    by_key: dict[str, Any] = {}
    for key, (raw, source) in entries.items():
        listener, name, value = _listener_override(key, raw, source, names)
        out.setdefault(listener, {})[name] = value
        by_key[key] = value
    return out, by_key


@dataclass(frozen=True)
class BrokerConfig:
    """Validated broker settings, keyed by Kafka's names (``config["log.segment.bytes"]``); typed
    attributes in :attr:`settings` (``config.settings.log_segment_bytes``)."""

    values: Mapping[str, Any]
    #: Names given in the properties file or as overrides (Kafka's STATIC_BROKER_CONFIG source);
    #: every other setting has its default (DEFAULT_CONFIG).
    explicit: frozenset[str] = frozenset()
    #: Dynamic broker configs (IncrementalAlterConfigs/AlterConfigs on the BROKER resource, only
    #: :data:`DYNAMIC_SETTINGS`): the cluster-wide defaults (resource name "", Kafka's
    #: DYNAMIC_DEFAULT_BROKER_CONFIG) and this broker's own (its id, DYNAMIC_BROKER_CONFIG), parsed.
    #: Replaced whole (never mutated) by :meth:`set_dynamic`, so a reader sees one version.
    dynamic_default: dict[str, Any] = field(default_factory=dict)
    dynamic_broker: dict[str, Any] = field(default_factory=dict)
    #: ``listener.name.<listener>.<setting>`` entries: LISTENER -> {setting: typed value}; a
    #: ``listener.name.<listener>.<mechanism>.<key>`` entry is there as ``<mechanism>.<key>``.
    listener_overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: The same entries by the key as written in the properties or ``--override`` (``listener.name.
    #: sasl_ssl.ssl.key.password``) -> typed value: what DescribeConfigs of the broker lists.
    listener_entries: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        """The effective value: this broker's dynamic config, else the cluster-wide dynamic
        default, else the static config (properties file, --override), else the default."""
        if name in self.dynamic_broker:
            return self.dynamic_broker[name]
        if name in self.dynamic_default:
            return self.dynamic_default[name]
        return self.values[name]

    def set_dynamic(self, default: Mapping[str, Any], broker: Mapping[str, Any]) -> None:
        """Install new dynamic layers (each already validated by :func:`parse_dynamic`)."""
        object.__setattr__(self, "dynamic_default", dict(default))
        object.__setattr__(self, "dynamic_broker", dict(broker))

    @cached_property
    def settings(self) -> BrokerSettings:
        """The typed view of the static values, built on first use (they never change). The
        dynamic settings (:data:`DYNAMIC_SETTINGS`) are read through ``config[name]`` instead."""
        return BrokerSettings.from_values(self.values)

    def for_listener(self, listener: str) -> BrokerConfig:
        """The settings one listener runs with: the broker's, with its ``listener.name.<listener>.*``
        entries on top (Kafka's per-listener configs); typed through :attr:`settings` as usual."""
        own = {k: v for k, v in self.listener_overrides.get(listener.upper(), {}).items() if k in _BY_NAME}
        if not own:
            return self
        return BrokerConfig({**self.values, **own}, self.explicit | frozenset(own),
                            listener_overrides=self.listener_overrides,
                            listener_entries=self.listener_entries)  # ssl.*/sasl.*: never dynamic

    def connections_max_reauth_ms(self, listener: str, mechanism: str) -> int:
        """KIP-368's session lifetime cap for a SASL mechanism on a listener, as Kafka's
        ``SaslChannelBuilder`` picks it: ``listener.name.<l>.<mechanism>.connections.max.reauth.ms``,
        else ``listener.name.<l>.connections.max.reauth.ms``, else ``connections.max.reauth.ms``."""
        own = self.listener_overrides.get(listener.upper(), {})
        specific = own.get(f"{mechanism.lower()}.connections.max.reauth.ms")
        if specific is not None:
            return int(specific)
        return self.for_listener(listener).settings.connections_max_reauth_ms

    def mechanism_setting(self, listener: str, mechanism: str, name: str) -> Any:
        """A SASL mechanism's setting on a listener as Kafka's ``ConfigurationUtils`` reads it:
        ``listener.name.<l>.<mechanism>.<name>``, else the listener's, else the broker-wide one."""
        own = self.listener_overrides.get(listener.upper(), {})
        specific = own.get(f"{mechanism.lower()}.{name}")
        if specific is not None:
            return specific
        return self.for_listener(listener)[name]

    @classmethod
    def load(cls, path: Path | None = None, overrides: Mapping[str, str] | None = None) -> BrokerConfig:
        raw: dict[str, tuple[str, str]] = {}
        if path is not None:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as e:
                raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
            for key, value in parse_properties(text, str(path)).items():
                raw[key] = (value, str(path))
        for key, value in (overrides or {}).items():
            raw[key] = (value, "--override")
        values = {s.name: s.default for s in SETTINGS}
        per_listener: dict[str, tuple[str, str]] = {}
        for key, (value, source) in raw.items():
            if key.startswith(LISTENER_PREFIX):
                per_listener[key] = (value, source)
                continue
            setting = _BY_NAME.get(key)
            if setting is None:
                raise ConfigError(f"{source}: unknown broker config {key!r}; known: `ads-broker configs`")
            values[key] = _parse_setting(setting, value, source)
        if not values["advertised.listeners"]:
            values["advertised.listeners"] = values["listeners"]
        listener_overrides, listener_entries = _listener_overrides(per_listener, values["listeners"])
        config = cls(values, frozenset(k for k in raw if k not in per_listener), listener_overrides=listener_overrides,
                     listener_entries=listener_entries)
        if values["sasl.jaas.config"]:
            raise ConfigError("sasl.jaas.config is only read per listener and mechanism, as Kafka's brokers read it: "
                              "set listener.name.<listener>.<mechanism>.sasl.jaas.config instead")
        if values["zookeeper.connect"]:  # cluster mode: the inter-broker listener must resolve (Kafka's checks)
            from ads_broker.security.interbroker import InterBrokerSecurity

            InterBrokerSecurity.from_config(config)
        return config

    @property
    def log_retention_time_ms(self) -> int:
        """Kafka's ``logRetentionTimeMillis``: log.retention.ms, else log.retention.minutes, else
        log.retention.hours, in milliseconds; any negative value is -1 (no time limit)."""
        ms = self["log.retention.ms"]
        if ms is None:
            minutes = self["log.retention.minutes"]
            ms = minutes * 60_000 if minutes is not None else self["log.retention.hours"] * 3_600_000
        return -1 if ms < 0 else int(ms)

    @property
    def listen(self) -> tuple[str, int]:
        """HOST, PORT of the first listener."""
        first = parse_endpoints(str(self["listeners"]))[0]
        return first.host, first.port

    @property
    def advertised(self) -> tuple[str, int]:
        """HOST, PORT advertised for the first listener (each connection gets its own listener's)."""
        first = parse_endpoints(str(self["advertised.listeners"]))[0]
        return first.host, first.port

    def topic_defaults(self) -> dict[str, str]:
        """Topic-level config defaults derived from the broker's ``log.*`` settings."""
        out: dict[str, str] = {}
        for setting in SETTINGS:
            if setting.topic_name:
                out[setting.topic_name] = str(self[setting.name])
        out["retention.ms"] = str(self.log_retention_time_ms)
        return out


#: Broker settings that IncrementalAlterConfigs/AlterConfigs may change at run time (Kafka's
#: ``DynamicLogConfig.ReconfigurableConfigs``: the broker-wide defaults of topic configs, and the
#: retention synonyms). Every other setting needs a restart (Kafka's "Cannot update these configs
#: dynamically").
#: Kafka's DynamicListenerConfig SASL login configs that ads-broker accepts (and does not use): Kafka's
#: PerBrokerConfigs, so only for a broker id ("Cannot update these configs at default cluster level").
PER_BROKER_DYNAMIC_SETTINGS = frozenset({
    "sasl.kerberos.service.name", "sasl.kerberos.kinit.cmd", "sasl.kerberos.ticket.renew.window.factor",
    "sasl.kerberos.ticket.renew.jitter", "sasl.kerberos.min.time.before.relogin",
    "sasl.kerberos.principal.to.local.rules", "sasl.login.refresh.window.factor", "sasl.login.refresh.window.jitter",
    "sasl.login.refresh.min.period.seconds", "sasl.login.refresh.buffer.seconds",
})
#: Kafka's DynamicThreadPool configs that ads-broker accepts (and does not use): a new value must be
#: within half and double the current one.
THREAD_POOL_SETTINGS = frozenset({"background.threads", "num.io.threads", "num.replica.fetchers"})
DYNAMIC_SETTINGS = frozenset({s.name for s in SETTINGS if s.topic_name}
                             | {"log.retention.minutes", "log.retention.hours"}
                             | PER_BROKER_DYNAMIC_SETTINGS | THREAD_POOL_SETTINGS)


def parse_dynamic(raw: Mapping[str, str], where: str) -> dict[str, Any]:
    """Validate dynamic broker configs as the static ones are (types, ranges, choices)."""
    return {name: _parse_setting(_BY_NAME[name], value, where) for name, value in raw.items()}


def split_override(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--override expects key=value, got {item!r}")
    return key.strip(), value


def validate_topic_configs(configs: Mapping[str, str | None], known: frozenset[str]) -> dict[str, str]:
    """CreateTopics/AlterConfigs input: known topic config names with non-null values."""
    out: dict[str, str] = {}
    for key, value in configs.items():
        if key not in known:
            raise InvalidConfigurationError(f"Unknown topic config name: {key}")  # Kafka's LogConfig text
        if value is None:
            raise InvalidConfigurationError(f"topic config {key!r} has a null value")
        out[key] = value
    return out
