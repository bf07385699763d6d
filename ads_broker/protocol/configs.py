"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, as Kafka's ``ConfigHelper`` and
``ConfigAdminManager`` answer them.

What DescribeConfigs reports for each entry (Kafka's rules, ``ConfigHelper.createTopicConfigEntry``
and ``createBrokerConfigEntry``):

- ``config_type`` (v3+): the ``ConfigDef.Type`` Kafka defines the config with (LONG, LIST, ...).
- ``synonyms``: the names a value may come from, most specific first: the topic's own override
  (TOPIC_CONFIG), then the broker synonyms of the config (``log.retention.ms``,
  ``log.retention.minutes``, ``log.retention.hours`` for ``retention.ms``) where the broker has
  them, dynamic ones first (this broker's DYNAMIC_BROKER_CONFIG, then the cluster-wide
  DYNAMIC_DEFAULT_BROKER_CONFIG), then static ones (server.properties or ``--override``,
  STATIC_BROKER_CONFIG), then defaults that are not null (DEFAULT_CONFIG); as Kafka, the list
  starts at the config's own broker name (``dropWhile(name != ...)``).
- ``config_source``: the first synonym's source, DEFAULT_CONFIG when there is none. Synonyms
  themselves are sent only when the request asks (``include_synonyms``).

Topic configs are altered per topic and persisted in the topic store (:meth:`ReplicaManager.
alter_topic_configs`). In cluster mode ZooKeeper's ``/config/topics/<t>`` is the topic's config:
AlterConfigs writes it (conditional on the version read, retried on a conflict) with a
``/config/changes`` notification, as Kafka's ``AdminZkClient.changeTopicConfig``, then applies it to
this broker's logs of the topic; DescribeConfigs reads it, whichever broker answers. (The other
brokers' logs take a changed log setting when they next load the topic's metadata: see
docs/CLUSTER.md; ``unclean.leader.election.enable`` is read by the controller from ZooKeeper.)

On the BROKER resource (``""``: the cluster-wide defaults, or this broker's id) the dynamic
broker configs are altered (:mod:`ads_broker.dynamic_config`: the ``log.*`` defaults of topic
configs, applied to every topic at once; and Kafka's dynamic SASL login and thread-pool configs,
validated and kept although ads-broker does not use them); every other broker config is refused
with Kafka's answer for a config that cannot be updated dynamically (INVALID_REQUEST, "Cannot
update these configs dynamically: Set(...)"), see docs/BROKER.md.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import (
    AlterConfigsResponse,
    DescribeConfigsResponse,
    IncrementalAlterConfigsResponse,
)
from kazoo.exceptions import BadVersionError, KazooException, NoNodeError

from ads_broker import dynamic_config
from ads_broker.cluster.exceptions import ZooKeeperUnavailableError
from ads_broker.config import (
    DYNAMIC_SETTINGS,
    LISTENER_MECHANISM_KEYS,
    LISTENER_PREFIX,
    SETTINGS,
    BrokerConfig,
    Setting,
    validate_topic_configs,
)
from ads_broker.exceptions import (
    BrokerError,
    InvalidConfigurationError,
    InvalidRequestError,
    UnknownTopicOrPartitionError,
)
from ads_broker.log.config import TOPIC_CONFIG_KEYS, TOPIC_CONFIG_TYPES
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.rejected import Rejections
from ads_broker.security.acl import ALTER_CONFIGS, CLUSTER, CLUSTER_NAME, DESCRIBE_CONFIGS, TOPIC

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

# ConfigResource.Type
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
# DescribeConfigsResponse.ConfigSource
SOURCE_TOPIC_CONFIG = 1
SOURCE_DYNAMIC_BROKER_CONFIG = 2
SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG = 3
SOURCE_STATIC_BROKER_CONFIG = 4
SOURCE_DEFAULT_CONFIG = 5
# DescribeConfigsResponse.ConfigType
CONFIG_TYPES = {"UNKNOWN": 0, "BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6, "LIST": 7,
                "CLASS": 8, "PASSWORD": 9}
# AlterConfigOp.OpType
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3

#: Broker settings Kafka defines as LONG (the other integers are INT).
_LONG_SETTINGS = frozenset({
    "log.roll.ms", "log.retention.ms", "log.retention.bytes", "log.retention.check.interval.ms",
    "log.flush.interval.messages", "log.flush.interval.ms", "log.flush.scheduler.interval.ms",
    "log.message.timestamp.before.max.ms", "log.message.timestamp.after.max.ms", "log.segment.delete.delay.ms",
    "log.cleaner.dedupe.buffer.size", "log.cleaner.backoff.ms", "log.cleaner.delete.retention.ms",
    "log.cleaner.min.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms", "connections.max.idle.ms",
    "queued.max.request.bytes", "connections.max.reauth.ms", "sasl.oauthbearer.jwks.endpoint.refresh.ms",
})
#: Broker settings Kafka defines with another type than their Python value suggests.
_SETTING_TYPES = {
    "log.cleanup.policy": "LIST", "sasl.enabled.mechanisms": "LIST", "ssl.enabled.protocols": "LIST",
    "ssl.cipher.suites": "LIST", "authorizer.class.name": "CLASS", "sasl.server.callback.handler.class": "CLASS",
    "sasl.oauthbearer.expected.audience": "LIST",
    # PASSWORD: described as sensitive, value null (Kafka's KafkaConfig.maybeSensitive)
    "ssl.key.password": "PASSWORD", "ssl.keystore.key": "PASSWORD", "ssl.keystore.certificate.chain": "PASSWORD",
    "ssl.truststore.certificates": "PASSWORD", "sasl.jaas.config": "PASSWORD",
    # Kafka dynamic broker configs kept but not used (config.py, PER_BROKER_DYNAMIC_SETTINGS)
    "sasl.kerberos.min.time.before.relogin": "LONG", "sasl.kerberos.principal.to.local.rules": "LIST",
    "sasl.login.refresh.min.period.seconds": "SHORT", "sasl.login.refresh.buffer.seconds": "SHORT",
}
#: Kafka's ``DynamicBrokerConfig.brokerConfigSynonyms``, for the names this broker knows.
_RETENTION_SYNONYMS = ("log.retention.ms", "log.retention.minutes", "log.retention.hours")

ResourceResult: Any = DescribeConfigsResponse.DescribeConfigsResult.DescribeConfigsResourceResult
Synonym: Any = ResourceResult.DescribeConfigsSynonym


def broker_config_type(setting: Setting) -> str:
    """Kafka's ``ConfigDef.Type`` name of a broker setting."""
    if setting.name in _SETTING_TYPES:
        return _SETTING_TYPES[setting.name]
    if setting.parse is int:
        return "LONG" if setting.name in _LONG_SETTINGS else "INT"
    if setting.parse is float:
        return "DOUBLE"
    default = setting.default
    return "BOOLEAN" if isinstance(default, bool) else "INT" if isinstance(default, int) else "STRING"


_BY_NAME = {s.name: s for s in SETTINGS}
#: Topic config -> its broker default's name (Kafka's ``ServerTopicConfigSynonyms``).
TOPIC_CONFIG_SYNONYMS = {s.topic_name: s.name for s in SETTINGS if s.topic_name}


def _render(value: object) -> str | None:
    """Kafka's ``ConfigDef.convertToString``: null stays null, booleans are true/false."""
    if value is None:
        return None
    return str(value).lower() if isinstance(value, bool) else str(value)


def broker_synonyms(name: str) -> tuple[str, ...]:
    return _RETENTION_SYNONYMS if name in _RETENTION_SYNONYMS else (name,)


def config_synonyms(config: BrokerConfig, name: str, sensitive: bool) -> list[Any]:
    """Kafka's ``ConfigHelper.configSynonyms`` for broker setting ``name``."""
    names = broker_synonyms(name)
    found = [(n, config.dynamic_broker[n], SOURCE_DYNAMIC_BROKER_CONFIG) for n in names if n in config.dynamic_broker]
    found += [(n, config.dynamic_default[n], SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG)
              for n in names if n in config.dynamic_default]
    found += [(n, config.values[n], SOURCE_STATIC_BROKER_CONFIG) for n in names if n in config.explicit]
    found += [(n, _BY_NAME[n].default, SOURCE_DEFAULT_CONFIG) for n in names if _BY_NAME[n].default is not None]
    while found and found[0][0] != name:
        found.pop(0)  # Kafka: allSynonyms.dropWhile(s => s.name != name)
    return [Synonym(name=n, value=None if sensitive else _render(v), source=src) for n, v, src in found]


def _entry(name: str, value: str | None, synonyms: list[Any], *, config_type: str, read_only: bool,
           include_synonyms: bool, documentation: str | None) -> Any:
    source = synonyms[0].source if synonyms else SOURCE_DEFAULT_CONFIG
    sensitive = config_type == "PASSWORD"
    return ResourceResult(name=name, value=None if sensitive else value, read_only=read_only, config_source=source,
                          is_default=source == SOURCE_DEFAULT_CONFIG, is_sensitive=sensitive,
                          synonyms=synonyms if include_synonyms else [], config_type=CONFIG_TYPES[config_type],
                          documentation=documentation)


def describe_topic(ctx: HandlerContext, name: str, include_synonyms: bool,
                   overrides: dict[str, str] | None = None) -> list[Any]:
    """The topic's config entries: from this broker's topic store, or from ``overrides`` (the
    topic's own configs as ZooKeeper holds them, in cluster mode)."""
    if overrides is None:
        values, explicit = ctx.replicas.effective_configs(name)
    else:
        values, explicit = ctx.replicas.logs.log_config(overrides).to_topic_config(), set(overrides)
    entries = []
    for key, value in sorted(values.items()):
        broker_name = TOPIC_CONFIG_SYNONYMS.get(key)
        synonyms = config_synonyms(ctx.config, broker_name, False) if broker_name else []
        if key in explicit:
            synonyms.insert(0, Synonym(name=key, value=value, source=SOURCE_TOPIC_CONFIG))
        entries.append(_entry(key, value, synonyms, config_type=TOPIC_CONFIG_TYPES[key], read_only=False,
                              include_synonyms=include_synonyms, documentation=None))
    return entries


def _broker_id(ctx: HandlerContext, name: str) -> int | None:
    """The broker a BROKER resource names (None: the empty name, the cluster-wide defaults)."""
    if not name:
        return None
    try:
        broker_id = int(name)
    except ValueError:
        raise InvalidRequestError(f"Broker id must be an integer, but it is: {name}") from None
    if broker_id != ctx.node_id:
        raise InvalidRequestError(f"Unexpected broker id, expected {ctx.node_id} or empty string, but received {name}")
    return broker_id


def describe_broker(ctx: HandlerContext, name: str, include_synonyms: bool, include_docs: bool) -> list[Any]:
    config = ctx.config
    if _broker_id(ctx, name) is None:
        # Kafka: the empty name describes the dynamic cluster-wide defaults only
        return [_entry(key, _render(value), [Synonym(name=key, value=_render(value),
                                                     source=SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG)],
                       config_type=broker_config_type(_BY_NAME[key]), read_only=False,
                       include_synonyms=include_synonyms,
                       documentation=(_BY_NAME[key].doc or None) if include_docs else None)
                for key, value in sorted(config.dynamic_default.items())]
    entries = []
    for setting in SETTINGS:
        config_type = broker_config_type(setting)
        synonyms = config_synonyms(config, setting.name, config_type == "PASSWORD")
        # Read-only unless it is a dynamic broker config (dynamic_config.py; the rest need a restart).
        entries.append(_entry(setting.name, _render(config[setting.name]), synonyms, config_type=config_type,
                              read_only=setting.name not in DYNAMIC_SETTINGS, include_synonyms=include_synonyms,
                              documentation=(setting.doc or None) if include_docs else None))
    entries.extend(_listener_entries(config, include_synonyms, include_docs))
    return entries


def listener_base_name(key: str) -> str:
    """The broker config a ``listener.name.<listener>.[<mechanism>.]<config>`` entry overrides
    (Kafka's ``DynamicBrokerConfig.brokerConfigSynonyms`` with ``ListenerConfigRegex``)."""
    name = key[len(LISTENER_PREFIX):].partition(".")[2]
    return next((m for m in LISTENER_MECHANISM_KEYS if name.endswith(m)), name)


def _listener_entries(config: BrokerConfig, include_synonyms: bool, include_docs: bool) -> list[Any]:
    """The ``listener.name.*`` entries that are set, as Kafka lists its static configs' originals:
    the entry's own name and value (STATIC_BROKER_CONFIG), the type of the config it overrides, a
    PASSWORD value null and ``is_sensitive`` (Kafka's ``maybeSensitive``), and as synonyms the entry
    then the base config's own. Read-only: per-listener settings need a restart here."""
    entries = []
    for key, value in sorted(config.listener_entries.items()):
        base = _BY_NAME[listener_base_name(key)]
        config_type = broker_config_type(base)
        sensitive = config_type == "PASSWORD"
        synonyms = [Synonym(name=key, value=None if sensitive else _render(value), source=SOURCE_STATIC_BROKER_CONFIG),
                    *config_synonyms(config, base.name, sensitive)]
        entries.append(_entry(key, _render(value), synonyms, config_type=config_type, read_only=True,
                              include_synonyms=include_synonyms,
                              documentation=(base.doc or None) if include_docs else None))
    return entries


async def handle_describe_configs(ctx: HandlerContext, req: DecodedRequest) -> DescribeConfigsResponse:
    body = req.body
    include_synonyms = bool(getattr(body, "include_synonyms", False))
    include_docs = bool(getattr(body, "include_documentation", False))
    results = []
    rejected = Rejections("describe_configs")
    named: set[tuple[int, str]] = set()
    for resource in body.resources:
        await asyncio.sleep(0)
        res = DescribeConfigsResponse.DescribeConfigsResult(
            error_code=0, error_message=None, resource_type=resource.resource_type,
            resource_name=resource.resource_name, configs=[])
        # Kafka's ConfigHelperUtils: a null or an empty list of keys describes every config.
        wanted = set(resource.configuration_keys) if resource.configuration_keys else None
        try:
            kind, name = resource.resource_type, resource.resource_name
            if (kind, name) in named:
                # Each repeat would be a whole answer again (the broker with synonyms and docs is
                # ~20 KB): a 10 KB request naming it 2,000 times was a 40 MB answer (review s13,
                # H3). Kafka answers every repeat; clients name a resource once.
                raise InvalidRequestError(f"resource {name!r} of type {kind} is named more than once in this "
                                          "request; name each resource once")
            named.add((kind, name))
            if kind == RESOURCE_TOPIC:
                if denied := ctx.denial(DESCRIBE_CONFIGS, TOPIC, name):
                    raise denied
                overrides = None if ctx.cluster is None else (await _zk_topic_config(ctx, name))[0]
                entries = describe_topic(ctx, name, include_synonyms, overrides)
            elif kind == RESOURCE_BROKER:
                if denied := ctx.denial(DESCRIBE_CONFIGS, CLUSTER, CLUSTER_NAME):
                    raise denied
                entries = describe_broker(ctx, name, include_synonyms, include_docs)
            else:
                raise InvalidRequestError(f"Unsupported resource type: {kind} (TOPIC 2 and BROKER 4 are served)")
            res.configs = [e for e in entries if wanted is None or e.name in wanted]
        except BrokerError as e:
            rejected.add(resource.resource_name, e)
            res.error_code = e.error_code
            res.error_message = str(e)
        results.append(res)
    rejected.log(ctx, req)
    return DescribeConfigsResponse(throttle_time_ms=0, results=results)


# -- AlterConfigs (33) and IncrementalAlterConfigs (44) -----------------------------------------

#: Computes a topic's new explicit configs from its current ones and one resource's entries.
NewConfigs = Callable[["HandlerContext", str, dict[str, str], list[Any]], dict[str, str | None]]


def _check_unique(entries: list[Any]) -> None:
    counts = Counter(e.name for e in entries)
    if duplicates := sorted(k for k, n in counts.items() if n > 1):
        raise InvalidRequestError(f"Error due to duplicate config keys : {', '.join(duplicates)}")


def _known(key: str) -> None:
    if key not in TOPIC_CONFIG_KEYS:
        raise InvalidConfigurationError(f"Unknown topic config name: {key}")  # Kafka's LogConfig text


def legacy_configs(ctx: HandlerContext, topic: str, current: dict[str, str],
                   entries: list[Any]) -> dict[str, str | None]:
    """AlterConfigs replaces the topic's whole set of overrides: configs not named return to their
    defaults (Kafka's legacy semantics)."""
    _check_unique(entries)
    return {e.name: e.value for e in entries}


def incremental_configs(ctx: HandlerContext, topic: str, current: dict[str, str],
                        entries: list[Any]) -> dict[str, str | None]:
    """Kafka's ``prepareIncrementalConfigs`` for a topic's overrides."""
    _check_unique(entries)
    return dict(_incremental(current, entries, known=_known, is_list=lambda k: TOPIC_CONFIG_TYPES[k] == "LIST",
                             effective=lambda k: ctx.replicas.logs.log_config(current).to_topic_config()[k]))


def _incremental(current: dict[str, str], entries: list[Any], *, known: Callable[[str], None],
                 is_list: Callable[[str], bool], effective: Callable[[str], str]) -> dict[str, str]:
    """Kafka's ``prepareIncrementalConfigs``: SET, DELETE, and APPEND/SUBTRACT on LIST configs
    (starting from ``effective(key)`` when ``current`` does not set the key)."""
    out = dict(current)
    for e in entries:
        key, op = e.name, e.config_operation
        known(key)
        if op == OP_SET:
            if e.value is None:
                raise InvalidRequestError(f"Null value not supported for SET of config key: {key}; use DELETE "
                                          "to return it to its default")
            out[key] = e.value
        elif op == OP_DELETE:
            out.pop(key, None)
        elif op in (OP_APPEND, OP_SUBTRACT):
            verb = "append" if op == OP_APPEND else "subtract"
            if not is_list(key):
                raise InvalidRequestError(f"Config value {verb} is not allowed for config key: {key}")
            old = out.get(key)
            values = [v for v in (old if old is not None else effective(key)).split(",") if v]
            given = [v for v in (e.value or "").split(",") if v]
            merged = values + [v for v in given if v not in values] if op == OP_APPEND else \
                [v for v in values if v not in given]
            out[key] = ",".join(merged)
        else:
            raise InvalidRequestError(f"Unknown config operation {op} for config key: {key} "
                                      "(0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT)")
    return out


def _alter_broker(ctx: HandlerContext, name: str, entries: list[Any], incremental: bool,
                  validate_only: bool) -> None:
    """Dynamic broker configs: ``name`` "" alters the cluster-wide defaults, this broker's id its
    own; AlterConfigs replaces the layer, IncrementalAlterConfigs changes it (Kafka's semantics)."""
    own = _broker_id(ctx, name) is not None
    _check_unique(entries)
    dynamic_config.check_names([e.name for e in entries], per_broker=own)
    if ctx.cluster is not None:
        raise InvalidRequestError("dynamic broker configs are not kept in ZooKeeper yet (/config/brokers): in cluster "
                                  "mode set them in each broker's server.properties (or --override) and restart")
    default, broker = dynamic_config.raw_layers(ctx.data_dir)
    current = broker if own else default
    if incremental:
        layer = _incremental(current, entries, known=lambda k: None,
                             is_list=lambda k: broker_config_type(_BY_NAME[k]) == "LIST",
                             effective=lambda k: _render(ctx.config[k]) or "")
    else:  # the legacy API replaces the whole set of dynamic configs of the resource
        layer = {e.name: e.value for e in entries if e.value is not None}
    new_default, new_broker = (default, layer) if own else (layer, broker)
    dynamic_config.apply(ctx.data_dir, ctx.config, new_default, new_broker,
                         lambda: ctx.replicas.reapply_topic_configs(dry_run=True), validate_only=validate_only)
    if not validate_only:
        ctx.replicas.reapply_topic_configs()


async def _handle_alter(ctx: HandlerContext, req: DecodedRequest, api: str, new_configs: NewConfigs) -> list[Any]:
    body = req.body
    validate_only = bool(body.validate_only)
    seen = Counter((r.resource_type, r.resource_name) for r in body.resources)
    results = []
    rejected = Rejections(api)
    for resource in body.resources:
        await asyncio.sleep(0)
        kind, name = resource.resource_type, resource.resource_name
        error: BrokerError | None = None
        try:
            if seen[(kind, name)] > 1:
                raise InvalidRequestError(f"Duplicate resource in request: type {kind}, name {name!r}")
            if kind == RESOURCE_TOPIC:
                if denied := ctx.denial(ALTER_CONFIGS, TOPIC, name):
                    raise denied
                if ctx.cluster is not None:
                    await _alter_topic_in_cluster(ctx, name, new_configs, list(resource.configs), validate_only)
                else:
                    current = dict(ctx.replicas.get_topic(name).configs)
                    ctx.replicas.alter_topic_configs(name, new_configs(ctx, name, current, list(resource.configs)),
                                                     validate_only=validate_only)
            elif kind == RESOURCE_BROKER:
                if denied := ctx.denial(ALTER_CONFIGS, CLUSTER, CLUSTER_NAME):
                    raise denied
                _alter_broker(ctx, name, list(resource.configs), new_configs is incremental_configs,
                              validate_only)
            else:
                raise InvalidRequestError(f"Unsupported resource type: {kind} (TOPIC 2 and BROKER 4 are served)")
        except BrokerError as e:
            rejected.add(name, e)
            error = e
        results.append((error.error_code if error else 0, str(error) if error else None, kind, name))
    rejected.log(ctx, req)
    return results


#: Conflicting writes of one topic's config znode (another broker altering it at once) retried.
ALTER_ATTEMPTS = 5


async def _zk_topic_config(ctx: HandlerContext, name: str) -> tuple[dict[str, str], int]:
    """The topic's overrides and their znode version from ZooKeeper (cluster mode);
    UNKNOWN_TOPIC_OR_PARTITION if the topic has none (it does not exist)."""
    cluster = ctx.cluster
    assert cluster is not None
    try:
        found = await asyncio.get_running_loop().run_in_executor(
            cluster.zk_requests, cluster.zk.get_topic_config_versioned, name)
    except KazooException as e:
        raise ZooKeeperUnavailableError(f"cannot read topic {name}'s config from ZooKeeper ({type(e).__name__}); "
                                        "retry") from e
    if found is None:
        raise UnknownTopicOrPartitionError(f"The topic '{name}' does not exist.")
    return found


async def _alter_topic_in_cluster(ctx: HandlerContext, name: str, new_configs: NewConfigs, entries: list[Any],
                                  validate_only: bool) -> None:
    """Cluster mode: the new overrides computed from ZooKeeper's, validated as at CreateTopics,
    written to ``/config/topics/<t>`` conditionally on the version read (re-read and computed again
    on a conflict), announced under ``/config/changes``; then applied to this broker's logs."""
    cluster = ctx.cluster
    assert cluster is not None
    for _attempt in range(ALTER_ATTEMPTS):
        current, version = await _zk_topic_config(ctx, name)
        checked = validate_topic_configs(new_configs(ctx, name, current, entries), TOPIC_CONFIG_KEYS)
        ctx.replicas.logs.log_config(checked)  # InvalidConfigurationError on bad values
        if validate_only:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                cluster.zk_requests, cluster.zk.set_topic_config, name, checked, version)
        except BadVersionError:
            continue
        except NoNodeError:
            raise UnknownTopicOrPartitionError(f"The topic '{name}' does not exist.") from None
        except KazooException as e:
            raise ZooKeeperUnavailableError(
                f"cannot write topic {name}'s config to ZooKeeper ({type(e).__name__}); it may or may not have "
                "changed: describe it, then retry") from e
        if name in ctx.replicas.topics:  # this broker's replicas follow at once
            applied: dict[str, str | None] = dict(checked)
            ctx.replicas.alter_topic_configs(name, applied)
        return
    raise InvalidRequestError(f"topic {name}'s config changed {ALTER_ATTEMPTS} times while this request was "
                              "altering it; retry")


async def handle_alter_configs(ctx: HandlerContext, req: DecodedRequest) -> AlterConfigsResponse:
    with ctx.replicas.one_topic_metadata_write():
        results = await _handle_alter(ctx, req, "alter_configs", legacy_configs)
    return AlterConfigsResponse(throttle_time_ms=0, responses=[
        AlterConfigsResponse.AlterConfigsResourceResponse(error_code=code, error_message=message, resource_type=kind,
                                                          resource_name=name)
        for code, message, kind, name in results])


async def handle_incremental_alter_configs(ctx: HandlerContext, req: DecodedRequest) -> IncrementalAlterConfigsResponse:
    with ctx.replicas.one_topic_metadata_write():
        results = await _handle_alter(ctx, req, "incremental_alter_configs", incremental_configs)
    return IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=[
        IncrementalAlterConfigsResponse.AlterConfigsResourceResponse(
            error_code=code, error_message=message, resource_type=kind, resource_name=name)
        for code, message, kind, name in results])
