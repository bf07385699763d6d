"""The partition logs of one data dir (Kafka's ``LogManager``).

Invariants this class keeps:

- One process owns a data dir at a time (``flock`` on ``<data-dir>/.lock``).
- On a clean shutdown every log is flushed and closed, the recovery points are checkpointed
  (``recovery-point-offset-checkpoint``, Kafka's text format) and the clean-shutdown marker
  ``.kafka_cleanshutdown`` is written last. On start the marker is consumed only after every log
  was loaded: without it every log is recovered from its recovery point (batches validated, torn
  tail truncated, indexes and producer state rebuilt).
- Every access to a partition's log from the maintenance jobs (flush, retention, producer expiry,
  checkpoint, the cleaner) holds that partition's lock, as the append and read paths do.

Which partitions exist is not decided here: the replica manager names them (``partitions``, the
same view the cleaner gets) and asks for their logs to be opened, created or deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import resource
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import structlog

from ads_broker.config import BrokerConfig
from ads_broker.exceptions import ConfigError
from ads_broker.log.checkpoint import OffsetCheckpointError, read_offset_checkpoint, write_offset_checkpoint
from ads_broker.log.cleaner import CleanablePartition, LogCleaner
from ads_broker.log.config import LogConfig
from ads_broker.log.fileutil import atomic_write, fsync_dir
from ads_broker.log.log import Log
from ads_broker.log.segment import READ_HANDLES

log = structlog.get_logger("ads_broker.log_manager")

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
#: Suffix of a quarantined partition directory (Kafka's ``LogFileUtils.STRAY_DIR_SUFFIX``).
STRAY_DIR_SUFFIX = "-stray"

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


#: The longest file name the data dir's file system takes (ext4, xfs: 255 bytes).
MAX_DIR_NAME_LENGTH = 255


def stray_dir_name(topic: str, index: int) -> str:
    """Kafka's ``UnifiedLog.logStrayDirName``: ``<topic>-<partition>.<uuid without dashes>-stray``,
    the topic cut short as Kafka's ``logDirNameWithSuffixCappedLength`` does so the name stays
    within 255 bytes (a 249-character topic name made the rename fail: "File name too long")."""
    suffix = f"-{index}.{uuid.uuid4().hex}{STRAY_DIR_SUFFIX}"
    return topic[:max(MAX_DIR_NAME_LENGTH - len(suffix), 0)] + suffix


def is_stray_dir_of(name: str, topic: str, index: int) -> bool:
    """Whether the directory ``name`` is a stray name :func:`stray_dir_name` gives ``topic-index``."""
    suffix_length = len(f"-{index}.") + 32 + len(STRAY_DIR_SUFFIX)
    prefix = re.escape(topic[:max(MAX_DIR_NAME_LENGTH - suffix_length, 0)])
    return re.fullmatch(rf"{prefix}-{index}\.[0-9a-f]{{32}}{re.escape(STRAY_DIR_SUFFIX)}", name) is not None


def now_ms() -> int:
    return int(time.time() * 1000)


def read_recovery_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Each log's recovery point; {} (recover every log from its start) if the file is unreadable."""
    try:
        return read_offset_checkpoint(path)
    except OffsetCheckpointError as e:
        # Losing the checkpoint only costs a longer recovery: recover everything from offset 0.
        log.warning("recovery checkpoint unreadable, recovering all logs from the start", path=str(path), error=str(e))
        return {}


class LogManager:
    """Opens, creates, deletes and maintains the logs of one data dir (see the module docstring)."""

    def __init__(self, data_dir: Path, config: BrokerConfig, partitions: Callable[[], list[CleanablePartition]],
                 *, record_synced_length: bool = False) -> None:
        self.data_dir = data_dir
        self.config = config
        #: Every partition with a log, from a copy of the broker's table (maintenance runs on
        #: writer threads while the event loop may create or delete topics); also the cleaner's view.
        self.partitions = partitions
        self.record_synced_length = record_synced_length  # the fault hook's .log.synced files (faults.py)
        READ_HANDLES.max_open = config.settings.log_open_segment_files_max
        settings = config.settings
        #: Compaction of the logs with ``cleanup.policy=compact`` (a thread, started by :meth:`start_cleaner`).
        self.cleaner = LogCleaner(partitions, buffer_bytes=settings.log_cleaner_dedupe_buffer_size,
                                  io_buffer_bytes=settings.log_cleaner_io_buffer_size,
                                  io_max_bytes_per_second=settings.log_cleaner_io_max_bytes_per_second,
                                  backoff_ms=settings.log_cleaner_backoff_ms)
        self._lock_fd: int | None = None
        self.clean_start = False
        self._recovery_points: dict[tuple[str, int], int] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def start_loading(self) -> None:
        """Take the data dir and read what the last shutdown left: the marker and the checkpoint."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        self.clean_start = (self.data_dir / CLEAN_SHUTDOWN_FILE).exists()
        self._recovery_points = read_recovery_checkpoint(self.data_dir / RECOVERY_CHECKPOINT_FILE)

    def finish_loading(self) -> None:
        """Consume the marker, only after every log loaded: a crash during loading must recover
        again. The unlink is fsynced: a marker that a power cut brought back would skip the next
        recovery."""
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / CLEAN_SHUTDOWN_FILE).unlink()
            fsync_dir(self.data_dir)

    def start_cleaner(self) -> None:
        """Start the cleaner thread, unless ``log.cleaner.enable=false``."""
        if self.config.settings.log_cleaner_enable:
            self.cleaner.start()

    def stop_cleaner(self) -> None:
        """Stop the cleaner thread (blocks until its pass ends: call it off the event loop)."""
        self.cleaner.stop()

    def _lock_data_dir(self) -> None:
        fd = os.open(self.data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"data dir {self.data_dir} is in use by another ads-broker process "
                              "(stop it first, or pick another --data-dir)") from None
        self._lock_fd = fd

    def shutdown(self) -> None:
        """Clean shutdown: flush and close every log, checkpoint, then write the marker."""
        for partition in self.partitions():
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
        for p in self.partitions():
            with p.lock:
                entries.append((p.topic, p.index, p.log.recovery_point))
        write_offset_checkpoint(self.data_dir / RECOVERY_CHECKPOINT_FILE, entries)

    # -- logs --------------------------------------------------------------------------------

    def log_config(self, overrides: dict[str, str], *, internal: bool = False) -> LogConfig:
        """The log config of a topic with ``overrides``; an internal topic also gets
        :data:`INTERNAL_TOPIC_CONFIGS`, whatever it was created with."""
        fixed = INTERNAL_TOPIC_CONFIGS if internal else {}
        config = LogConfig.from_topic_config({**self.config.topic_defaults(), **overrides, **fixed})
        return replace(config, record_synced_length=True) if self.record_synced_length else config

    def load_log(self, topic: str, index: int, config: LogConfig) -> Log:
        """Open an existing partition's log, recovering it unless the last shutdown was clean."""
        recovery_point = self._recovery_points.get((topic, index), 0)
        return self._open_log(topic, index, config, recovery_point, self.clean_start)

    def create_log(self, topic: str, index: int, config: LogConfig) -> Log:
        """An empty log; a leftover directory (a deleted topic of the same name whose removal
        failed or was cut short by a crash) must not leak its records into the new one."""
        shutil.rmtree(self.log_dir(topic, index), ignore_errors=True)
        return self._open_log(topic, index, config, 0, True)

    @staticmethod
    def delete_log(partition: CleanablePartition) -> None:
        """Close the partition's log and remove its directory."""
        with partition.lock:  # a writer thread's maintenance pass may hold it
            partition.log.delete()

    def quarantine_log(self, partition: CleanablePartition) -> Path:
        """Close the partition's log and rename its directory to Kafka's stray name
        (``<topic>-<partition>.<uuid>-stray``): kept whole, never loaded or deleted by the broker,
        for an operator to inspect, restore or remove. The new name is returned."""
        target = self.data_dir / stray_dir_name(partition.topic, partition.index)
        with partition.lock:  # a writer thread's maintenance pass may hold it
            partition.log.close()
            os.rename(self.log_dir(partition.topic, partition.index), target)
        fsync_dir(self.data_dir)
        return target

    def log_dir(self, topic: str, index: int) -> Path:
        return self.data_dir / f"{topic}-{index}"

    def _open_log(self, topic: str, index: int, config: LogConfig, recovery_point: int, clean: bool) -> Log:
        return Log(self.log_dir(topic, index), config, topic=topic, partition=index,
                   recovery_point=recovery_point, clean_shutdown=clean, now_ms=now_ms,
                   producer_id_expiration_ms=self.config.settings.producer_id_expiration_ms)

    # -- background maintenance --------------------------------------------------------------

    def flush_due(self, now: int) -> int:
        """``flush.ms``: fsync logs whose oldest unflushed write is older than their interval."""
        flushed = 0
        for partition in self.partitions():
            with partition.lock:
                plog = partition.log
                if plog.unflushed_messages() and now - plog.last_flush_ms >= plog.config.flush_interval_ms:
                    plog.flush()
                    flushed += 1
        return flushed

    def enforce_retention(self) -> int:
        deleted = 0
        for partition in self.partitions():
            with partition.lock:
                partition.log.maybe_roll_by_time()
                deleted += partition.log.enforce_retention()
        return deleted

    def expire_producers(self) -> None:
        for partition in self.partitions():
            with partition.lock:
                partition.log.expire_producers()
