"""Per-partition log configuration, keyed by Kafka's topic-level config names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ads_broker.exceptions import InvalidConfigurationError

_LONG_MAX = 2**63 - 1
_INT_MAX = 2**31 - 1

# Kafka topic config name -> (LogConfig field, minimum, maximum). Ranges follow Kafka's
# TopicConfig / LogConfig validators (segment.bytes >= 14 = LegacyRecord.RECORD_OVERHEAD_V0,
# segment.index.bytes >= 4, segment.ms and flush.messages >= 1, the rest >= 0 or -1).
_INT_KEYS: dict[str, tuple[str, int, int]] = {
    "segment.bytes": ("segment_bytes", 14, _INT_MAX),
    "segment.ms": ("segment_ms", 1, _LONG_MAX),
    "retention.ms": ("retention_ms", -1, _LONG_MAX),
    "retention.bytes": ("retention_bytes", -1, _LONG_MAX),
    "flush.messages": ("flush_interval_messages", 1, _LONG_MAX),
    "flush.ms": ("flush_interval_ms", 0, _LONG_MAX),
    "index.interval.bytes": ("index_interval_bytes", 0, _INT_MAX),
    "segment.index.bytes": ("segment_index_bytes", 4, _INT_MAX),
    "max.message.bytes": ("max_message_bytes", 0, _INT_MAX),
    "file.delete.delay.ms": ("file_delete_delay_ms", 0, _LONG_MAX),
    "delete.retention.ms": ("delete_retention_ms", 0, _LONG_MAX),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", 0, _LONG_MAX),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", 1, _LONG_MAX),
    "message.timestamp.before.max.ms": ("message_timestamp_before_max_ms", 0, _LONG_MAX),
    "message.timestamp.after.max.ms": ("message_timestamp_after_max_ms", 0, _LONG_MAX),
    "min.insync.replicas": ("min_insync_replicas", 1, _INT_MAX),
}
_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
_CLEANUP_POLICIES = frozenset({"delete", "compact"})
#: Kafka's ``compression.type`` values (``BrokerCompressionType``) -> the codec id batches are
#: stored with; ``producer`` (None) keeps each batch as the producer compressed it.
COMPRESSION_TYPES: dict[str, int | None] = {"producer": None, "uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3,
                                            "zstd": 4}

TOPIC_CONFIG_KEYS: frozenset[str] = frozenset(
    [*_INT_KEYS, "message.timestamp.type", "cleanup.policy", "min.cleanable.dirty.ratio", "compression.type",
     "unclean.leader.election.enable"]
)

#: Kafka's ``ConfigDef.Type`` of each topic config (``LogConfig``'s definitions), as DescribeConfigs
#: v3+ reports it: the names of ``DescribeConfigsResponse.ConfigType``.
TOPIC_CONFIG_TYPES: dict[str, str] = {
    "segment.bytes": "INT", "segment.ms": "LONG", "retention.ms": "LONG", "retention.bytes": "LONG",
    "flush.messages": "LONG", "flush.ms": "LONG", "index.interval.bytes": "INT", "segment.index.bytes": "INT",
    "max.message.bytes": "INT", "file.delete.delay.ms": "LONG", "delete.retention.ms": "LONG",
    "min.compaction.lag.ms": "LONG", "max.compaction.lag.ms": "LONG", "message.timestamp.before.max.ms": "LONG",
    "message.timestamp.after.max.ms": "LONG", "min.insync.replicas": "INT", "message.timestamp.type": "STRING",
    "cleanup.policy": "LIST", "min.cleanable.dirty.ratio": "DOUBLE", "compression.type": "STRING",
    "unclean.leader.election.enable": "BOOLEAN",
}
assert set(TOPIC_CONFIG_TYPES) == TOPIC_CONFIG_KEYS


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The topic-level settings one partition log obeys; defaults are Kafka's."""

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    retention_ms: int = 604800000
    retention_bytes: int = -1
    flush_interval_messages: int = _LONG_MAX
    flush_interval_ms: int = _LONG_MAX
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10485760
    max_message_bytes: int = 1048588
    message_timestamp_type: str = "CreateTime"
    cleanup_policy: str = "delete"
    file_delete_delay_ms: int = 60000
    delete_retention_ms: int = 86400000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = _LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5
    #: KIP-937 (Kafka 3.6+): a CreateTime record more than this far in the past / future of the
    #: broker's clock is refused with INVALID_TIMESTAMP; Kafka 4.0's defaults (KIP-1030).
    message_timestamp_before_max_ms: int = _LONG_MAX
    message_timestamp_after_max_ms: int = 3600000
    #: In-sync replicas an acks=all write needs; one node has one, so a value above 1 leaves every
    #: partition of the topic under its minimum ISR (exported by ads_broker/metrics.py).
    min_insync_replicas: int = 1
    #: Kafka's ``compression.type``: ``producer`` keeps batches as sent; a codec name (or
    #: ``uncompressed``) makes the broker store every client batch with that codec, recompressing
    #: those that differ (Kafka's ``LogValidator``).
    compression_type: str = "producer"
    #: Kafka's topic-level ``unclean.leader.election.enable``: the controller may elect a live
    #: replica outside the ISR when no ISR member is alive (acknowledged writes it lacks are lost;
    #: docs/CLUSTER.md). Not used by the log itself; kept here so it is validated, stored and
    #: described like every other topic config.
    unclean_leader_election_enable: bool = False
    #: Not a Kafka config: record each segment's fsynced length in ``.log.synced`` (the fault hook,
    #: ads_broker/faults.py; set by the broker when ADS_BROKER_FAULT_FILE is set, never by a topic).
    record_synced_length: bool = False

    @property
    def target_codec(self) -> int | None:
        """The codec id client batches are stored with; None: as the producer sent them."""
        return COMPRESSION_TYPES[self.compression_type]

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @classmethod
    def from_topic_config(cls, props: Mapping[str, str]) -> LogConfig:
        """Build from Kafka topic config names; unknown keys are ignored (the caller validates them)."""
        values: dict[str, Any] = {}
        for key, (field_name, low, high) in _INT_KEYS.items():
            if key in props:
                values[field_name] = _parse_int(key, props[key], low, high)
        if "message.timestamp.type" in props:
            values["message_timestamp_type"] = _parse_timestamp_type(props["message.timestamp.type"])
        if "cleanup.policy" in props:
            values["cleanup_policy"] = _parse_cleanup_policy(props["cleanup.policy"])
        if "min.cleanable.dirty.ratio" in props:
            values["min_cleanable_dirty_ratio"] = _parse_ratio(props["min.cleanable.dirty.ratio"])
        if "compression.type" in props:
            values["compression_type"] = parse_compression_type(props["compression.type"])
        if "unclean.leader.election.enable" in props:
            values["unclean_leader_election_enable"] = parse_bool("unclean.leader.election.enable",
                                                                  props["unclean.leader.election.enable"])
        return cls(**values)

    def to_topic_config(self) -> dict[str, str]:
        """Every key this class knows, under its Kafka name, as DescribeConfigs reports it."""
        out = {key: str(getattr(self, field_name)) for key, (field_name, _, _) in _INT_KEYS.items()}
        out["message.timestamp.type"] = self.message_timestamp_type
        out["cleanup.policy"] = self.cleanup_policy
        out["min.cleanable.dirty.ratio"] = str(self.min_cleanable_dirty_ratio)
        out["compression.type"] = self.compression_type
        out["unclean.leader.election.enable"] = "true" if self.unclean_leader_election_enable else "false"
        return out

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"


def _parse_int(key: str, raw: str, low: int, high: int) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidConfigurationError(
            f"Invalid value {raw!r} for configuration {key}: not an integer; use a whole number in [{low}, {high}]"
        ) from None
    if not low <= value <= high:
        raise InvalidConfigurationError(f"Invalid value {value} for configuration {key}: must be in [{low}, {high}]")
    return value


def parse_bool(key: str, raw: str) -> bool:
    """Kafka's ``ConfigDef.Type.BOOLEAN``: ``true`` or ``false``, in any case."""
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise InvalidConfigurationError(f"Invalid value {raw!r} for configuration {key}: Expected value to be either "
                                        "true or false")
    return value == "true"


def _parse_timestamp_type(raw: str) -> str:
    value = str(raw).strip()
    if value not in _TIMESTAMP_TYPES:
        raise InvalidConfigurationError(
            f"Invalid value {raw!r} for configuration message.timestamp.type: "
            f"must be one of {', '.join(_TIMESTAMP_TYPES)}"
        )
    return value


def _parse_cleanup_policy(raw: str) -> str:
    parts = [p.strip() for p in str(raw).split(",") if p.strip()]
    if not parts or any(p not in _CLEANUP_POLICIES for p in parts):
        raise InvalidConfigurationError(
            f"Invalid value {raw!r} for configuration cleanup.policy: must be a comma-separated list of delete, compact"
        )
    return ",".join(dict.fromkeys(parts))


def _parse_ratio(raw: str) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise InvalidConfigurationError(
            f"Invalid value {raw!r} for configuration min.cleanable.dirty.ratio: must be a number in [0, 1]"
        )
    return value


def parse_compression_type(raw: str, key: str = "compression.type") -> str:
    """Kafka's ``compression.type`` values, case as Kafka writes them (lower case)."""
    value = str(raw).strip()
    if value not in COMPRESSION_TYPES:
        raise InvalidConfigurationError(
            f"Invalid value {raw!r} for configuration {key}: String must be one of: {', '.join(COMPRESSION_TYPES)}"
        )
    return value
