"""Stray directory names (``<topic>-<partition>.<uuid>-stray``) stay within the file system's 255
bytes for every legal topic name (up to 249 characters), as Kafka's
``logDirNameWithSuffixCappedLength``: a 249-character topic made the rename at start fail ("File
name too long", review s12-2, H1), and the broker then served topics it had not compared with
ZooKeeper."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ads_broker.log.manager import MAX_DIR_NAME_LENGTH, stray_dir_name


@pytest.mark.parametrize("length", [1, 200, 214, 215, 249])
def test_a_stray_name_fits_and_a_directory_can_be_renamed_to_it(tmp_path: Path, length: int) -> None:
    topic = "t" * length
    name = stray_dir_name(topic, 12345)
    assert len(name.encode()) <= MAX_DIR_NAME_LENGTH
    assert re.fullmatch(r"t+-12345\.[0-9a-f]{32}-stray", name)
    assert topic.startswith(name.split("-12345.")[0])
    source = tmp_path / f"{topic}-12345"
    source.mkdir()
    source.rename(tmp_path / name)  # old code: OSError "File name too long" from 215 characters on
    assert (tmp_path / name).is_dir()
