"""Shared fixtures: real broker processes on loopback, one per test unless a module says otherwise.

`broker` runs a test on ads-broker and on tansu (the differential peer). tansu deviates from
Kafka in documented ways (docs/BROKER.md, ../shared/PEERS.md); tests that depend on those
behaviours use `ads_broker` alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ads_broker.embedded import BrokerProcess, ads_broker_process, tansu_process


@pytest.fixture
def ads_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with ads_broker_process(tmp_path / "broker-data", log_path=tmp_path / "broker.log") as proc:
        yield proc


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[BrokerProcess]:
    with tansu_process(log_path=tmp_path / "tansu.log") as proc:
        yield proc


@pytest.fixture(params=["ads-broker", "tansu"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    if request.param == "ads-broker":
        proc = ads_broker_process(tmp_path / "broker-data", log_path=tmp_path / "broker.log")
    else:
        proc = tansu_process(log_path=tmp_path / "tansu.log")
    with proc:
        yield proc


@pytest.fixture
def topic_name() -> str:
    """A fresh topic name: every test owns its topics."""
    return f"t-{uuid.uuid4().hex[:12]}"
