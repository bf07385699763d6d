"""``meta.properties`` (Kafka's version 0): written atomically, read back, and refused with the
file and the field named when it cannot be one."""

from __future__ import annotations

from pathlib import Path

import pytest

from ads_broker.log.meta_properties import (
    META_PROPERTIES_FILE,
    MetaProperties,
    MetaPropertiesError,
    read_meta_properties,
    write_meta_properties,
)


def test_round_trip_in_kafkas_layout(tmp_path: Path) -> None:
    assert read_meta_properties(tmp_path) is None
    write_meta_properties(tmp_path, MetaProperties("c-1", 3))
    text = (tmp_path / META_PROPERTIES_FILE).read_text()
    assert "version=0\n" in text and "broker.id=3\n" in text and "cluster.id=c-1\n" in text
    assert read_meta_properties(tmp_path) == MetaProperties("c-1", 3)


def test_a_file_written_by_kafka_is_read(tmp_path: Path) -> None:
    (tmp_path / META_PROPERTIES_FILE).write_text(
        "#\n#Thu Nov 27 10:00:00 UTC 2026\nbroker.id=7\nversion=0\ncluster.id=Ab-cd_ef\n")
    assert read_meta_properties(tmp_path) == MetaProperties("Ab-cd_ef", 7)


@pytest.mark.parametrize(("text", "message"), [
    ("version=1\nbroker.id=1\ncluster.id=c\n", "unsupported version '1'"),
    ("version=0\ncluster.id=c\n", "missing broker.id"),
    ("version=0\nbroker.id=1\n", "missing cluster.id"),
    ("version=0\nbroker.id=one\ncluster.id=c\n", "broker.id 'one' is not an integer"),
    ("version=0\nbroker.id=1\ncluster.id=\n", "cluster.id is empty"),
    ("version=0\nbroker.id 1\n", r"meta.properties:2: expected key=value"),
])
def test_a_damaged_file_is_refused_naming_the_field(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / META_PROPERTIES_FILE).write_text(text)
    with pytest.raises(MetaPropertiesError, match=message) as e:
        read_meta_properties(tmp_path)
    assert str(tmp_path / META_PROPERTIES_FILE) in str(e.value)


def test_a_file_that_is_not_utf8_is_refused_with_its_name(tmp_path: Path) -> None:
    (tmp_path / META_PROPERTIES_FILE).write_bytes(b"version=0\nbroker.id=1\ncluster.id=\xff\xfe\n")
    with pytest.raises(MetaPropertiesError, match="not UTF-8"):
        read_meta_properties(tmp_path)
