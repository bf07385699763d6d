"""The loaders of ``__consumer_offsets`` and ``__transaction_state`` never refuse to start.

Hypothesis writes arbitrary keys and values (and mutations of valid ones) into both internal
topics of a real ReplicaManager after a valid commit; loading must not raise, and must still
return that commit unless a junk record carried its key.
"""

from __future__ import annotations

import struct
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ads_broker.config import BrokerConfig
from ads_broker.coordinator import offsets as om
from ads_broker.coordinator import transaction as tx
from ads_broker.coordinator.offsets import OFFSETS_TOPIC, OffsetManager
from ads_broker.coordinator.transaction import TRANSACTION_STATE_TOPIC, TransactionCoordinator
from ads_broker.log.records import Record, build_batch
from ads_broker.producer_ids import ProducerIdManager
from ads_broker.replication.replica_manager import ReplicaManager

CONFIG = BrokerConfig.load(None, {"offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"})
VALID_KEY = om.encode_key("g", "t", 0)
VALID_VALUE = om.encode_value(7, -1, "meta", 1)
VALID_TXN_KEY = tx.encode_key("tx")


def _mutations(valid: bytes) -> st.SearchStrategy[bytes]:
    """``valid`` cut short, extended, or with one byte changed."""
    cut = st.integers(0, len(valid)).map(lambda n: valid[:n])
    extended = st.binary(min_size=1, max_size=8).map(lambda tail: valid + tail)
    flipped = st.tuples(st.integers(0, len(valid) - 1), st.integers(0, 255)).map(
        lambda p: valid[:p[0]] + bytes([p[1]]) + valid[p[0] + 1:])
    return st.one_of(cut, extended, flipped)


_keys = st.one_of(st.binary(max_size=40), _mutations(VALID_KEY), _mutations(VALID_TXN_KEY))
_values = st.one_of(st.none(), st.binary(max_size=80), _mutations(VALID_VALUE))
_records = st.lists(st.tuples(_keys, _values), min_size=1, max_size=6)


def _names_the_valid_commit(key: bytes) -> bool:
    try:
        return om.decode_key(key) == ("g", "t", 0)
    except (ValueError, struct.error):
        return False


def _batch(pairs: list[tuple[bytes | None, bytes | None]]) -> bytes:
    now = int(time.time() * 1000)
    return build_batch([Record(offset=-1, timestamp=now, key=k, value=v, headers=[]) for k, v in pairs])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offsets_junk=_records, txn_junk=_records)
def test_loading_arbitrary_records_never_raises(offsets_junk: list[tuple[bytes, bytes | None]],
                                                txn_junk: list[tuple[bytes, bytes | None]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        replicas = ReplicaManager(data_dir, CONFIG)
        replicas.open()
        offsets = OffsetManager(replicas, 1)
        offsets.load()
        txn = TransactionCoordinator(replicas, offsets, ProducerIdManager(data_dir), num_partitions=1,
                                     max_timeout_ms=60000)
        txn.load()
        replicas.create_topic("t", 1, 1, {})
        offsets_log = replicas.get_partition(OFFSETS_TOPIC, 0).log
        txn_log = replicas.get_partition(TRANSACTION_STATE_TOPIC, 0).log
        offsets_log.append_internal(_batch([(VALID_KEY, om.encode_value(5, -1, "", 1))]), leader_epoch=0)
        offsets_log.append_internal(_batch(list(offsets_junk)), leader_epoch=0)
        txn_log.append_internal(_batch(list(txn_junk)), leader_epoch=0)
        replicas.close()

        replicas = ReplicaManager(data_dir, CONFIG)
        replicas.open()
        try:
            offsets = OffsetManager(replicas, 1)
            offsets.load()  # must not raise, whatever the junk was
            TransactionCoordinator(replicas, offsets, ProducerIdManager(data_dir), num_partitions=1,
                                   max_timeout_ms=60000).load()
            committed = offsets.fetch("g", [("t", 0)])[("t", 0)]
            if not any(_names_the_valid_commit(k) for k, _ in offsets_junk):
                assert committed is not None and committed.offset == 5
        finally:
            replicas.close()
