"""Kafka's offset checkpoint files (``OffsetCheckpointFile``, format from server-common's
``CheckpointFile``): ``recovery-point-offset-checkpoint`` (where each log's recovery starts,
ads_broker/log/manager.py) and ``replication-offset-checkpoint`` (each replica's high watermark,
ads_broker/replication/replica_manager.py).

Text: a version line (``0``), a count line, then one ``topic partition offset`` line per partition,
each ending in a newline. Written to a temporary file, fsynced, renamed over the old one, and the
directory fsynced (:func:`~ads_broker.log.fileutil.atomic_write`): a crash leaves the old file or the
new one. A missing file is empty; anything else that does not parse is refused with
:class:`OffsetCheckpointError` naming the file and the line, and each caller says what losing it
costs (both files are hints that can be rebuilt: a longer recovery, a high watermark learned again).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ads_broker.exceptions import KafkaStorageError
from ads_broker.log.fileutil import atomic_write

__all__ = ["OffsetCheckpointError", "format_offset_checkpoint", "read_offset_checkpoint", "write_offset_checkpoint"]

CURRENT_VERSION = 0


class OffsetCheckpointError(KafkaStorageError):
    """An offset checkpoint file is torn or malformed."""


def format_offset_checkpoint(entries: Iterable[tuple[str, int, int]]) -> bytes:
    listed = [f"{topic} {partition} {offset}" for topic, partition, offset in entries]
    return ("\n".join([str(CURRENT_VERSION), str(len(listed)), *listed]) + "\n").encode()


def write_offset_checkpoint(path: Path, entries: Iterable[tuple[str, int, int]]) -> None:
    """Replace ``path`` with ``(topic, partition, offset)`` entries, atomically and durably."""
    atomic_write(path, format_offset_checkpoint(entries))


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """``(topic, partition) -> offset``; {} for a missing file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise OffsetCheckpointError(f"checkpoint {path} is not text: {e}") from e
    if not text.endswith("\n"):
        raise OffsetCheckpointError(f"checkpoint {path} ends in the middle of a line (a torn write)")
    lines = text[:-1].split("\n")
    if len(lines) < 2:
        raise OffsetCheckpointError(f"checkpoint {path} has no count line")
    version, count = _int(lines[0], path, 1), _int(lines[1], path, 2)
    if version != CURRENT_VERSION:
        raise OffsetCheckpointError(f"checkpoint {path}: unrecognised version {version}, expected {CURRENT_VERSION}")
    if count != len(lines) - 2:
        raise OffsetCheckpointError(f"checkpoint {path} announces {count} entries and holds {len(lines) - 2}")
    out: dict[tuple[str, int], int] = {}
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split(" ")
        if len(fields) != 3 or not fields[0]:
            raise OffsetCheckpointError(
                f"checkpoint {path} line {number}: {line[:200]!r} is not 'topic partition offset'")
        out[(fields[0], _int(fields[1], path, number))] = _int(fields[2], path, number)
    return out


def _int(text: str, path: Path, line: int) -> int:
    try:
        return int(text)
    except ValueError:
        raise OffsetCheckpointError(f"checkpoint {path} line {line}: {text[:200]!r} is not a number") from None
