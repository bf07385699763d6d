"""A restarted replica whose leader-epoch checkpoint is gone must still find where its log
diverged from the leader's, and cut there (KIP-101/279): otherwise it keeps records no leader
ever committed, at offsets where the others hold different records, and joins the ISR with them.

How the divergence is made, with real processes: the leader appends records with acks=1 while
both followers are SIGSTOPped, is SIGKILLed, a follower leads the next epoch and writes other
records at the same offsets. The old leader restarts without its ``leader-epoch-checkpoint``
(an operator followed the torn-checkpoint error's advice to delete it, or the partition
directory came from elsewhere). Every batch still carries its leader epoch, so the lineage can
be rebuilt from the log, as Kafka's log recovery reassigns epochs from the batches it reads.
"""

from __future__ import annotations

import uuid

import pytest

from ads_broker.replication.leader_epoch import LEADER_EPOCH_CHECKPOINT_FILE
from tests.chaos.cluster.faults import QUICK_FETCH, cut_off, produce, resume, stop_all_and_compare
from tests.integration.cluster.conftest import IDS, BrokerCluster, start_three, wait_until
from tests.integration.cluster.test_replication import consume_all, create, state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_a_replica_restarted_without_its_epoch_checkpoint_cuts_its_diverged_tail(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers, **QUICK_FETCH)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic, min_isr=2)
    old_leader = state(zk_connect, topic).leader
    followers = [b for b in IDS if b != old_leader]
    base, new = [b"base-%d" % i for i in range(5)], [b"new-%d" % i for i in range(6)]
    produce(brokers.bootstrap, topic, base, "all")

    cut_off(brokers, followers)
    try:  # acks=1: the leader alone holds these (the followers stay in the ISR, lag time 30 s)
        produce(brokers.procs[old_leader].bootstrap, topic, [b"diverged-%d" % i for i in range(3)], "1")
    finally:
        brokers.procs[old_leader].kill()
        resume(brokers, followers)
    wait_until(lambda: state(zk_connect, topic).leader in followers, "a follower to lead")
    bootstrap = ",".join(brokers.procs[b].bootstrap for b in followers)
    # One batch per record: the old leader's log end (8) falls on a batch boundary of the new log,
    # so without its lineage it fetches from there, appends, and catches up over its diverged records.
    produce(bootstrap, topic, new, "all", one_per_batch=True)
    assert consume_all(bootstrap, topic, 1) == base + new, "the premise: the followers never got the diverged records"

    (brokers.root / f"broker-{old_leader}" / f"{topic}-0" / LEADER_EPOCH_CHECKPOINT_FILE).unlink()
    brokers.start(old_leader)
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "the old leader back in the ISR")
    produce(brokers.bootstrap, topic, [b"after"], "all")  # all three hold it: the old leader caught up

    stop_all_and_compare(brokers, topic, base + new + [b"after"])


def test_a_follower_restarted_with_a_torn_last_segment_recovers_refetches_and_rejoins(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic, min_isr=2)
    follower = next(b for b in IDS if b != state(zk_connect, topic).leader)
    first = [b"first-%03d" % i for i in range(50)]
    produce(brokers.bootstrap, topic, first, "all")
    brokers.procs[follower].kill()
    segment = max((brokers.root / f"broker-{follower}" / f"{topic}-0").glob("*.log"))
    with segment.open("r+b") as f:  # a power cut mid-write: the last batch is torn
        f.truncate(segment.stat().st_size - 7)
    second = [b"second-%03d" % i for i in range(20)]
    produce(",".join(brokers.procs[b].bootstrap for b in IDS if b != follower), topic, second, "all")
    brokers.start(follower)
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "the torn follower back in the ISR")
    produce(brokers.bootstrap, topic, [b"after"], "all")
    stop_all_and_compare(brokers, topic, first + second + [b"after"])
