"""Dynamic broker configs: the broker-wide defaults of topic configs, changed without a restart.

Kafka lets IncrementalAlterConfigs/AlterConfigs change some broker configs at run time
(``DynamicBrokerConfig``): for the resource name ``""`` they become the cluster-wide defaults
(DYNAMIC_DEFAULT_BROKER_CONFIG), for a broker id that broker's own (DYNAMIC_BROKER_CONFIG, which
wins). The effective value is: this broker's dynamic config, else the dynamic default, else the
static config (server.properties, ``--override``), else the default. Here the dynamic ones are the
``log.*`` defaults of topic configs (:data:`~ads_broker.config.DYNAMIC_SETTINGS`, Kafka's
``DynamicLogConfig``): a change applies at once to every partition of every topic that does not
override it (retention, segment size, cleanup policy, compression, ...), as in Kafka.

Kafka's tools (and librdkafka's test 0081) also alter broker configs that ads-broker has no use
for: the SASL login configs of Kafka's ``DynamicListenerConfig`` (``sasl.kerberos.*``,
``sasl.login.refresh.*``; per broker id only, Kafka's ``PerBrokerConfigs``) and the thread counts
of ``DynamicThreadPool`` (``background.threads``, ``num.io.threads``, ``num.replica.fetchers``;
within half and double the current value). They are validated with Kafka's types and rules, kept
and described like the others, and change nothing else.

Single node: kept in ``<log dir>/dynamic-broker-configs.json`` (written atomically and fsynced),
loaded before any log is opened, so they survive a restart as Kafka's (kept in ZooKeeper or the
metadata log) do. Cluster mode would keep them in ZooKeeper (``/config/brokers/<default>`` and
``/config/brokers/<id>``); that is not built, so a change is refused there with a clear error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from ads_broker.config import (
    DYNAMIC_SETTINGS,
    PER_BROKER_DYNAMIC_SETTINGS,
    SETTINGS,
    THREAD_POOL_SETTINGS,
    BrokerConfig,
    parse_dynamic,
)
from ads_broker.exceptions import ConfigError, InvalidConfigurationError, InvalidRequestError
from ads_broker.log.fileutil import atomic_write

log = structlog.get_logger("ads_broker.dynamic_config")

FILE = "dynamic-broker-configs.json"
KNOWN = frozenset(s.name for s in SETTINGS)


def load(data_dir: Path, config: BrokerConfig) -> None:
    """Install the dynamic configs kept in ``data_dir`` (none when the file is absent)."""
    path = data_dir / FILE
    if not path.exists():
        return
    default, broker = raw_layers(data_dir)
    unknown = sorted((set(default) | set(broker)) - DYNAMIC_SETTINGS)
    if unknown:
        raise ConfigError(f"{path}: {unknown} cannot be dynamic broker configs; remove them from the file")
    config.set_dynamic(parse_dynamic(default, str(path)), parse_dynamic(broker, str(path)))
    log.info("dynamic broker configs loaded", default=default, broker=broker)


def raw_layers(data_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The dynamic configs as given (strings): (cluster-wide defaults, this broker's)."""
    path = data_dir / FILE
    if not path.exists():
        return {}, {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return dict(raw["default"]), dict(raw["broker"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: cannot read the dynamic broker configs ({e}); fix or remove the file "
                          "(its configs then fall back to the static ones)") from e


def check_names(names: Iterable[str], *, per_broker: bool) -> None:
    """Kafka's answers: an unknown name is INVALID_CONFIG, a known static one INVALID_REQUEST, a
    per-broker one for the cluster-wide defaults INVALID_REQUEST (``DynamicBrokerConfig.validateConfigs``)."""
    names = list(names)
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        raise InvalidConfigurationError(f"Unknown broker config name(s): {', '.join(unknown)} "
                                        "(`ads-broker configs` lists them)")
    static = [n for n in names if n not in DYNAMIC_SETTINGS]
    if static:
        # Kafka's DynamicBrokerConfig.validateConfigs text (INVALID_REQUEST, KAFKA-13609)
        listed = ", ".join(static)
        raise InvalidRequestError(f"Cannot update these configs dynamically: Set({listed}); "
                                  "configure them in server.properties (or --override) and restart. Dynamic here: "
                                  "the log.* defaults of topic configs (docs/BROKER.md)")
    cluster_level = [n for n in names if n in PER_BROKER_DYNAMIC_SETTINGS] if not per_broker else []
    if cluster_level:
        raise InvalidRequestError("Cannot update these configs at default cluster level, broker id must be "
                                  f"specified: Set({', '.join(cluster_level)})")


def check_thread_counts(config: BrokerConfig, default: Mapping[str, Any], broker: Mapping[str, Any]) -> None:
    """Kafka's ``DynamicThreadPool.validateReconfiguration``: a thread count that changes must stay
    within half and double its current value (INVALID_REQUEST, Kafka's text)."""
    for name in sorted(THREAD_POOL_SETTINGS):
        old = int(config[name])
        new = int(broker.get(name, default.get(name, config.values[name])))
        if new == old:
            continue
        failed = f"Dynamic thread count update validation failed for {name}={new}"
        if new <= 0:
            raise InvalidRequestError(f"{failed}, value should be at least 1")
        if new < old // 2:
            raise InvalidRequestError(f"{failed}, value should be at least half the current value {old}")
        if new > old * 2:
            raise InvalidRequestError(f"{failed}, value should not be greater than double the current value {old}")


def apply(data_dir: Path, config: BrokerConfig, default: Mapping[str, str], broker: Mapping[str, str],
          check_topics: Callable[[], object], *, validate_only: bool) -> None:
    """Validate new layers (each value as the static configs are; then ``check_topics`` with the
    new layers installed: every topic's config must still build), then keep and install them.
    On any error, or with ``validate_only``, the previous layers stay. The caller applies the
    new topic configs to the logs."""
    check_names(default, per_broker=False)
    check_names(broker, per_broker=True)
    try:
        parsed_default = parse_dynamic(default, "dynamic broker config")
        parsed_broker = parse_dynamic(broker, "dynamic broker config")
    except ConfigError as e:
        raise InvalidConfigurationError(str(e)) from e
    check_thread_counts(config, parsed_default, parsed_broker)
    previous = (config.dynamic_default, config.dynamic_broker)
    config.set_dynamic(parsed_default, parsed_broker)
    try:
        check_topics()
        if validate_only:
            config.set_dynamic(*previous)
            return
        text = json.dumps({"version": 1, "default": dict(default), "broker": dict(broker)}, indent=1, sort_keys=True)
        atomic_write(data_dir / FILE, (text + "\n").encode())
    except BaseException:
        config.set_dynamic(*previous)
        raise
    log.info("dynamic broker configs altered", default=dict(default), broker=dict(broker))
