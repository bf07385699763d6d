"""``free_port`` with ``ADS_TEST_PORTS``: the two pytest sessions of `make test` take ports from
disjoint ranges, each handed out in turn (docs/TESTING.md)."""

from __future__ import annotations

import itertools
import socket

import pytest

from ads_broker import embedded
from ads_broker.exceptions import BrokerError


def _taken(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def _free_range(size: int) -> tuple[int, int]:
    """A run of ``size`` ports below the ephemeral range that is free now."""
    for low in range(21000, 25000, size):
        try:
            held = [_taken(p) for p in range(low, low + size)]
        except OSError:
            continue
        for s in held:
            s.close()
        return low, low + size - 1
    pytest.skip("no free run of ports")


def test_ports_come_from_the_range_in_turn_and_skip_taken_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    low, high = _free_range(4)
    monkeypatch.setenv(embedded.TEST_PORTS_ENV, f"{low}-{high}")
    monkeypatch.setattr(embedded, "_next_port", {})
    first = [embedded.free_port() for _ in range(4)]
    assert sorted(first) == list(range(low, high + 1))  # every port once before any comes back
    assert all(b == low + (a - low + 1) % 4 for a, b in itertools.pairwise(first))
    with _taken(first[0]) as held:
        again = [embedded.free_port() for _ in range(3)]
        assert held.getsockname()[1] not in again
        assert sorted(again) == sorted(first[1:])


def test_a_full_range_and_a_bad_range_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    low, high = _free_range(2)
    monkeypatch.setenv(embedded.TEST_PORTS_ENV, f"{low}-{high}")
    with _taken(low), _taken(high), pytest.raises(BrokerError, match="no free port"):
        embedded.free_port()
    for spec in ("20000", "x-y", "30000-20000", "80-90"):
        monkeypatch.setenv(embedded.TEST_PORTS_ENV, spec)
        with pytest.raises(BrokerError, match=embedded.TEST_PORTS_ENV):
            embedded.free_port()


def test_without_the_variable_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(embedded.TEST_PORTS_ENV, raising=False)
    port = embedded.free_port()
    with _taken(port):  # it was free
        pass
