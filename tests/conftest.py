"""Shared fixtures: real broker processes on loopback, one per test unless a module says otherwise.

`broker` runs a test on ads-broker and on tansu (the differential peer). tansu deviates from
Kafka in documented ways (docs/BROKER.md, ../shared/PEERS.md); tests that depend on those
behaviours use `ads_broker` alone.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ads_broker.embedded import BrokerProcess, ads_broker_process, tansu_process

#: The JVMs the suite starts (Spark's driver, in this process or in a `spark-audit`/`make run` child)
#: live for seconds to minutes on tiny inputs: the C2 compiler's work never pays back there, and on 2
#: cores it takes CPU from the run itself. Tier 1 (C1) only, as ZooKeeper's JVM already runs
#: (ads_broker/cluster/zkserver.py). Read by the `java` launcher itself, so every child inherits it;
#: the same bytecode runs, only the JIT tier differs. docs/TESTING.md has the measurements.
JVM_TEST_OPTIONS = "-XX:TieredStopAtLevel=1"


def _jvm_test_options() -> None:
    current = os.environ.get("JDK_JAVA_OPTIONS", "")
    if "TieredStopAtLevel" not in current:
        os.environ["JDK_JAVA_OPTIONS"] = f"{current} {JVM_TEST_OPTIONS}".strip()


_jvm_test_options()

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

