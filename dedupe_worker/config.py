"""Worker configuration: a TOML file, then ``DEDUPE_*`` environment variables, then CLI flags.

Later sources win (flags > env > file > defaults). Unknown keys are errors, so a typo in the
file fails at start with the key's name instead of silently using a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from dedupe_worker.exceptions import ConfigError
from dedupe_worker.kafka import check_overrides
from dedupe_worker.store.rocksdb import RocksDBOptions


def parse_partitions(spec: str | list[int] | None) -> list[int] | None:
    """``"0-3,7"`` → ``[0, 1, 2, 3, 7]``; None means every partition of the input topic."""
    if spec is None or isinstance(spec, list):
        return spec
    out: list[int] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"bad partition range {part!r}: use e.g. '0-3' or '0,2,5'") from None
        if first < 0 or last < first:
            raise ValueError(f"bad partition range {part!r}: need 0 <= first <= last")
        out.extend(range(first, last + 1))
    if len(set(out)) != len(out):
        raise ValueError(f"partition {spec!r} lists a partition twice")
    return sorted(out)


class AgingConfig(BaseModel):
    """Segment's "by size, not time": bound each partition's keys, keep at least ``min_window_s``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_keys: int | None = Field(default=None, gt=0)
    max_bytes: int | None = Field(default=None, gt=0)
    min_window_s: float = Field(default=0.0, ge=0)
    window_floor_s: float = Field(default=24 * 3600.0, ge=0)
    chunk: int = Field(default=10_000, gt=0)
    #: How far a client's record timestamp may be from the worker's clock, either way, and still be
    #: kept on the output (and dead-letter) record; well under Kafka's own limit for future
    #: timestamps (``log.message.timestamp.after.max.ms``, 1 h by default since Kafka 4.0), which
    #: would refuse the record. Outside it the record gets the worker's clock (the input's
    #: timestamp moves to the ``dedupe.source.timestamp`` header). First-seen times for aging are the
    #: worker's clock; ids replayed from the output are stamped ``min(timestamp + tolerance, now)``,
    #: never earlier than they were published (docs/WORKER.md, "Aging").
    timestamp_tolerance_s: float = Field(default=900.0, ge=0)


class StoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bloom_bits_per_key: float = Field(default=10.0, ge=0)
    ribbon: bool = False
    # None: 0.1 without key filters, off with them (docs/WORKER.md, "Lookups")
    memtable_bloom_ratio: float | None = Field(default=None, ge=0, le=0.25)
    # in-memory blocked Bloom filter per generation, probed before any MultiGet; 0 turns it off
    key_filter_bits_per_key: float = Field(default=10.0, ge=0, le=32)
    block_cache_mb: int = Field(default=64, gt=0)
    # small memtables: a random-key skiplist insert is mostly cache misses (docs/WORKER.md)
    write_buffer_mb: int = Field(default=8, gt=0)
    # L0 files that start a compaction: a generation is written once in random key order, so a
    # higher trigger means fewer rewrites of its L1 (docs/WORKER.md)
    level0_compaction_trigger: int = Field(default=8, ge=2, le=16)
    compression: Literal["none", "snappy", "lz4", "zstd"] = "lz4"
    sync_writes: bool = False
    # keys per generation column family (aging drops whole generations; every live generation
    # costs one MultiGet per batch). None: a quarter of [aging] max_keys, or of max_bytes / 30 B,
    # or one unbounded generation when nothing bounds the store.
    generation_keys: int | None = Field(default=None, gt=0)

    def rocksdb(self, aging: AgingConfig | None = None) -> RocksDBOptions:
        fields = self.model_dump()
        fields["generation_keys"] = self.generation_keys or default_generation_keys(aging or AgingConfig())
        return RocksDBOptions(**fields)


GENERATIONS = 4
BYTES_PER_KEY = 30  # measured 19-27 B/key on disk (docs/WORKER.md); a conservative divisor


def window_keys(aging: AgingConfig) -> int | None:
    """The most keys aging keeps per partition (the tighter of max_keys and max_bytes / 30 B);
    None when nothing bounds the store."""
    bounds = []
    if aging.max_keys is not None:
        bounds.append(aging.max_keys)
    if aging.max_bytes is not None:
        bounds.append(aging.max_bytes // BYTES_PER_KEY)
    return max(1, min(bounds)) if bounds else None


def default_generation_keys(aging: AgingConfig) -> int:
    """A quarter of the aging bound, so aging drops 25 % of the window at a time and a lookup
    probes at most about five generations; one generation when nothing bounds the store."""
    bound = window_keys(aging)
    if bound is None:
        return 2**62
    return max(1, bound // GENERATIONS)


class WorkerConfig(BaseSettings):
    """Everything a `dedupe-worker run` needs. See docs/WORKER.md for each setting."""

    model_config = SettingsConfigDict(env_prefix="DEDUPE_", env_nested_delimiter="__", extra="forbid",
                                      frozen=True)

    bootstrap: str = "127.0.0.1:9092"
    input_topic: str = "events"
    output_topic: str = "events.deduped"
    dlq_topic: str = "events.dlq"
    duplicates_topic: str | None = None
    partitions: Annotated[list[int] | None, NoDecode] = None
    assignment: Literal["static", "group"] = "static"
    group: str = "dedupe"
    data_dir: Path = Path("./data/dedupe")
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    #: address ``/metrics`` binds: loopback by default; ``0.0.0.0`` (or the host's private address)
    #: for a Prometheus on another host. The control port always stays on loopback.
    metrics_host: str = "127.0.0.1"
    control_port: int | None = Field(default=None, ge=0, le=65535)
    exactly_once: Literal["reconcile", "transactional"] = "reconcile"
    batch_size: int = Field(default=5000, gt=0, le=100_000)
    batch_timeout_ms: int = Field(default=50, gt=0, le=10_000)
    delivery_timeout_s: float = Field(default=30.0, gt=0)
    #: Mode ``reconcile`` only: consume and look up batch N+1 while batch N's acks are in flight
    #: (:meth:`PartitionWorker.step`). Off by default: at 10M keys it bought ~6 % of throughput for
    #: ~0.5 µs/msg more CPU (docs/WORKER.md, "Throughput").
    pipeline: bool = False
    #: Refuse to start when the output or dead-letter topic can lose acknowledged writes
    #: (:func:`dedupe_worker.kafka.check_durable`). Off only for throwaway test brokers.
    require_durable_output: bool = True
    #: Static assignment: a partition whose thread shows no sign of life for this long (blocked in a
    #: call that never returns) makes the worker dump every thread's stack and exit with code 1, so
    #: a supervisor restarts it; reconcile progress and pauses count as signs of life.
    stall_timeout_s: float = Field(default=300.0, gt=0)
    aging: AgingConfig = AgingConfig()
    store: StoreConfig = StoreConfig()
    kafka: dict[str, str] = Field(default_factory=dict)

    @field_validator("partitions", mode="before")
    @classmethod
    def _partitions(cls, v: Any) -> Any:
        return parse_partitions(v) if isinstance(v, str) else v

    def topics(self) -> list[str]:
        """Input, output, dead-letter and (when set) duplicates topic."""
        names = [self.input_topic, self.output_topic, self.dlq_topic]
        if self.duplicates_topic:
            names.append(self.duplicates_topic)
        return names

    @model_validator(mode="after")
    def _topics_differ(self) -> WorkerConfig:
        names = self.topics()
        if len(set(names)) != len(names):
            raise ValueError(f"input, output, dead-letter and duplicates topics must differ, got {names}")
        if "partitioner" in self.kafka and self.kafka["partitioner"] != "murmur2_random":
            raise ValueError("kafka.partitioner must stay murmur2_random (Java-compatible partitioning)")
        try:
            check_overrides(self.kafka)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return self

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    def partition_dir(self, partition: int) -> Path:
        return self.data_dir / f"partition-{partition}"


def load_config(path: Path | None = None, **overrides: Any) -> WorkerConfig:
    """Build the config from ``path`` (TOML, optional), ``DEDUPE_*`` env and ``overrides`` (None = unset)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"config file {path} does not exist; pass an existing TOML file or omit --config")

    class _FromFile(WorkerConfig):
        model_config = SettingsConfigDict(toml_file=path)

    try:
        return _FromFile(**given)
    except ValidationError as e:
        where = f" (file {path})" if path else ""
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'config'}: {err['msg']}"
                             for err in e.errors())
        raise ConfigError(f"invalid worker configuration{where}: {problems}") from None
