"""bench/broker_throughput.py's ``--no-validation-baseline`` broker really runs without the
per-record walk, and the broker of ``ads-broker`` (this tree as shipped) really runs with it: the
same 69-byte batch claiming 2**31 - 1 records (issue 12, hole 6) is accepted by the first and
refused by the second. Without this, a benchmark of validation's cost could compare a broker with
itself and report "no cost"."""

from __future__ import annotations

import sys
from pathlib import Path

from ads_broker.embedded import BrokerProcess, ads_broker_process
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_batch_validation import raw_batch, record
from tests.integration.broker.test_protocol_edges import INVALID_RECORD, produce
from tests.kafka_helpers import create_topic

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from broker_throughput import novalidation_process


def lie_code(broker: BrokerProcess) -> int:
    with broker:
        create_topic(broker.bootstrap, "lie", 1)
        with RawClient(broker.bootstrap) as client:
            return produce(client, "lie", 0, raw_batch(record(0), count=2**31 - 1))[0]


def test_the_no_validation_baseline_skips_the_record_walk_and_only_it(tmp_path: Path) -> None:
    assert lie_code(novalidation_process(tmp_path / "noval", tmp_path / "noval.log")) == 0
    assert lie_code(ads_broker_process(tmp_path / "ours", log_path=tmp_path / "ours.log")) == INVALID_RECORD
