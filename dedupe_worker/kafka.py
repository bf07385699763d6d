"""confluent-kafka client settings and topic checks shared by the worker, loadgen and demo."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from dedupe_worker.exceptions import ConfigError, TopicLayoutError

BASE = {"partitioner": "murmur2_random"}

#: Client settings the exactly-once order of effects depends on (docs/WORKER.md, "Configuration"):
#: a ``[kafka]`` override of one of them would silently void the guarantee, so it is refused.
PINNED = {
    "enable.idempotence": "an acknowledged batch retried by the producer would be written twice",
    "acks": "an acknowledged output record could be lost with its leader",
    "request.required.acks": "an acknowledged output record could be lost with its leader",
    "transactional.id": "the worker fences other writers of a partition by its own per-partition id",
    "isolation.level": "reconcile would insert ids of aborted output batches, which downstream never sees",
    "enable.auto.commit": "input offsets would be committed before their output was published",
    "enable.auto.offset.store": "input offsets would be committed before their output was published",
    "auto.offset.reset": "a partition without a valid committed offset must start at the earliest input record; "
                         "latest would skip input that is still in the log, error would stop the partition",
}


def check_overrides(extra: Mapping[str, str]) -> None:
    """Refuse ``[kafka]`` settings that would void exactly-once (:data:`PINNED`)."""
    bad = sorted(set(extra) & set(PINNED))
    if bad:
        why = "; ".join(f"{k}: {PINNED[k]}" for k in bad)
        raise ConfigError(f"kafka settings {bad} are set by the worker and cannot be overridden ({why}); "
                          "remove them from [kafka] / DEDUPE_KAFKA__*")


def producer_config(bootstrap: str, extra: Mapping[str, str] | None = None, **more: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {**BASE, "bootstrap.servers": bootstrap, "enable.idempotence": True,
                            "acks": "all", "linger.ms": 5, "queue.buffering.max.messages": 500_000}
    conf.update(extra or {})
    conf.update(more)
    return conf


#: The ``[kafka]`` settings every client of the worker needs, admin clients included: how to reach
#: and authenticate to the brokers (docs/SECURITY.md).
CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.", "client.id", "socket.", "broker.address.family")


def admin_config(bootstrap: str, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An AdminClient's settings: the bootstrap servers plus the connection and authentication
    settings of ``extra`` (producer- or consumer-only settings would only draw warnings)."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    conf.update({k: v for k, v in (extra or {}).items() if k.startswith(CONNECTION_PREFIXES)})
    return conf


def check_durable(bootstrap: str, topics: list[str], timeout_s: float = 10.0,
                  extra: Mapping[str, str] | None = None, admin: AdminClient | None = None) -> None:
    """Refuse topics that can lose an acknowledged write (ARCHITECTURE invariant 10): each needs
    replicas with ``min.insync.replicas`` >= 2 and no unclean leader election (Kafka, MSK).
    ``admin``: a client to reuse (each new one costs a connection and a metadata round trip)."""
    if admin is None:  # not `admin or ...`: an idle AdminClient is falsy (__len__ counts queued requests)
        admin = AdminClient(admin_config(bootstrap, extra))
    try:
        md = admin.list_topics(timeout=timeout_s)
        resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in topics]
        configs = {r.name: f.result(timeout_s) for r, f in admin.describe_configs(resources).items()}
    except (KafkaException, TimeoutError) as e:
        raise TopicLayoutError(f"cannot read the configs of {topics} on {bootstrap} ({e!r}) to check that they keep "
                               "acknowledged writes; is the broker up and does it support DescribeConfigs?") from e
    for name in topics:
        conf = {k: v.value for k, v in configs[name].items()}
        t = md.topics[name]
        replicas = min(len(p.replicas) for p in t.partitions.values())
        fsynced = conf.get("flush.messages") == "1"
        replicated = (replicas >= 2 and int(conf.get("min.insync.replicas") or 1) >= 2
                      and conf.get("unclean.leader.election.enable", "false") == "false")
        if not (fsynced or replicated):
            raise TopicLayoutError(
                f"topic {name!r} on {bootstrap} cannot keep acknowledged output across a broker crash "
                f"({replicas} replica(s), min.insync.replicas={conf.get('min.insync.replicas')}, "
                f"flush.messages={conf.get('flush.messages')}): the worker would record ids whose records the "
                "broker then loses. Set flush.messages=1 on a single broker (`kafka-configs --alter --add-config "
                "flush.messages=1`), or use replication.factor >= 3 with min.insync.replicas=2; or, for a "
                "throwaway test broker only, set require_durable_output = false")


def consumer_config(bootstrap: str, group: str, extra: Mapping[str, str] | None = None,
                    **more: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": group,
                            "enable.auto.commit": False, "enable.auto.offset.store": False,
                            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 20}
    conf.update(extra or {})
    conf.update(more)
    return conf


def partition_counts(bootstrap: str, topics: list[str], timeout_s: float = 10.0,
                     extra: Mapping[str, str] | None = None, admin: AdminClient | None = None) -> dict[str, int]:
    """Partition count of each topic; raises :class:`TopicLayoutError` for a missing one."""
    if admin is None:  # not `admin or ...`: an idle AdminClient is falsy (__len__ counts queued requests)
        admin = AdminClient(admin_config(bootstrap, extra))
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as e:
        raise TopicLayoutError(f"cannot read metadata from {bootstrap}: {e}; is the broker up?") from e
    out: dict[str, int] = {}
    for name in topics:
        t = md.topics.get(name)
        if t is None or t.error is not None or not t.partitions:
            raise TopicLayoutError(f"topic {name!r} does not exist on {bootstrap}; create it with the "
                                   "same partition count as the input topic")
        out[name] = len(t.partitions)
    return out


def check_layout(bootstrap: str, input_topic: str, output_topic: str,
                 extra: Mapping[str, str] | None = None, admin: AdminClient | None = None,
                 counts: Mapping[str, int] | None = None) -> int:
    """Input and output must have the same partition count (partition p → partition p).
    ``counts``: the topics' partition counts if the caller has them (:func:`partition_counts`)."""
    if counts is None:
        counts = partition_counts(bootstrap, [input_topic, output_topic], extra=extra, admin=admin)
    if counts[input_topic] != counts[output_topic]:
        raise TopicLayoutError(
            f"input topic {input_topic!r} has {counts[input_topic]} partitions but output topic "
            f"{output_topic!r} has {counts[output_topic]}; the worker for input partition p writes output "
            "partition p, so recreate the output topic with the same partition count")
    return counts[input_topic]


#: Topic configs that keep every acknowledged write of a single-replica topic across a machine
#: crash: the broker fsyncs each append before acknowledging it (docs/STORAGE.md's contract).
DURABLE = {"flush.messages": "1"}


def create_topics(bootstrap: str, topics: Mapping[str, int], timeout_s: float = 30.0, *,
                  durable: bool = False, extra: Mapping[str, str] | None = None) -> None:
    """Create topics (name → partitions) with explicit retention configs; existing ones are kept.
    ``durable``: one replica that fsyncs every append (:data:`DURABLE`), as the worker requires
    of its output and dead-letter topics (:func:`check_durable`)."""
    admin = AdminClient(admin_config(bootstrap, extra))
    config = {"retention.ms": "-1", "retention.bytes": "-1", **(DURABLE if durable else {})}
    new = [NewTopic(name, n, 1, config=dict(config)) for name, n in topics.items()]
    for name, fut in admin.create_topics(new, operation_timeout=timeout_s).items():
        try:
            fut.result(timeout=timeout_s)
        except KafkaException as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e) and "already exists" not in str(e):
                raise TopicLayoutError(f"cannot create topic {name!r} on {bootstrap}: {e}") from e
