"""Replication's cost and failover times on a three-broker ads-broker cluster (issue 13, "Performance").

    .venv/bin/python bench/cluster_replication.py --messages 300000 --repeats 3 --failovers 3

One real ZooKeeper and three ``ads-broker serve`` processes in cluster mode on loopback, the
client on the same machine. Two topics of 4 partitions: ``rf1`` (replication factor 1) and ``rf3``
(3, ``min.insync.replicas=2``). Per repeat, in alternating order, one confluent-kafka producer
(idempotent, acks=all, 300-byte values, linger 5 ms: bench/broker_throughput.py's) writes N
messages to each, then one consumer reads them back; prints messages/s and the RF 3 / RF 1 ratio
of the medians (issue 13's target for produce: >= 0.5; Kafka 2014 on three machines: 0.51).

Then the failovers, each on partition 0 of a third RF 3 topic under a steady producer (idempotent,
one record every 5 ms, acks=all): **SIGKILL** of its leader, measured as the longest time the
partition acknowledged nothing (target < zookeeper.session.timeout.ms + 1 s), the killed broker
restarted and the ISR full again before the next; and **controlled shutdown** (SIGTERM) of its
leader, measured the same way (target < 1 s). The brokers run with
``zookeeper.session.timeout.ms`` = ``--session-ms``; ``--work-dir`` keeps their logs.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.cluster.zookeeper import TopicPartition as ZkTopicPartition
from ads_broker.embedded import BrokerProcess, ads_broker_process
from ads_broker.exceptions import BrokerError
from bench.broker_throughput import consume, produce

IDS = (1, 2, 3)
PARTITIONS = 4


class Cluster:
    def __init__(self, root: Path, session_ms: int) -> None:
        self.root = root
        self.session_ms = session_ms
        self.zk = ZooKeeperServer(root / "zookeeper").start()
        self.connect = self.zk.connect_string("bench")
        self.procs: dict[int, BrokerProcess] = {}
        cluster_id = f"bench-{uuid.uuid4().hex[:8]}"
        try:  # a broker that fails to start must not leave ZooKeeper and the others running
            for b in IDS:
                config = {"broker.id": str(b), "cluster.id": cluster_id, "zookeeper.connect": self.connect,
                          "zookeeper.session.timeout.ms": str(session_ms)}
                self.procs[b] = ads_broker_process(root / f"broker-{b}", config=config,
                                                   log_path=root / f"broker-{b}.log")
                self.procs[b].start()
            self.bootstrap = ",".join(p.bootstrap for p in self.procs.values())
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            wait(lambda: sorted(admin.list_topics(timeout=10).brokers) == list(IDS), "three registered brokers")
        except BaseException:
            self.close()
            raise

    def state(self, topic: str, partition: int) -> tuple[int, list[int]]:
        zk = KafkaZkClient(self.connect, session_timeout_ms=self.session_ms).start()
        try:
            found = zk.get_partition_state(ZkTopicPartition(topic, partition))
        finally:
            zk.close()
        return (found.leader, list(found.isr)) if found is not None else (-1, [])

    def full_isr(self, topic: str) -> None:
        def healthy(partition: int) -> bool:
            leader, isr = self.state(topic, partition)
            return leader in IDS and sorted(isr) == list(IDS)

        wait(lambda: all(healthy(p) for p in range(PARTITIONS)), f"a full ISR on every partition of {topic}")

    def restart(self, broker: int) -> None:
        """Start a stopped broker again; one restarted inside its old session's timeout is refused
        at start (its id is still registered), so retry until it stays up."""
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(BrokerError):  # refused start: retried below
                self.procs[broker].start()
                time.sleep(1.0)
                proc = self.procs[broker].proc
                if proc is not None and proc.poll() is None:
                    return
            if time.monotonic() > deadline:
                raise SystemExit(f"broker {broker} did not start again")
            time.sleep(0.5)

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
        self.zk.kill()


def wait(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def longest_gap(cluster: Cluster, topic: str, fault: Callable[[int], None], leader: int, after_s: float) -> float:
    """The longest time partition 0 of ``topic`` acknowledged nothing while one producer sent a
    record every 5 ms (acks=all, idempotent) through ``fault(leader)``: from 1 s before the fault
    (which comes once the producer has been acknowledged for a second) until ``after_s`` after
    it, the longest interval between consecutive acknowledgements (the last one before the fault
    included). Every record must end acknowledged."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 0, "message.timeout.ms": 120000, "retry.backoff.ms": 20,
                         "retry.backoff.max.ms": 100, "topic.metadata.refresh.fast.interval.ms": 50,
                         "log_level": 2})
    acked: list[float] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            acked.append(time.monotonic())
        else:
            errors.append(err)

    def stream(until: float, enough: Callable[[], bool] = lambda: False) -> None:
        while time.monotonic() < until and not enough():
            producer.produce(topic, b"x", partition=0, on_delivery=on_delivery)
            producer.poll(0.005)

    # A new idempotent producer needs its connections, metadata and producer id before the first
    # acknowledgement (over a second on a loaded machine). The fault must come after a steady
    # second of acknowledgements: with none before it, the outage has no "last ack before the
    # fault" and would not be measured at all (the SIGKILL gaps < 1 s of earlier runs).
    stream(time.monotonic() + 60.0, lambda: bool(acked))
    if not acked:
        raise SystemExit(f"no acknowledgement from {topic}-0 in 60 s before the fault")
    stream(time.monotonic() + 1.0)
    faulted = time.monotonic()
    fault(leader)
    stream(faulted + after_s)
    if producer.flush(120) or errors:
        raise SystemExit(f"records not acknowledged: {len(producer)} pending, errors {errors[:3]}")
    times = sorted(acked)
    gaps = sorted(((b - a, a - faulted) for a, b in itertools.pairwise(times) if b > faulted - 1.0), reverse=True)
    print(f"  {len(times)} acknowledged; longest gaps (seconds, starting at seconds after the fault): "
          + ", ".join(f"{g:.2f}@{at:+.2f}" for g, at in gaps[:3]), flush=True)
    return gaps[0][0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--failovers", type=int, default=3)
    ap.add_argument("--session-ms", type=int, default=6000, help="zookeeper.session.timeout.ms of the brokers")
    ap.add_argument("--work-dir", type=Path, help="keep the brokers' data and logs here (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        root = args.work_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        cluster = Cluster(root, args.session_ms)
        try:
            run(cluster, args)
        finally:
            cluster.close()


def run(cluster: Cluster, args: argparse.Namespace) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    value = os.urandom(150).hex().encode()
    rows: dict[str, list[tuple[float, float]]] = {"rf1": [], "rf3": []}
    for repeat in range(args.repeats):
        order = ["rf1", "rf3"] if repeat % 2 == 0 else ["rf3", "rf1"]
        for kind in order:
            topic = f"{kind}-{repeat}"
            rf = 1 if kind == "rf1" else 3
            config = {"retention.ms": "-1", "retention.bytes": "-1"} | ({"min.insync.replicas": "2"} if rf == 3 else {})
            admin.create_topics([NewTopic(topic, PARTITIONS, rf, config=config)])[topic].result(60)
            if rf == 3:
                cluster.full_isr(topic)
            produce_s = produce(cluster.bootstrap, topic, args.messages, value)
            consume_s = consume(cluster.bootstrap, topic, PARTITIONS, args.messages + 1)
            rows[kind].append((args.messages / produce_s, args.messages / consume_s))
            print(f"repeat {repeat} {kind}: produce {args.messages / produce_s:>10,.0f} msg/s   "
                  f"consume {args.messages / consume_s:>10,.0f} msg/s", flush=True)
    for i, what in enumerate(("produce", "consume")):
        one = statistics.median(r[i] for r in rows["rf1"])
        three = statistics.median(r[i] for r in rows["rf3"])
        print(f"{what}: RF 1 {one:,.0f} msg/s, RF 3 {three:,.0f} msg/s, ratio RF 3 / RF 1 {three / one:.2f}")

    topic = "failover"
    admin.create_topics([NewTopic(topic, PARTITIONS, 3, config={"min.insync.replicas": "2"})])[topic].result(60)
    kills: list[float] = []
    shutdowns: list[float] = []
    window = args.session_ms / 1000 + 6
    for _ in range(args.failovers):
        cluster.full_isr(topic)
        leader = cluster.state(topic, 0)[0]
        kills.append(longest_gap(cluster, topic, lambda b: cluster.procs[b].kill(), leader, window))
        print(f"SIGKILL of leader {leader}: no acknowledgement for {kills[-1]:.2f} s", flush=True)
        cluster.restart(leader)
        cluster.full_isr(topic)
        leader = cluster.state(topic, 0)[0]
        shutdowns.append(longest_gap(cluster, topic, lambda b: cluster.procs[b].signal(signal.SIGTERM), leader, 5.0))
        print(f"SIGTERM of leader {leader}: no acknowledgement for {shutdowns[-1]:.2f} s", flush=True)
        cluster.procs[leader].stop()  # waits for the controlled shutdown to finish
        cluster.restart(leader)
    session_s = args.session_ms / 1000
    print(f"failover after SIGKILL: median {statistics.median(kills):.2f} s, max {max(kills):.2f} s "
          f"(target < session timeout {session_s:.0f} s + 1 s)")
    print(f"controlled shutdown: median {statistics.median(shutdowns):.2f} s, max {max(shutdowns):.2f} s "
          "(target < 1 s)")


if __name__ == "__main__":
    main()
