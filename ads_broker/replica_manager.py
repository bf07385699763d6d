"""Topics, partitions and their logs on one broker node.

Invariants this class keeps:

- Topic metadata (name, id, partition count, config overrides) is written to
  ``<data-dir>/topic-metadata.json`` atomically (temp file, fsync, rename, fsync of the directory)
  *before* a change is visible to clients, so a crash never leaves a topic that clients saw
  but the broker forgets.
- One process owns a data dir at a time (``flock`` on ``<data-dir>/.lock``).
- Creating a topic or partitions is all or nothing: if opening any new log fails (EMFILE, ENOSPC,
  ...) every log opened for it is closed and its directory removed before the error is answered
  (KAFKA_STORAGE_ERROR), so a failed request leaks no file descriptor and leaves no directory.
  Requests that would exceed ``max.partitions.per.topic``, ``max.partitions.per.request``,
  ``max.broker.partitions`` or the process's open-file limit are refused before any file is
  opened (POLICY_VIOLATION). Internal topics, created by the broker from its own settings, are
  exempt.
- On a clean shutdown every log is flushed and closed, the recovery points are checkpointed
  (``recovery-point-offset-checkpoint``, Kafka's text format) and the clean-shutdown marker
  ``.kafka_cleanshutdown`` is written last. On start the marker is consumed: without it every log
  is recovered from its recovery point (batches validated, torn tail truncated, indexes and
  producer state rebuilt).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import resource
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from ads_broker.config import BrokerConfig, validate_topic_configs
from ads_broker.exceptions import (
    BrokerError,
    ConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    KafkaStorageError,
    PolicyViolationError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from ads_broker.log.config import TOPIC_CONFIG_KEYS, LogConfig
from ads_broker.log.fileutil import atomic_write, fsync_dir
from ads_broker.log.log import Log
from ads_broker.log.segment import READ_HANDLES

log = structlog.get_logger("ads_broker.replica_manager")

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
TOPIC_METADATA_FILE = "topic-metadata.json"
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


#: Configs every internal topic (``__consumer_offsets``, ``__transaction_state``) gets on a single
#: broker: each append is fsynced before it is acknowledged. The transaction coordinator's state
#: must be as durable as the data it describes: a power cut that kept a transaction's fsynced
#: records on an output partition (``flush.messages=1``) but lost the coordinator's record of it
#: left that transaction open forever, its last stable offset stuck (found by dedupe-chaos,
#: docs/RELIABILITY.md). Kafka gets the same from replicating these topics (min.insync.replicas).
INTERNAL_TOPIC_CONFIGS = {"flush.messages": "1"}

#: File descriptors a new, empty partition holds: its active segment's ``.log`` (an append and a
#: read descriptor), ``.index`` and ``.timeindex``.
FDS_PER_NEW_PARTITION = 4
#: Descriptors kept free after creating partitions, whatever RLIMIT_NOFILE is: client connections,
#: segment rolls, snapshots and the cleaner need them (at least this many, or a tenth of the limit).
MIN_FD_RESERVE = 64


def fd_headroom() -> tuple[int, int] | None:
    """(descriptors in use, RLIMIT_NOFILE soft limit) of this process; None where unknown."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        return None
    return in_use, soft


def now_ms() -> int:
    return int(time.time() * 1000)


def validate_topic_name(name: str) -> None:
    """Kafka's ``Topic.validate``: what a topic name may be."""
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME:
        raise InvalidTopicError(f"topic name is {len(name)} characters long, the maximum is {MAX_TOPIC_NAME}")
    if not _LEGAL_TOPIC.match(name):
        raise InvalidTopicError(f"topic name {name!r} has characters outside [a-zA-Z0-9._-]")


@dataclass
class Partition:
    """A partition's log plus what the network layer needs around it.

    Appends run on a writer thread (the page-cache write is the slowest step, and the GIL is
    released during it); ``lock`` serializes every access to ``log`` between that thread and the
    event loop, so readers never see a half-applied append.
    """

    topic: str
    index: int
    log: Log
    leader_epoch: int = 0
    waiters: set[asyncio.Future[None]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def high_watermark(self) -> int:
        # One replica: everything appended is on every in-sync replica.
        return self.log.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        # The first offset of the oldest open transaction, or the high watermark (caller holds lock).
        return self.log.last_stable_offset(self.high_watermark)

    def notify(self) -> None:
        """Wake long-polling fetches waiting on this partition."""
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(None)
        self.waiters.clear()


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]  # explicit overrides; defaults come from the broker config
    partitions: list[Partition]
    internal: bool = False


def _read_recovery_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Kafka's checkpoint format: version line, count line, then ``topic partition offset``."""
    if not path.exists():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        version, count = int(lines[0]), int(lines[1])
        if version != 0 or count != len(lines) - 2:
            raise ValueError("header does not match the entries")
        out = {}
        for line in lines[2:]:
            topic, partition, offset = line.rsplit(" ", 2)
            out[(topic, int(partition))] = int(offset)
        return out
    except (ValueError, IndexError) as e:
        # Losing the checkpoint only costs a longer recovery: recover everything from offset 0.
        log.warning("recovery checkpoint unreadable, recovering all logs from the start", path=str(path), error=str(e))
        return {}


class ReplicaManager:
    """Owns every partition log in one data dir and the topic metadata that names them."""

    def __init__(self, data_dir: Path, config: BrokerConfig, *, record_synced_length: bool = False) -> None:
        self.data_dir = data_dir
        self.config = config
        self.record_synced_length = record_synced_length  # the fault hook's .log.synced files (faults.py)
        READ_HANDLES.max_open = int(config["log.open.segment.files.max"])
        self.topics: dict[str, Topic] = {}
        self._lock_fd: int | None = None
        self.clean_start = False

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        self.clean_start = marker.exists()
        recovery_points = _read_recovery_checkpoint(self.data_dir / RECOVERY_CHECKPOINT_FILE)
        started = time.monotonic()
        for meta in self._read_topic_metadata():
            self._load_topic(meta, recovery_points)
        # Consume the marker only after every log loaded: a crash during loading must recover again.
        # The unlink is fsynced: a marker that a power cut brought back would skip the next recovery.
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
            fsync_dir(self.data_dir)
        log.info("logs loaded", topics=len(self.topics), clean_shutdown=self.clean_start,
                 seconds=round(time.monotonic() - started, 3), data_dir=str(self.data_dir))

    def _lock_data_dir(self) -> None:
        fd = os.open(self.data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"data dir {self.data_dir} is in use by another ads-broker process "
                              "(stop it first, or pick another --data-dir)") from None
        self._lock_fd = fd

    def close(self) -> None:
        """Clean shutdown: flush and close every log, checkpoint, then write the marker."""
        for partition in self.all_partitions():
            with partition.lock:
                partition.log.close()
        self.write_recovery_checkpoint()
        atomic_write(self.data_dir / CLEAN_SHUTDOWN_FILE, b"")
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        log.info("logs closed cleanly", data_dir=str(self.data_dir))

    def write_recovery_checkpoint(self) -> None:
        entries = []
        for p in self.all_partitions():
            with p.lock:
                entries.append(f"{p.topic} {p.index} {p.log.recovery_point}")
        text = "\n".join(["0", str(len(entries)), *entries]) + "\n"
        atomic_write(self.data_dir / RECOVERY_CHECKPOINT_FILE, text.encode())

    # -- metadata persistence ----------------------------------------------------------------

    def _read_topic_metadata(self) -> list[dict[str, object]]:
        path = self.data_dir / TOPIC_METADATA_FILE
        if not path.exists():
            return []
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return list(data["topics"])
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{path} is corrupt ({e}); restore it from a backup or move the data dir aside") from e

    def _write_topic_metadata(self) -> None:
        topics = [
            {"name": t.name, "id": str(t.topic_id), "partitions": len(t.partitions), "configs": t.configs,
             "internal": t.internal}
            for t in self.topics.values()
        ]
        payload = json.dumps({"version": 1, "topics": topics}, indent=1).encode()
        atomic_write(self.data_dir / TOPIC_METADATA_FILE, payload)

    def log_config(self, overrides: dict[str, str], *, internal: bool = False) -> LogConfig:
        """The log config of a topic with ``overrides``; an internal topic also gets
        :data:`INTERNAL_TOPIC_CONFIGS`, whatever it was created with."""
        fixed = INTERNAL_TOPIC_CONFIGS if internal else {}
        config = LogConfig.from_topic_config({**self.config.topic_defaults(), **overrides, **fixed})
        return replace(config, record_synced_length=True) if self.record_synced_length else config

    def _open_log(self, topic: str, index: int, config: LogConfig, recovery_point: int, clean: bool) -> Log:
        return Log(self.data_dir / f"{topic}-{index}", config, topic=topic, partition=index,
                   recovery_point=recovery_point, clean_shutdown=clean, now_ms=now_ms,
                   producer_id_expiration_ms=int(self.config["producer.id.expiration.ms"]))

    def _load_topic(self, meta: dict[str, object], recovery_points: dict[tuple[str, int], int]) -> None:
        name = str(meta["name"])
        configs = {str(k): str(v) for k, v in dict(meta.get("configs") or {}).items()}  # type: ignore[call-overload]
        config = self.log_config(configs, internal=bool(meta.get("internal")))
        partitions = []
        for index in range(int(meta["partitions"])):  # type: ignore[call-overload]
            rp = recovery_points.get((name, index), 0)
            partitions.append(Partition(name, index, self._open_log(name, index, config, rp, self.clean_start)))
        self.topics[name] = Topic(name, uuid.UUID(str(meta["id"])), configs, partitions, bool(meta.get("internal")))

    # -- topic operations --------------------------------------------------------------------

    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     configs: dict[str, str | None], *, validate_only: bool = False,
                     internal: bool = False, in_request: int = 0) -> Topic | None:
        """Create a topic (all or nothing, see the class docstring); ``in_request`` is the number of
        partitions the same request created before this topic (``max.partitions.per.request``)."""
        validate_topic_name(name)
        if name in self.topics:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        if num_partitions == -1:
            num_partitions = int(self.config["num.partitions"])
        if num_partitions < 1:
            raise InvalidPartitionsError(f"number of partitions must be at least 1, got {num_partitions}")
        if replication_factor == -1:
            replication_factor = int(self.config["default.replication.factor"])
        if replication_factor != 1:
            raise InvalidReplicationFactorError(
                f"replication factor {replication_factor} is larger than the 1 available broker")
        overrides = validate_topic_configs(configs, TOPIC_CONFIG_KEYS)
        config = self.log_config(overrides, internal=internal)  # raises InvalidConfigurationError on bad values
        if not internal:
            self.check_partition_limits(name, 0, num_partitions, in_request=in_request)
        if validate_only:
            return None
        topic = Topic(name, uuid.uuid4(), overrides, [], internal)
        self._open_new_partitions(topic, num_partitions, config)
        self.topics[name] = topic
        try:
            self._write_topic_metadata()
        except BaseException:
            # Not in the metadata file means gone after a restart: never serve (or ack) it.
            del self.topics[name]
            self._discard_partitions(topic.partitions)
            raise
        log.info("topic created", topic=name, partitions=num_partitions, configs=overrides)
        return topic

    def check_partition_limits(self, name: str, current: int, total: int, *, in_request: int = 0) -> None:
        """Refuse growing ``name`` from ``current`` to ``total`` partitions beyond the broker's
        partition limits or its open-file limit (POLICY_VIOLATION), before any file is opened."""
        new = total - current
        per_topic = int(self.config["max.partitions.per.topic"])
        if total > per_topic:
            raise PolicyViolationError(
                f"topic {name!r} would have {total} partitions; max.partitions.per.topic is {per_topic}")
        per_request = int(self.config["max.partitions.per.request"])
        if in_request + new > per_request:
            raise PolicyViolationError(
                f"this request would create {in_request + new} partitions (topic {name!r}: {new}); "
                f"max.partitions.per.request is {per_request}: send fewer per request")
        held = sum(len(t.partitions) for t in self.topics.values())
        per_broker = int(self.config["max.broker.partitions"])
        if held + new > per_broker:
            raise PolicyViolationError(
                f"the broker holds {held} partitions and {new} more for topic {name!r} would exceed "
                f"max.broker.partitions={per_broker}")
        fds = fd_headroom()
        if fds is None:
            return
        in_use, limit = fds
        needed = new * FDS_PER_NEW_PARTITION
        reserve = max(MIN_FD_RESERVE, limit // 10)
        if in_use + needed + reserve > limit:
            raise PolicyViolationError(
                f"{new} new partitions for topic {name!r} need about {needed} file descriptors; {in_use} of the "
                f"broker's RLIMIT_NOFILE={limit} are in use and {reserve} are kept free: raise the open-file "
                "limit (ulimit -n) or create fewer partitions")

    def _open_new_partitions(self, topic: Topic, total: int, config: LogConfig) -> None:
        """Append partitions ``len(topic.partitions) .. total-1`` to ``topic``; if any fails to
        open, close and remove the ones opened here (and the failed one's directory) first."""
        first = len(topic.partitions)
        try:
            for index in range(first, total):
                topic.partitions.append(self._new_partition(topic.name, index, config))
        except Exception as e:
            failed = len(topic.partitions)
            self._discard_partitions(topic.partitions[first:])
            del topic.partitions[first:]
            shutil.rmtree(self.data_dir / f"{topic.name}-{failed}", ignore_errors=True)
            log.warning("partition creation failed; removed the partitions opened for it", topic=topic.name,
                        failed_partition=failed, removed=failed - first, error=str(e))
            if isinstance(e, OSError):
                raise KafkaStorageError(f"could not create partition {failed} of topic {topic.name!r}: {e}; "
                                        "nothing was created") from e
            raise

    @staticmethod
    def _discard_partitions(partitions: Iterable[Partition]) -> None:
        """Close and delete the logs of partitions no client has seen, whatever each one raises."""
        for partition in partitions:
            try:
                with partition.lock:  # a writer thread's maintenance pass may hold it
                    partition.log.delete()
            except Exception:
                log.exception("removing a partially created partition failed", topic=partition.topic,
                              partition=partition.index, dir=str(partition.log.dir))

    def _new_partition(self, name: str, index: int, config: LogConfig) -> Partition:
        """An empty partition; a leftover directory (a deleted topic of the same name whose removal
        failed or was cut short by a crash) must not leak its records into the new one."""
        shutil.rmtree(self.data_dir / f"{name}-{index}", ignore_errors=True)
        return Partition(name, index, self._open_log(name, index, config, 0, True))

    def ensure_not_internal(self, name: str, action: str) -> None:
        """Refuse a client's ``action`` on an internal topic (INVALID_TOPIC_EXCEPTION, as Kafka
        answers Produce and DeleteRecords on them): ``__consumer_offsets`` and
        ``__transaction_state`` are written by the coordinators alone, and their partition count
        is fixed, because every group's and transactional id's partition is ``hash % count``."""
        topic = self.topics.get(name)
        if topic is not None and topic.internal:
            raise InvalidTopicError(f"cannot {action} internal topic {name!r}: it belongs to the broker")

    def delete_topic(self, name: str) -> None:
        topic = self.get_topic(name)
        self.ensure_not_internal(name, "delete")
        del self.topics[name]
        self._write_topic_metadata()
        for partition in topic.partitions:
            partition.notify()
            with partition.lock:
                partition.log.delete()
        log.info("topic deleted", topic=name)

    def create_partitions(self, name: str, count: int, *, validate_only: bool = False, in_request: int = 0) -> None:
        """Grow ``name`` to ``count`` partitions (all or nothing); ``in_request`` as in ``create_topic``."""
        topic = self.get_topic(name)
        self.ensure_not_internal(name, "change the partition count of")
        current = len(topic.partitions)
        if count <= current:
            raise InvalidPartitionsError(
                f"topic {name!r} has {current} partitions; the new count {count} must be larger")
        self.check_partition_limits(name, current, count, in_request=in_request)
        if validate_only:
            return
        self._open_new_partitions(topic, count, self.log_config(topic.configs))
        try:
            self._write_topic_metadata()
        except BaseException:
            self._discard_partitions(topic.partitions[current:])
            del topic.partitions[current:]
            raise
        log.info("partitions created", topic=name, old=current, new=count)

    def get_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return topic

    def get_partition(self, topic: str, index: int) -> Partition:
        partitions = self.get_topic(topic).partitions
        if not 0 <= index < len(partitions):
            raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {index}")
        return partitions[index]

    def get_or_create_topic(self, name: str) -> Topic:
        """The topic, auto-created with broker defaults when ``auto.create.topics.enable``."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        if not self.config["auto.create.topics.enable"]:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r} (auto.create.topics.enable=false)")
        created = self.create_topic(name, -1, -1, {})
        assert created is not None
        return created

    def all_partitions(self) -> Iterator[Partition]:
        """Every partition, iterating copies: maintenance runs on writer threads while the event
        loop may create or delete topics."""
        for topic in list(self.topics.values()):
            yield from list(topic.partitions)

    def effective_configs(self, name: str) -> tuple[dict[str, str], set[str]]:
        """(config values, names that were set explicitly on the topic)."""
        topic = self.get_topic(name)
        return self.log_config(topic.configs).to_topic_config(), set(topic.configs)

    # -- background maintenance --------------------------------------------------------------

    def flush_due(self, now: int) -> int:
        """``flush.ms``: fsync logs whose oldest unflushed write is older than their interval."""
        flushed = 0
        for partition in self.all_partitions():
            with partition.lock:
                plog = partition.log
                if plog.unflushed_messages() and now - plog.last_flush_ms >= plog.config.flush_interval_ms:
                    plog.flush()
                    flushed += 1
        return flushed

    def enforce_retention(self) -> int:
        deleted = 0
        for partition in self.all_partitions():
            with partition.lock:
                partition.log.maybe_roll_by_time()
                deleted += partition.log.enforce_retention()
        return deleted

    def expire_producers(self) -> None:
        for partition in self.all_partitions():
            with partition.lock:
                partition.log.expire_producers()


def partitions_of(manager: ReplicaManager, names: Iterable[str]) -> list[Partition]:
    out: list[Partition] = []
    for name in names:
        out.extend(manager.get_topic(name).partitions)
    return out


__all__ = ["BrokerError", "Partition", "ReplicaManager", "Topic", "now_ms", "partitions_of",
           "validate_topic_name"]
