"""Fixtures for the other client families (kcat, kafka-python) against a real ads-broker.

One broker per module: starting a broker per test would cost most of this directory's time
budget, and every test still owns its topics, groups and transactional ids (fresh names).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from ads_broker.embedded import BrokerProcess, ads_broker_process

# Few internal partitions: the coordinators load faster and the tests stay well inside 2 minutes.
BROKER_CONFIG = {"transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "3"}


@pytest.fixture(scope="module")
def compat_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("compat-broker")
    with ads_broker_process(tmp / "data", config=BROKER_CONFIG, log_path=tmp / "broker.log") as proc:
        yield proc


@pytest.fixture(scope="session")
def kcat_bin() -> str:
    """The `kcat` binary; missing it fails (`make test` installs Debian's kcat), never skips."""
    path = shutil.which("kcat")
    if path is None:
        pytest.fail("kcat is not installed: `make apt-test-deps` (or `apt-get install kcat`) installs it; "
                    "tests/integration/compat drives ads-broker with it", pytrace=False)
    return path
