"""A broker that cannot compare its local topics with ZooKeeper's at start leaves the cluster and
refuses to start (review s12-2, H1): it used to log "they stay as they are" and serve them
unchecked, so a topic deleted and re-created while it was down kept the old log under the name and
got the new topic's partition states. The real ``ClusterNode._check_local_topics`` runs; the
comparison and the ZooKeeper session are replaced (a unit test: a ZooKeeper failing at exactly that
moment cannot be arranged through real processes without a fault hook)."""

from __future__ import annotations

import asyncio

import pytest

from ads_broker.cluster import node as nodemod
from ads_broker.cluster.exceptions import ZooKeeperUnavailableError


class _Member:
    zk = None

    def __init__(self) -> None:
        self.left = 0

    def leave(self) -> None:
        self.left += 1


def _node(failures: int) -> tuple[nodemod.ClusterNode, list[int]]:
    node = object.__new__(nodemod.ClusterNode)
    node.broker_id = 1
    calls: list[int] = []

    async def compare(_zk: object) -> None:
        calls.append(1)
        if len(calls) <= failures:
            raise OSError(36, "File name too long")

    node._quarantine_stray_topics = compare  # type: ignore[method-assign,assignment]
    return node, calls


def test_a_comparison_that_keeps_failing_refuses_the_start_and_leaves_the_cluster(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodemod, "STRAY_CHECK_RETRY_S", 0.0)
    node, calls = _node(failures=99)
    member = _Member()
    with pytest.raises(ZooKeeperUnavailableError, match="does not serve them unchecked"):
        asyncio.run(node._check_local_topics(member))  # type: ignore[arg-type]
    assert len(calls) == nodemod.STRAY_CHECK_ATTEMPTS
    assert member.left == 1


def test_a_comparison_that_fails_once_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodemod, "STRAY_CHECK_RETRY_S", 0.0)
    node, calls = _node(failures=1)
    member = _Member()
    asyncio.run(node._check_local_topics(member))  # type: ignore[arg-type]
    assert len(calls) == 2 and member.left == 0
