"""One local[2] SparkSession per test module (session start costs ~10 s on the CI machine)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_audit.session import build_session


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = build_session("local[2]", shuffle_partitions=4)
    yield session
    session.stop()
