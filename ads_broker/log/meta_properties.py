"""``<data-dir>/meta.properties``: which cluster and broker id a data dir belongs to (Kafka's
``MetaProperties``, version 0 as Kafka in ZooKeeper mode writes it: ``version``, ``broker.id``,
``cluster.id``).

A cluster broker writes it once it has registered (a data dir without one is adopted: written with
the broker's settings then) and compares it with its settings and its ZooKeeper at every start, so a
data dir is never served, or its topics compared with ZooKeeper's, under another cluster or broker id.
Single-node mode does not write it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ads_broker.config import parse_properties
from ads_broker.exceptions import ConfigError
from ads_broker.log.fileutil import atomic_write

META_PROPERTIES_FILE = "meta.properties"
INCARNATION_KEY = "zookeeper.cluster.id.czxid"


class MetaPropertiesError(ValueError):
    """``meta.properties`` exists but cannot be read as one (the message names the file and the field)."""


@dataclass(frozen=True)
class MetaProperties:
    """The identity of a data dir: the cluster and the broker whose logs it holds."""

    cluster_id: str
    broker_id: int
    version: int = 0
    #: The creation zxid of the cluster's ``/cluster/id`` znode (ours, not Kafka's: Kafka's cluster
    #: id is random, ours is the ``cluster.id`` setting, which clusters left at its default share).
    #: Tells two ZooKeepers (or chroots) with the same id apart; a ZooKeeper restored from a backup
    #: keeps it. None in a file written before it existed (added at the next start).
    incarnation: int | None = None

    def to_text(self) -> str:
        extra = "" if self.incarnation is None else f"{INCARNATION_KEY}={self.incarnation}\n"
        return (f"#\n# written by ads-broker: this data dir belongs to this cluster and broker\n"
                f"version={self.version}\nbroker.id={self.broker_id}\ncluster.id={self.cluster_id}\n{extra}")


def _parse(text: str, path: Path) -> dict[str, str]:
    """The file's ``key=value`` lines, read as the broker's own properties files are."""
    try:
        return parse_properties(text, str(path))
    except ConfigError as e:
        raise MetaPropertiesError(str(e)) from None


def read_meta_properties(data_dir: Path) -> MetaProperties | None:
    """The data dir's identity, or None if it has no ``meta.properties`` (a new or older data dir)."""
    path = data_dir / META_PROPERTIES_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as e:
        raise MetaPropertiesError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    values = _parse(text, path)
    version = values.get("version")
    if version != "0":
        raise MetaPropertiesError(f"{path}: unsupported version {version!r} (expected 0)")
    try:
        broker_id = int(values["broker.id"])
        cluster_id = values["cluster.id"]
    except KeyError as e:
        raise MetaPropertiesError(f"{path}: missing {e.args[0]}") from None
    except ValueError:
        raise MetaPropertiesError(f"{path}: broker.id {values['broker.id']!r} is not an integer") from None
    if not cluster_id:
        raise MetaPropertiesError(f"{path}: cluster.id is empty")
    incarnation = values.get(INCARNATION_KEY)
    if incarnation is not None and not incarnation.isdigit():
        raise MetaPropertiesError(f"{path}: {INCARNATION_KEY} {incarnation!r} is not a zxid")
    return MetaProperties(cluster_id, broker_id, incarnation=None if incarnation is None else int(incarnation))


def write_meta_properties(data_dir: Path, meta: MetaProperties) -> None:
    """Write ``meta.properties`` atomically (fsynced; a crash leaves the old file or the new one)."""
    atomic_write(data_dir / META_PROPERTIES_FILE, meta.to_text().encode())
