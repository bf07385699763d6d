"""The partitions this broker holds, and the topic operations that create and remove them.

Invariants this class keeps:

- Topic metadata is written to the topic store (:mod:`ads_broker.cluster.topics`) *before* a
  change is visible in the metadata cache, so a crash never leaves a topic that clients saw but the
  broker forgets.
- Creating a topic or partitions is all or nothing: if opening any new log fails (EMFILE, ENOSPC,
  ...) every log opened for it is closed and its directory removed before the error is answered
  (KAFKA_STORAGE_ERROR), so a failed request leaks no file descriptor and leaves no directory.
  Requests that would exceed ``max.partitions.per.topic``, ``max.partitions.per.request``,
  ``max.broker.partitions`` or the process's open-file limit are refused before any file is
  opened (POLICY_VIOLATION). Internal topics, created by the broker from its own settings, are
  exempt.
- The logs themselves (data dir lock, recovery, checkpoints, retention) belong to the
  :class:`~ads_broker.log.manager.LogManager`.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import structlog

from ads_broker.cluster.metadata_cache import MetadataCache
from ads_broker.cluster.topics import StoredTopic, Topic, TopicStore, validate_topic_name
from ads_broker.config import BrokerConfig, validate_topic_configs
from ads_broker.exceptions import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    KafkaStorageError,
    PolicyViolationError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from ads_broker.log.cleaner import CleanablePartition
from ads_broker.log.config import TOPIC_CONFIG_KEYS, LogConfig
from ads_broker.log.manager import FDS_PER_NEW_PARTITION, MIN_FD_RESERVE, LogManager, fd_headroom
from ads_broker.replication.partition import Partition

log = structlog.get_logger("ads_broker.replica_manager")


class ReplicaManager:
    """Owns every partition of this broker; topic metadata lives in :attr:`metadata` and
    :attr:`topic_store`, logs in :attr:`logs`."""

    def __init__(self, data_dir: Path, config: BrokerConfig, *, record_synced_length: bool = False) -> None:
        self.data_dir = data_dir
        self.config = config
        self.metadata = MetadataCache()
        self.topic_store = TopicStore(data_dir)
        self.logs = LogManager(data_dir, config, self.partitions_snapshot, record_synced_length=record_synced_length)

    @property
    def topics(self) -> dict[str, Topic]:
        return self.metadata.topics

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        self.logs.start_loading()
        started = time.monotonic()
        for stored in self.topic_store.read():
            self._load_topic(stored)
        self.logs.finish_loading()
        log.info("logs loaded", topics=len(self.topics), clean_shutdown=self.logs.clean_start,
                 seconds=round(time.monotonic() - started, 3), data_dir=str(self.data_dir))

    def close(self) -> None:
        self.logs.shutdown()

    def _load_topic(self, stored: StoredTopic) -> None:
        config = self.logs.log_config(stored.configs, internal=stored.internal)
        partitions = [Partition(stored.name, index, self.logs.load_log(stored.name, index, config))
                      for index in range(stored.num_partitions)]
        self.metadata.add(Topic(stored.name, stored.topic_id, stored.configs, partitions, stored.internal))

    def _write_topic_metadata(self) -> None:
        self.topic_store.write(self.metadata.all_topics())

    # -- topic operations --------------------------------------------------------------------

    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     configs: dict[str, str | None], *, validate_only: bool = False,
                     internal: bool = False, in_request: int = 0) -> Topic | None:
        """Create a topic (all or nothing, see the module docstring); ``in_request`` is the number
        of partitions the same request created before this topic (``max.partitions.per.request``)."""
        validate_topic_name(name)
        if name in self.metadata:
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
        config = self.logs.log_config(overrides, internal=internal)  # raises InvalidConfigurationError on bad values
        if not internal:
            self.check_partition_limits(name, 0, num_partitions, in_request=in_request)
        if validate_only:
            return None
        topic = Topic(name, uuid.uuid4(), overrides, [], internal)
        self._open_new_partitions(topic, num_partitions, config)
        self.metadata.add(topic)
        try:
            self._write_topic_metadata()
        except BaseException:
            # Not in the metadata file means gone after a restart: never serve (or ack) it.
            self.metadata.remove(name)
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
        held = self.metadata.partition_count()
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
                topic.partitions.append(Partition(topic.name, index, self.logs.create_log(topic.name, index, config)))
        except Exception as e:
            failed = len(topic.partitions)
            self._discard_partitions(topic.partitions[first:])
            del topic.partitions[first:]
            shutil.rmtree(self.logs.log_dir(topic.name, failed), ignore_errors=True)
            log.warning("partition creation failed; removed the partitions opened for it", topic=topic.name,
                        failed_partition=failed, removed=failed - first, error=str(e))
            if isinstance(e, OSError):
                raise KafkaStorageError(f"could not create partition {failed} of topic {topic.name!r}: {e}; "
                                        "nothing was created") from e
            raise

    def _discard_partitions(self, partitions: Iterable[Partition]) -> None:
        """Close and delete the logs of partitions no client has seen, whatever each one raises."""
        for partition in partitions:
            try:
                self.logs.delete_log(partition)
            except Exception:
                log.exception("removing a partially created partition failed", topic=partition.topic,
                              partition=partition.index, dir=str(partition.log.dir))

    def ensure_not_internal(self, name: str, action: str) -> None:
        self.metadata.ensure_not_internal(name, action)

    def delete_topic(self, name: str) -> None:
        topic = self.get_topic(name)
        self.ensure_not_internal(name, "delete")
        self.metadata.remove(name)
        self._write_topic_metadata()
        for partition in topic.partitions:
            partition.notify()
            self.logs.delete_log(partition)
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
        self._open_new_partitions(topic, count, self.logs.log_config(topic.configs))
        try:
            self._write_topic_metadata()
        except BaseException:
            self._discard_partitions(topic.partitions[current:])
            del topic.partitions[current:]
            raise
        log.info("partitions created", topic=name, old=current, new=count)

    def get_topic(self, name: str) -> Topic:
        return self.metadata.get_topic(name)

    def get_partition(self, topic: str, index: int) -> Partition:
        partitions = self.get_topic(topic).partitions
        if not 0 <= index < len(partitions):
            raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {index}")
        return partitions[index]

    def get_or_create_topic(self, name: str) -> Topic:
        """The topic, auto-created with broker defaults when ``auto.create.topics.enable``."""
        topic = self.metadata.get(name)
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
        for topic in self.metadata.all_topics():
            yield from list(topic.partitions)

    def partitions_snapshot(self) -> list[CleanablePartition]:
        """Every partition, as a list (the log manager's and the cleaner's view)."""
        return list(self.all_partitions())

    def effective_configs(self, name: str) -> tuple[dict[str, str], set[str]]:
        """(config values, names that were set explicitly on the topic)."""
        topic = self.get_topic(name)
        return self.logs.log_config(topic.configs).to_topic_config(), set(topic.configs)
