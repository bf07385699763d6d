"""Chaos tests use the same broker choice as the worker integration tests."""

from tests.integration.worker.conftest import kbroker  # noqa: F401
