"""Topic metadata and its store, ``<data-dir>/topic-metadata.json``.

Invariant: a topic change is written to the store atomically (temp file, fsync, rename, fsync of
the directory) *before* it is visible to clients, so a crash never leaves a topic that clients
saw but the broker forgets.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ads_broker.exceptions import ConfigError, InvalidTopicError
from ads_broker.log.fileutil import atomic_write

TOPIC_METADATA_FILE = "topic-metadata.json"
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


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
class Topic:
    """A topic's metadata (its partitions themselves are the replica manager's)."""

    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]  # explicit overrides; defaults come from the broker config
    num_partitions: int
    internal: bool = False


class TopicStore:
    """Reads and atomically rewrites ``topic-metadata.json`` (format version 1)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / TOPIC_METADATA_FILE

    def read(self) -> list[Topic]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            entries = list(data["topics"])
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{self.path} is corrupt ({e}); restore it from a backup or move the data dir aside"
                              ) from e
        return [self._decode(meta) for meta in entries]

    @staticmethod
    def _decode(meta: dict[str, object]) -> Topic:
        configs = {str(k): str(v) for k, v in dict(meta.get("configs") or {}).items()}  # type: ignore[call-overload]
        return Topic(str(meta["name"]), uuid.UUID(str(meta["id"])), configs,
                     int(meta["partitions"]), bool(meta.get("internal")))  # type: ignore[call-overload]

    def write(self, topics: Iterable[Topic]) -> None:
        entries = [
            {"name": t.name, "id": str(t.topic_id), "partitions": t.num_partitions, "configs": t.configs,
             "internal": t.internal}
            for t in topics
        ]
        atomic_write(self.path, json.dumps({"version": 1, "topics": entries}, indent=1).encode())
