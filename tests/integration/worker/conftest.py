"""Broker choice for worker integration tests.

``kbroker`` is the broker the worker tests run on: both ads-broker and tansu once ads-broker
serves what the worker needs (Produce/Fetch/ListOffsets/Metadata/CreateTopics/OffsetCommit).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ads_broker.embedded import BrokerProcess, ads_broker_process, tansu_process

BROKERS = os.environ.get("DEDUPE_TEST_BROKERS", "tansu").split(",")


@pytest.fixture(params=BROKERS)
def kbroker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    if request.param == "ads-broker":
        proc = ads_broker_process(tmp_path / "broker-data", log_path=tmp_path / "broker.log")
    else:
        proc = tansu_process(log_path=tmp_path / "tansu.log")
    with proc:
        yield proc
