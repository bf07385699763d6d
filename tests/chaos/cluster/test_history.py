"""A Jepsen-style run of a three-broker cluster (issue 13, "Tests"): a writer and a reader run
through seeded rounds of faults, and the checker (``history.py``) compares what they saw with
what every replica holds at the end.

Faults, by PID, one per round, chosen by a seeded RNG: SIGKILL of a partition's leader, of a
follower, of the controller; SIGSTOP/SIGCONT of a broker (shorter and longer than the ZooKeeper
session timeout); a leader SIGKILLed while a follower is stopped; a lossy restart (SIGKILL, every
segment cut to its last fsynced length with the fault hook's ``cut_to_synced``, restart); ZooKeeper
SIGSTOPped or SIGKILLed and restarted. After each round the cluster must heal (every partition led,
every ISR full again) before the next: Kafka's guarantee is for one failure at a time with
``min.insync.replicas=2``, and two lossy restarts of an unhealed partition can lose what both held
in their page caches alone, in Kafka too.

The writer is an idempotent confluent-kafka producer (``acks=all``) sending numbered values to
three partitions of an RF 3, ``min.insync.replicas=2`` topic for the whole run; the reader
consumes all three from the start, concurrently. Every anomaly the checker knows must be 0.

Profiles: ``ADS_CLUSTER_HISTORY_ROUNDS`` (20 in ``make test``) and ``ADS_CLUSTER_HISTORY_SEED``
(random, printed; rerun a failure with it). The soak profile, outside CI::

    ADS_CLUSTER_HISTORY_ROUNDS=300 .venv/bin/pytest -q -p no:cacheprovider -s tests/chaos/cluster/test_history.py

The run's fault log, history summary and verdict are printed (``-s`` shows them) and written
to ``history.json`` in the test's temp dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.exceptions import BrokerError
from ads_broker.faults import FAULT_FILE_ENV, cut_to_synced
from tests.chaos.broker.faulthook import write_faults
from tests.chaos.cluster.history import History, check
from tests.integration.cluster.conftest import IDS, BrokerCluster, wait_until
from tests.integration.cluster.test_replication import create, local_records, state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROUNDS = int(os.environ.get("ADS_CLUSTER_HISTORY_ROUNDS", "20"))
PARTITIONS = 3
#: a stopped or dead follower leaves the ISR after this long, so acks=all writes go on with two;
#: 3 partitions of each internal topic (Kafka's 50) keep a restart's state changes few
BROKER_CONFIG = {"replica.lag.time.max.ms": "3000", "offsets.topic.num.partitions": "3",
                 "transaction.state.log.num.partitions": "3"}
#: half the other cluster tests' 4 s: a killed broker's id frees (and its partitions move) sooner, so
#: 20 rounds fit in CI's budget; a stalled broker loses its session sooner too, one more fault
SESSION_TIMEOUT_MS = 2000
SESSION_S = SESSION_TIMEOUT_MS / 1000


class Writer(threading.Thread):
    """Numbered values, round robin over the partitions, until stopped; then a flush."""

    def __init__(self, bootstrap: str, topic: str, history: History) -> None:
        super().__init__(name="history-writer", daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5, "message.timeout.ms": 120000, "log_level": 3})
        self.topic = topic
        self.history = history
        self.stopping = threading.Event()
        self.unflushed = -1

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        value = msg.value()
        assert value is not None
        if err is None:
            self.history.ack(value, msg.partition(), msg.offset())
        else:
            self.history.fail(value, err.name())

    def run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            partition = n % PARTITIONS
            value = b"w%07d" % n
            try:
                self.producer.produce(self.topic, value=value, partition=partition, on_delivery=self._delivered)
            except BufferError:  # the queue is full while a partition has no leader: wait, then resend
                self.producer.poll(0.1)
                continue
            self.history.send(partition, value)
            n += 1
            self.producer.poll(0)
            time.sleep(0.002)
        self.unflushed = self.producer.flush(180)


class Reader(threading.Thread):
    """Every partition from offset 0, for the whole run: each record it sees goes in the history."""

    def __init__(self, bootstrap: str, topic: str, history: History) -> None:
        super().__init__(name="history-reader", daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False, "log_level": 3})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.history = history
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                for message in self.consumer.consume(500, 0.2):
                    value = message.value()
                    if message.error() is None and value is not None:
                        self.history.read(message.partition(), message.offset(), value)
        finally:
            self.consumer.close()


class Nemesis:
    """One fault per round, by PID, then the cluster must heal."""

    def __init__(self, brokers: BrokerCluster, zk: ZooKeeperServer, topic: str, rng: random.Random) -> None:
        self.brokers = brokers
        self.zk = zk
        self.topic = topic
        self.rng = rng
        self.log: list[dict[str, object]] = []
        self.supervisor_restarts = 0  # starts refused while the killed broker's session lived
        self.faults: dict[str, Callable[[], str]] = {
            "kill_leader": self.kill_leader, "kill_follower": self.kill_follower,
            "kill_controller": self.kill_controller, "pause_short": self.pause_short,
            "pause_past_session": self.pause_past_session, "kill_leader_follower_paused": self.kill_leader_paused,
            "lossy_restart": self.lossy_restart, "zookeeper_pause": self.zookeeper_pause,
            "zookeeper_restart": self.zookeeper_restart,
        }

    # -- choosing targets ----------------------------------------------------------------------

    def _partition_state(self) -> tuple[int, int, list[int]]:
        partition = self.rng.randrange(PARTITIONS)
        current = state(self.brokers.zk_connect, self.topic, partition)
        return partition, current.leader, list(current.isr)

    def _controller(self) -> int:
        zk = KafkaZkClient(self.brokers.zk_connect, session_timeout_ms=SESSION_TIMEOUT_MS).start()
        try:
            controller = zk.get_controller_id()
        finally:
            zk.close()
        return controller if controller in IDS else self.rng.choice(IDS)

    def _hold(self, low: float, high: float) -> float:
        held = self.rng.uniform(low, high)
        time.sleep(held)  # how long the fault lasts: part of the fault, not an assertion
        return held

    def _kill_and_restart(self, broker: int, *, lossy: bool = False) -> str:
        proc = self.brokers.procs[broker]
        if lossy:
            self._hold(0.3, 1.0)  # let appends arrive that no fsync covers yet
        proc.kill()
        cut = ""
        if lossy:
            cuts = cut_to_synced(self.brokers.root / f"broker-{broker}")
            cut = f", {sum(c.lost_bytes for c in cuts)} unsynced bytes cut from {len(cuts)} segments"
        held = self._hold(0.1, 1.0)
        with contextlib.suppress(BrokerError):  # exited at start (its old session lives): heal() restarts it
            self.brokers.start(broker)
        return f"broker {broker} SIGKILLed{cut}, restarted after {held:.1f}s"

    # -- the faults ----------------------------------------------------------------------------

    def kill_leader(self) -> str:
        partition, leader, _ = self._partition_state()
        return f"leader of {partition}: " + self._kill_and_restart(leader if leader in IDS else self.rng.choice(IDS))

    def kill_follower(self) -> str:
        partition, leader, _ = self._partition_state()
        follower = self.rng.choice([b for b in IDS if b != leader])
        return f"follower of {partition}: " + self._kill_and_restart(follower)

    def kill_controller(self) -> str:
        return "controller: " + self._kill_and_restart(self._controller())

    def _pause(self, broker: int, low: float, high: float) -> str:
        proc = self.brokers.procs[broker]
        proc.signal(signal.SIGSTOP)
        try:
            held = self._hold(low, high)
        finally:
            proc.signal(signal.SIGCONT)
        return f"broker {broker} SIGSTOPped for {held:.1f}s"

    def pause_short(self) -> str:
        return self._pause(self.rng.choice(IDS), 0.3, 0.6 * SESSION_S)

    def pause_past_session(self) -> str:
        return self._pause(self.rng.choice(IDS), SESSION_S + 0.5, SESSION_S + 2.0)

    def kill_leader_paused(self) -> str:
        partition, leader, _ = self._partition_state()
        leader = leader if leader in IDS else self.rng.choice(IDS)
        follower = self.rng.choice([b for b in IDS if b != leader])
        paused = self.brokers.procs[follower]
        paused.signal(signal.SIGSTOP)
        try:
            killed = self._kill_and_restart(leader)
        finally:
            paused.signal(signal.SIGCONT)
        return f"partition {partition}: follower {follower} SIGSTOPped while the leader's " + killed

    def lossy_restart(self) -> str:
        return "lossy: " + self._kill_and_restart(self.rng.choice(IDS), lossy=True)

    def zookeeper_pause(self) -> str:
        os.kill(self.zk.pid, signal.SIGSTOP)
        try:
            held = self._hold(0.5, SESSION_S + 2.0)
        finally:
            os.kill(self.zk.pid, signal.SIGCONT)
        return f"ZooKeeper SIGSTOPped for {held:.1f}s"

    def zookeeper_restart(self) -> str:
        self.zk.kill()
        held = self._hold(0.2, 2.0)
        self.zk.start()
        return f"ZooKeeper SIGKILLed, restarted after {held:.1f}s"

    # -- a round -------------------------------------------------------------------------------

    def round(self, index: int) -> None:
        name = self.rng.choice(sorted(self.faults))
        started = time.monotonic()
        what = self.faults[name]()
        self.heal(f"the cluster to heal after round {index} ({what})")
        entry = {"round": index, "fault": name, "what": what, "seconds": round(time.monotonic() - started, 1)}
        self.log.append(entry)
        print(f"round {index}: {what}; healed after {entry['seconds']}s", flush=True)

    def heal(self, what: str) -> None:
        """Wait until every broker runs and every partition is led with a full ISR, twice in a row
        (0.3 s apart). A broker restarted within the session timeout of its killed self exits at
        start, as Kafka's does (its id is still registered by the old session): like a supervisor
        (systemd's ``Restart=on-failure``) the nemesis starts it again until it stays."""

        def healthy() -> bool:
            for broker, proc in self.brokers.procs.items():
                if proc.proc is None or proc.proc.poll() is not None:
                    self.supervisor_restarts += 1
                    with contextlib.suppress(BrokerError):  # refused again: the next look retries
                        self.brokers.start(broker)
                    return False
            for partition in range(PARTITIONS):
                current = state(self.brokers.zk_connect, self.topic, partition)
                if current.leader not in IDS or sorted(current.isr) != list(IDS):
                    return False
            return True

        def healed() -> bool:
            if not healthy():
                return False
            time.sleep(0.3)  # the interval between the two looks
            return healthy()

        wait_until(healed, what, timeout_s=180)


def final_log(bootstrap: str, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """Every partition read through its leader up to the high watermark, once the watermarks
    stopped moving (the followers have everything the leader holds)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "log_level": 3})
    try:
        ends: dict[int, int] = {}

        def stable() -> bool:
            now = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(PARTITIONS)}
            settled = now == ends
            ends.update(now)
            time.sleep(0.5)  # the interval between two looks at the watermarks
            return settled

        wait_until(stable, f"the high watermarks of {topic} to settle")
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
        positions = dict.fromkeys(range(PARTITIONS), 0)

        def read_to_ends() -> bool:
            for message in consumer.consume(1000, 1.0):
                value = message.value()
                if message.error() is None and value is not None and message.offset() < ends[message.partition()]:
                    out[message.partition()].append((message.offset(), value))
                    positions[message.partition()] = message.offset() + 1
            return all(positions[p] >= ends[p] for p in range(PARTITIONS))

        wait_until(read_to_ends, f"every record of {topic} up to {ends}", timeout_s=120)
        return out
    finally:
        consumer.close()


@pytest.fixture
def brokers(zk_connect: str, tmp_path: Path) -> Iterator[BrokerCluster]:
    """Three brokers' :class:`BrokerCluster` with this test's session timeout; all killed at the end."""
    cluster = BrokerCluster(zk_connect, tmp_path, session_timeout_ms=SESSION_TIMEOUT_MS)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def test_a_history_under_rounds_of_faults_has_no_anomaly(brokers: BrokerCluster, zk_server: ZooKeeperServer,
                                                        tmp_path: Path) -> None:
    seed = int(os.environ.get("ADS_CLUSTER_HISTORY_SEED", str(random.randrange(1 << 30))))
    print(f"cluster history: seed {seed}, {ROUNDS} rounds (ADS_CLUSTER_HISTORY_SEED={seed} replays the faults)")
    fault_file = tmp_path / "faults.json"
    write_faults(fault_file, {})  # the fault hook records fsynced lengths, for the lossy restarts
    for broker_id in IDS:
        brokers.start(broker_id, env={FAULT_FILE_ENV: str(fault_file)}, **BROKER_CONFIG)
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == list(IDS), "three registered brokers")
    topic = f"h-{uuid.uuid4().hex[:10]}"
    create(admin, topic, partitions=PARTITIONS, min_isr=2)
    history = History()
    writer = Writer(brokers.bootstrap, topic, history)
    reader = Reader(brokers.bootstrap, topic, history)
    nemesis = Nemesis(brokers, zk_server, topic, random.Random(seed))
    nemesis.heal("every partition led with a full ISR")
    writer.start()
    reader.start()
    try:
        time.sleep(1.0)  # some traffic before the first fault
        for index in range(ROUNDS):
            nemesis.round(index)
    finally:
        writer.stopping.set()
        writer.join(240)
        time.sleep(1.0)  # let the reader catch the last writes
        reader.stopping.set()
        reader.join(30)
    assert writer.unflushed == 0, f"{writer.unflushed} writes still unanswered 180 s after the last round"
    nemesis.heal("a full ISR after the writer's flush")
    final = final_log(brokers.bootstrap, topic)
    for proc in brokers.procs.values():
        proc.stop()  # SIGTERM: each replica's files complete for the comparison
    replicas = {b: {p: [(o, v) for o, v in local_records(brokers.root / f"broker-{b}", topic, p) if v is not None]
                    for p in range(PARTITIONS)} for b in IDS}
    verdict = check(history, final, replicas)
    report = {"seed": seed, "rounds": nemesis.log, "supervisor_restarts": nemesis.supervisor_restarts,
              "verdict": verdict.counts, "examples": verdict.examples,
              "acked": verdict.acked, "acked_without_offset": verdict.acked_without_offset,
              "indeterminate": verdict.failed, "reads": verdict.reads,
              "final_records": verdict.final_records}
    (tmp_path / "history.json").write_text(json.dumps(report, indent=1))
    print(f"{verdict.summary()}; {nemesis.supervisor_restarts} supervisor restarts")
    assert len(nemesis.log) == ROUNDS
    assert verdict.acked > 0 and verdict.reads > 0, verdict.summary()  # the run did write and read
    assert verdict.valid, f"seed {seed}: {verdict.summary()}"
