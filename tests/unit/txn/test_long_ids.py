"""Transactional ids the coordinator cannot store are refused before anything is written (fuzz
finding F2, docs/FUZZING.md): ``__transaction_state`` keys carry the id with an int16 length.

The wire decoder already refuses strings over 32,767 bytes (Kafka's readers do), so these ids only
reach the coordinator from code; the check keeps a long id an error code, never a ``struct.error``.
"""

from __future__ import annotations

from pathlib import Path

from ads_broker.coordinator.transaction import MAX_ID_BYTES, TxnState
from tests.unit.log.helpers import Clock
from tests.unit.txn.test_coordinator import TOPIC, start

INVALID_REQUEST = 42


def test_ids_longer_than_an_int16_string_are_invalid_requests(tmp_path: Path) -> None:
    node = start(tmp_path / "data", Clock())
    try:
        for too_long in ("x" * (MAX_ID_BYTES + 1), "\u00e9" * (MAX_ID_BYTES // 2 + 1)):
            assert node.coord.init_producer_id(too_long, 10_000)[0] == INVALID_REQUEST
            assert node.coord.add_partitions(too_long, 0, 0, [(TOPIC, 0)]) == {(TOPIC, 0): INVALID_REQUEST}
            assert node.coord.end_txn(too_long, 0, 0, commit=True) == INVALID_REQUEST
            assert too_long not in node.coord.txns
        longest = "y" * MAX_ID_BYTES
        error, _pid, epoch = node.coord.init_producer_id(longest, 10_000)
        assert (error, epoch) == (0, 0) and node.coord.txns[longest].state is TxnState.EMPTY
    finally:
        node.replicas.close()
