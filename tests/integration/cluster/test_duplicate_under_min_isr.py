"""A retried batch that the leader already holds, sent while the ISR is below min.insync.replicas
(issue 13's exactly-once hole, docs/CLUSTER.md "Duplicates under min.insync.replicas").

Kafka's ``Partition.appendRecordsToLeader`` refuses an acks=all Produce NOT_ENOUGH_REPLICAS before
it looks at the producer's sequence numbers. For a batch the leader holds already (written by an
earlier attempt whose answer never said success, or replicated from the previous leader) that
answer is wrong: librdkafka takes NOT_ENOUGH_REPLICAS as "not persisted", and when a later
OUT_OF_ORDER_SEQUENCE_NUMBER makes it bump its producer epoch it sends those records again under
the new epoch, where no sequence check can catch them (a duplicate in the history test). Here the
leader answers such a batch as the duplicate it is: its original offsets once the high watermark
passed them, NOT_ENOUGH_REPLICAS_AFTER_APPEND ("possibly persisted": retried with the same
sequence) while the ISR stays short. A batch it does not hold keeps Kafka's NOT_ENOUGH_REPLICAS
with nothing written.

Raw requests (kafka-python's schemas) against real brokers and ZooKeeper; faults are SIGSTOP,
SIGCONT and SIGKILL by PID. Every wait is a generous deadline on an outcome, never a timing check.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

from confluent_kafka.admin import NewTopic
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest, ProduceResponse

from ads_broker.errors import (
    NOT_ENOUGH_REPLICAS,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    REQUEST_TIMED_OUT,
)
from ads_broker.exceptions import BrokerError
from ads_broker.log.records import Record, build_batch, decode_batch, iter_batches
from tests.integration.broker.rawclient import RawClient, fetch_request
from tests.integration.cluster.conftest import IDS, BrokerCluster, start_three, wait_until
from tests.integration.cluster.test_replication import applied_isr, state

#: A short Produce timeout for the attempts that cannot be acknowledged (the wait for the HW ends
#: with an error either way; the length only bounds the test's duration).
SHORT_TIMEOUT_MS = 1000


class Producer:
    """An idempotent producer of exact batches: a producer id from InitProducerId, batches built
    with explicit sequence numbers, each sent (and re-sent) as the same bytes."""

    def __init__(self, client: RawClient, topic: str) -> None:
        init = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000), 4)
        assert init.error_code == 0, init
        self.topic, self.pid, self.epoch = topic, init.producer_id, init.producer_epoch

    def batch(self, base_sequence: int, values: list[bytes]) -> bytes:
        now = int(time.time() * 1000)
        return build_batch([Record(offset=i, timestamp=now, key=None, value=v, headers=[])
                            for i, v in enumerate(values)],
                           producer_id=self.pid, producer_epoch=self.epoch, base_sequence=base_sequence)

    def request(self, records: bytes, timeout_ms: int) -> ProduceRequest:
        """An acks=all Produce of ``records`` to partition 0."""
        return ProduceRequest(transactional_id=None, acks=-1, timeout_ms=timeout_ms, topic_data=[
            ProduceRequest.TopicProduceData(name=self.topic, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])])

    def send(self, client: RawClient, records: bytes, timeout_ms: int = 30000) -> tuple[int, int, str | None]:
        """(error code, base offset, error message) of an acks=all Produce v9 of ``records`` to partition 0."""
        answer = client.request(self.request(records, timeout_ms), 9).responses[0].partition_responses[0]
        return answer.error_code, answer.base_offset, answer.error_message

    @staticmethod
    def answer(client: RawClient) -> tuple[int, int]:
        """(error code, base offset) of the Produce v9 sent with ``client.send`` (flexible: 5-byte header)."""
        frame = client.recv_frame()
        answer = ProduceResponse[9].decode(frame[5:]).responses[0].partition_responses[0]
        return answer.error_code, answer.base_offset


def create(brokers: BrokerCluster, assignment: list[int], min_isr: int) -> str:
    admin = start_three(brokers, **{"replica.lag.time.max.ms": "2000"})
    topic = f"t-{uuid.uuid4().hex[:12]}"
    new = NewTopic(topic, 1, replica_assignment=[assignment], config={"min.insync.replicas": str(min_isr)})
    admin.create_topics([new], operation_timeout=30)[topic].result(60)
    return topic


def wait_for_isr(brokers: BrokerCluster, zk_connect: str, topic: str, leader: int, isr: list[int]) -> None:
    """Until ZooKeeper holds ``isr`` with ``leader`` leading and the leader has applied it."""
    wait_until(lambda: state(zk_connect, topic).leader == leader and sorted(state(zk_connect, topic).isr) == isr,
               f"leader {leader} with the ISR {isr} in ZooKeeper")
    wait_until(lambda: sorted(applied_isr(brokers, leader, topic)) == isr, f"broker {leader} to apply the ISR {isr}")


def read_values(client: RawClient, topic: str) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record below the leader's high watermark."""
    answer = client.request(fetch_request(topic, 0, max_wait_ms=0), 12)
    part = answer.responses[0].partitions[0]
    assert part.error_code == 0, part
    data = bytes(part.records or b"")
    out: list[tuple[int, bytes | None]] = []
    for pos, header in iter_batches(data, validate=True):
        _, records = decode_batch(data[pos: pos + header.size])
        out.extend((r.offset, r.value) for r in records)
    return out


def duplicate_waits(brokers: BrokerCluster, broker_id: int) -> list[dict[str, object]]:
    """The broker's log lines of acks=all retries it held as duplicates under min.insync.replicas."""
    return [e for e in brokers.log_events(broker_id) if str(e.get("event", "")).startswith("acks=all retry of a batch")]


def holds_sequence(data_dir: Path, topic: str, pid: int, base_sequence: int) -> bool:
    """Whether a running broker's log of partition 0 holds ``pid``'s batch ``base_sequence`` (read from
    its segment files: a follower answers clients nothing)."""
    found = False
    for segment in sorted((data_dir / f"{topic}-0").glob("*.log")):
        data = segment.read_bytes()
        try:
            found |= any(h.producer_id == pid and h.base_sequence == base_sequence
                         for _, h in iter_batches(data, validate=True))
        except BrokerError:  # a batch being written (truncated): read again on the next poll
            return False
    return found


def test_a_retry_of_a_batch_the_leader_holds_is_answered_as_a_duplicate_under_min_isr(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """One leader: the batch was written by an attempt that timed out waiting for a stopped follower."""
    topic = create(brokers, [1, 2], min_isr=2)
    wait_for_isr(brokers, zk_connect, topic, 1, [1, 2])
    with RawClient(brokers.procs[1].bootstrap) as client:
        producer = Producer(client, topic)
        first, held, fresh = (producer.batch(0, [b"a", b"b", b"c"]), producer.batch(3, [b"d", b"e"]),
                              producer.batch(5, [b"f"]))
        gap = producer.batch(6 + 3, [b"g"])
        assert producer.send(client, first)[:2] == (0, 0)
        brokers.procs[2].signal(signal.SIGSTOP)
        try:
            # Written at offset 3, never acknowledged: the follower fetches nothing, so the high
            # watermark stays below it (and, once the ISR shrank to one, under min.insync.replicas).
            assert producer.send(client, held, SHORT_TIMEOUT_MS)[0] == REQUEST_TIMED_OUT
            wait_for_isr(brokers, zk_connect, topic, 1, [1])
            code, _, message = producer.send(client, held, SHORT_TIMEOUT_MS)
            assert code == NOT_ENOUGH_REPLICAS_AFTER_APPEND, (code, message)  # today: NOT_ENOUGH_REPLICAS
            assert message is not None and "already holds" in message, message
            # A batch the leader does not hold: Kafka's answer, and nothing written; a batch with a
            # sequence gap too (Kafka checks the ISR before the sequence).
            assert producer.send(client, fresh, SHORT_TIMEOUT_MS)[0] == NOT_ENOUGH_REPLICAS
            assert producer.send(client, gap, SHORT_TIMEOUT_MS)[0] == NOT_ENOUGH_REPLICAS
            # The retry waits for the high watermark: the follower comes back during the wait and
            # the answer is the original offset (one copy), as the logged run needed.
            client.send(producer.request(held, 60000), 9)
            wait_until(lambda: len(duplicate_waits(brokers, 1)) == 2, "the leader to hold the retry for replication")
        finally:
            brokers.procs[2].signal(signal.SIGCONT)
        assert producer.answer(client) == (0, 3)
        wait_for_isr(brokers, zk_connect, topic, 1, [1, 2])
        assert producer.send(client, held)[:2] == (0, 3)
        assert producer.send(client, gap)[:2] == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)  # the batch after a refused one
        assert producer.send(client, fresh)[:2] == (0, 5)
        assert read_values(client, topic) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e"), (5, b"f")]


def test_a_new_leader_answers_a_retry_it_holds_from_replication_as_a_duplicate_under_min_isr(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """The logged run's shape: the old leader appended the batch, a follower replicated it, the old
    leader died before acknowledging it, and the retry reaches the new leader while its ISR is short."""
    topic = create(brokers, [1, 2, 3], min_isr=3)
    wait_for_isr(brokers, zk_connect, topic, 1, list(IDS))
    with RawClient(brokers.procs[1].bootstrap) as client:
        producer = Producer(client, topic)
        first, held, fresh = (producer.batch(0, [b"a", b"b", b"c"]), producer.batch(3, [b"d", b"e"]),
                              producer.batch(5, [b"f"]))
        assert producer.send(client, first)[:2] == (0, 0)
        brokers.procs[3].signal(signal.SIGSTOP)  # min.insync.replicas=3: nothing is acknowledged without it
        try:
            assert producer.send(client, held, SHORT_TIMEOUT_MS)[0] == REQUEST_TIMED_OUT
            wait_until(lambda: holds_sequence(brokers.data_dir(2), topic, producer.pid, 3),
                       "broker 2 to replicate the unacknowledged batch")
            brokers.procs[1].kill()  # SIGKILL: broker 2 leads (broker 3's session expires too)
            wait_for_isr(brokers, zk_connect, topic, 2, [2])
            with RawClient(brokers.procs[2].bootstrap) as new_leader:
                code, _, message = producer.send(new_leader, held, SHORT_TIMEOUT_MS)
                assert code == NOT_ENOUGH_REPLICAS_AFTER_APPEND, (code, message)  # today: NOT_ENOUGH_REPLICAS
                assert producer.send(new_leader, fresh, SHORT_TIMEOUT_MS)[0] == NOT_ENOUGH_REPLICAS
        finally:
            brokers.procs[3].signal(signal.SIGCONT)
    brokers.start(1)
    wait_for_isr(brokers, zk_connect, topic, 2, list(IDS))
    with RawClient(brokers.procs[2].bootstrap) as new_leader:
        assert producer.send(new_leader, held)[:2] == (0, 3)
        assert producer.send(new_leader, fresh)[:2] == (0, 5)
        assert read_values(new_leader, topic) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e"), (5, b"f")]
