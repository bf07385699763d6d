"""The persisted producer-id block end survives restarts and refuses damage (review s13, L1).

A garbled file ended the broker's start with a raw UnicodeDecodeError, and a truncated one ("2000"
cut to "20") was accepted: the broker then handed out producer ids idempotent producers already
had, and their sequence numbers would collide. Real files under tmp_path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ads_broker.exceptions import ConfigError
from ads_broker.producer_ids import BLOCK_SIZE, FILE_NAME, ProducerIdManager


def test_ids_continue_after_the_persisted_block_across_restarts(tmp_path: Path) -> None:
    first = ProducerIdManager(tmp_path)
    assert [first.generate() for _ in range(3)] == [0, 1, 2]
    assert (tmp_path / FILE_NAME).read_bytes() == b"block.end=%d\n" % BLOCK_SIZE
    assert ProducerIdManager(tmp_path).generate() == BLOCK_SIZE


def test_a_file_from_before_the_terminator_is_read_as_it_is(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(b"2000")
    assert ProducerIdManager(tmp_path).generate() == 2000


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"block.end=20", b"block.end=2000", b"block.end=\n",
                                     b"", b"-5", b"block.end=12x\n"])
def test_a_damaged_or_truncated_file_refuses_the_start_with_what_to_do(tmp_path: Path, content: bytes) -> None:
    (tmp_path / FILE_NAME).write_bytes(content)
    with pytest.raises(ConfigError, match="not a whole producer id block end"):
        ProducerIdManager(tmp_path)
