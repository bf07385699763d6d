"""Kafka's offset checkpoint files (ads_broker/log/checkpoint.py): the round trip, and every torn or
malformed file refused with the file and the line named."""

from __future__ import annotations

from pathlib import Path

import pytest

from ads_broker.log.checkpoint import OffsetCheckpointError, read_offset_checkpoint, write_offset_checkpoint
from ads_broker.log.manager import read_recovery_checkpoint


def test_round_trip_in_kafkas_text(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    write_offset_checkpoint(path, [("events", 0, 300), ("events.deduped", 11, 0), ("__consumer_offsets", 7, 42)])
    assert path.read_text() == "0\n3\nevents 0 300\nevents.deduped 11 0\n__consumer_offsets 7 42\n"
    assert read_offset_checkpoint(path) == {("events", 0): 300, ("events.deduped", 11): 0,
                                            ("__consumer_offsets", 7): 42}
    write_offset_checkpoint(path, [])
    assert read_offset_checkpoint(path) == {}
    assert read_offset_checkpoint(tmp_path / "missing") == {}


@pytest.mark.parametrize(("content", "why"), [
    (b"0\n1\nevents 0 300", "torn write"),
    (b"0\n2\nevents 0 300\n", "announces 2 entries and holds 1"),
    (b"1\n0\n", "unrecognised version 1"),
    (b"0\n1\nevents 0\n", "line 3: 'events 0' is not 'topic partition offset'"),
    (b"0\n1\nevents x 3\n", "line 3: 'x' is not a number"),
    (b"0\n", "no count line"),
    (b"\xff\xfe\n", "not text"),
])
def test_a_bad_file_is_refused_naming_the_file_and_the_line(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "cp"
    path.write_bytes(content)
    with pytest.raises(OffsetCheckpointError, match=why) as raised:
        read_offset_checkpoint(path)
    assert str(path) in str(raised.value)


def test_an_unreadable_recovery_checkpoint_means_recovering_everything(tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(b"0\n5\nevents 0 3\n")
    assert read_recovery_checkpoint(path) == {}
