"""A damaged ``.txnindex`` is rebuilt from the log, not read up to the damage (review s13, M2).

After a clean shutdown the aborted-transaction entries are read from the files (the producer
state comes from the snapshot at the log end: nothing is replayed). A garbled, torn or
out-of-range file used to be read up to its first bad entry and rewritten without the rest: a
``read_committed`` consumer then got the aborted records (duplicates in an exactly-once output).
Now the file is deleted and its entries re-derived by replaying from a snapshot before it.
Real files under tmp_path; the damage is written into them as a disk or an operator would.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ads_broker.log.records import Record, build_batch
from ads_broker.log.txn_index import ENTRY_SIZE, TXN_INDEX_SUFFIX

from .helpers import Clock, open_log


def _history(dir: Path) -> list[tuple[int, int, int, int]]:
    """Two segments, each with an aborted and a committed transaction of producer 7; closed
    cleanly (snapshot at the log end). Returns the aborted transactions as the log reports them."""
    clock = Clock()
    log = open_log(dir, clock=clock)
    seq = 0
    for segment in range(2):
        for commit in (False, True):
            log.append_as_leader(build_batch(
                [Record(-1, clock.now, b"k%d" % i, b"%s-%d" % (b"committed" if commit else b"aborted", segment))
                 for i in range(3)], producer_id=7, producer_epoch=0, base_sequence=seq, is_transactional=True), 0)
            seq += 3
            log.append_end_txn_marker(7, 0, commit, 0, 0)
        if segment == 0:
            log.roll()
    aborted = [(a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset)
               for a in log.collect_aborted_txns(0, log.log_end_offset)]
    log.close()
    return aborted


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "garbled":
        path.write_bytes(os.urandom(len(data)))
    elif how == "torn":
        path.write_bytes(data[: ENTRY_SIZE // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "out-of-range":  # a well-formed entry whose marker is far beyond the segment
        path.write_bytes(data[:2] + (7).to_bytes(8, "big") + (0).to_bytes(8, "big") + (10**9).to_bytes(8, "big")
                         + (10**9).to_bytes(8, "big"))


@pytest.mark.parametrize("how", ["garbled", "torn", "empty", "out-of-range"])
@pytest.mark.parametrize("segment", [0, 1])
def test_a_damaged_txn_index_is_rebuilt_from_the_log(tmp_path: Path, how: str, segment: int) -> None:
    aborted = _history(tmp_path)
    assert len(aborted) == 2
    files = sorted(tmp_path.glob(f"*{TXN_INDEX_SUFFIX}"))
    assert len(files) == 2
    _damage(files[segment], how)

    log = open_log(tmp_path)  # a clean start: no recovery of its own
    try:
        found = [(a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset)
                 for a in log.collect_aborted_txns(0, log.log_end_offset)]
        assert found == aborted  # old code: the damaged segment's entry was gone (or a bogus one kept)
    finally:
        log.close()
    reopened = open_log(tmp_path)  # the rebuilt file is sound on the next start
    try:
        assert len(reopened.collect_aborted_txns(0, reopened.log_end_offset)) == 2
    finally:
        reopened.close()
