"""The high watermark survives a restart (Kafka's ``replication-offset-checkpoint``): a broker
restarted as the only live in-sync replica serves what was committed before it stopped, instead of
a high watermark of 0 that cannot move while the ISR is below ``min.insync.replicas``.

Real ZooKeeper and real ``ads-broker serve`` processes, stopped by PID (SIGKILL: the periodic
checkpoint is what a crash leaves; SIGTERM: the checkpoint written at shutdown). Every wait is a
generous deadline on an outcome, never a timing check.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.errors import LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER
from ads_broker.log.checkpoint import read_offset_checkpoint
from ads_broker.replication.replica_manager import HW_CHECKPOINT_FILE
from tests.chaos.cluster.faults import list_latest, produce
from tests.integration.broker.rawclient import RawClient
from tests.integration.cluster.conftest import IDS, SESSION_TIMEOUT_MS, BrokerCluster, start_three, wait_until
from tests.integration.cluster.test_replication import consume_all, create, state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

RECORDS = [b"r%04d" % i for i in range(300)]


def checkpointed(data_dir: Path, topic: str) -> int | None:
    """The high watermark the broker's checkpoint file holds for partition 0 of ``topic``."""
    return read_offset_checkpoint(data_dir / HW_CHECKPOINT_FILE).get((topic, 0))


def live_brokers(zk_connect: str) -> set[int]:
    zk = KafkaZkClient(zk_connect, session_timeout_ms=SESSION_TIMEOUT_MS).start()
    try:
        return set(zk.get_live_brokers())
    finally:
        zk.close()


def latest(bootstrap: str, topic: str) -> tuple[int, int]:
    with RawClient(bootstrap) as raw:
        answer = raw.request(list_latest(topic), 7).topics[0].partitions[0]
    return answer.error_code, answer.offset


@pytest.mark.parametrize("stop", ["sigkill", "sigterm"])
def test_a_restarted_sole_isr_member_serves_what_was_committed_before_it_stopped(
        brokers: BrokerCluster, zk_connect: str, stop: str) -> None:
    admin = start_three(brokers, **{"replica.high.watermark.checkpoint.interval.ms": "100"})
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic, min_isr=2)
    produce(brokers.bootstrap, topic, RECORDS, "all")
    leader = state(zk_connect, topic).leader
    for b in IDS:  # the followers leave; the ISR shrinks to the leader, below min.insync.replicas
        if b != leader:
            brokers.procs[b].stop()
    wait_until(lambda: list(state(zk_connect, topic).isr) == [leader], "the leader alone in the ISR")
    if stop == "sigkill":
        wait_until(lambda: checkpointed(brokers.data_dir(leader), topic) == len(RECORDS),
                   "the periodic checkpoint to hold the high watermark")
        brokers.procs[leader].kill()
        # Its registration lives until its ZooKeeper session expires; a broker started before that
        # is refused ("broker.id N is already registered"), as Kafka's is.
        wait_until(lambda: leader not in live_brokers(zk_connect), "the killed broker's session to expire")
    else:
        brokers.procs[leader].stop()
        assert checkpointed(brokers.data_dir(leader), topic) == len(RECORDS)
    brokers.start(leader)
    wait_until(lambda: state(zk_connect, topic).leader == leader, "the restarted broker to lead again")
    bootstrap = brokers.procs[leader].bootstrap
    # Kafka reads the HW from the checkpoint when the log is opened: every acknowledged record is
    # readable at once, though the ISR (1) stays below min.insync.replicas (2) and cannot move it.
    # (Before the checkpoint: OFFSET_NOT_AVAILABLE for good, and a consumer read nothing.)
    answers: list[tuple[int, int]] = []

    def led() -> bool:
        answers.append(latest(bootstrap, topic))
        return answers[-1][0] not in (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE)
    wait_until(led, "the restarted broker to answer ListOffsets as the leader")
    assert answers[-1] == (0, len(RECORDS)), f"ListOffsets(latest) answered (error, offset) {answers[-1]}"
    assert consume_all(bootstrap, topic, 1) == RECORDS
