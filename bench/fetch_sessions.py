"""Fetch sessions (KIP-227) vs full fetches: a consumer over many partitions, side by side.

    .venv/bin/python bench/fetch_sessions.py --partitions 500 --fetches 300 --records 10 --repeats 3

One fresh ads-broker on loopback, one topic of ``--partitions`` partitions. Two measurements,
each run with full (sessionless) fetches and with an incremental session, interleaved per repeat:

1. **Caught up** (raw Fetch v12 on kafka-python's codec): a consumer at the end of every
   partition polls ``--fetches`` times with ``max.wait.ms=0``, one record appended to one partition
   (round robin) before each poll, the consumer moving its position as it reads. A full fetch names
   every partition and is answered with every partition; an incremental one names only the
   partition that moved and is answered with only the partition that has news. Reports fetches/s,
   request and response bytes per fetch, and the broker's CPU time per fetch (utime+stime of its
   PID from /proc).
2. **Consume** (kafka-python's KafkaConsumer, ``enable_incremental_fetch_sessions`` on or off):
   read ``--records`` records from every partition from the beginning. Reports records/s and the
   broker's CPU time per record.

Prints each run, the medians and the ratios session / full. The client and the broker share the
machine's cores; numbers from a loaded machine say which way, not how much.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.consumer import FetchRequest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ads_broker.embedded import BrokerProcess, ads_broker_process
from tests.integration.broker.rawclient import RawClient

CLK_TCK = os.sysconf("SC_CLK_TCK")
VERSION = 12


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def fetch_request(session_id: int, epoch: int, positions: dict[int, int], topic: str) -> Any:
    parts = [FetchRequest.FetchTopic.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=o,
                                                    last_fetched_epoch=-1, log_start_offset=-1,
                                                    partition_max_bytes=1 << 20)
             for p, o in positions.items()]
    return FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 24, isolation_level=0,
                        session_id=session_id, session_epoch=epoch,
                        topics=[FetchRequest.FetchTopic(topic=topic, partitions=parts)] if parts else [],
                        forgotten_topics_data=[], rack_id="")


class SizedClient(RawClient):
    """A raw client that counts the bytes it sends and receives."""

    sent = 0
    received = 0

    def send(self, request: Any, version: int) -> int:
        self.correlation_id += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self.correlation_id, client_id=self.client_id)
        frame = bytes(request.encode(version=version, header=True, framed=True))
        self.sent += len(frame)
        self.sock.sendall(frame)
        return self.correlation_id

    def recv_frame(self) -> bytes:
        frame = super().recv_frame()
        self.received += len(frame) + 4
        return frame


def caught_up(broker: BrokerProcess, producer: KafkaProducer, topic: str, partitions: int, fetches: int,
              sessions: bool) -> dict[str, float]:
    with SizedClient(broker.bootstrap, client_id="bench-fetch-sessions") as client:
        ends = end_offsets(broker, topic, partitions)
        session_id, epoch = 0, (0 if sessions else -1)
        response = client.request(fetch_request(session_id, epoch, ends, topic), VERSION)
        if sessions:
            session_id, epoch = response.session_id, 1
            assert session_id, "no fetch session was created"
        client.sent = client.received = 0
        elapsed = cpu = 0.0
        previous: int | None = None
        for i in range(fetches):
            p = i % partitions
            producer.send(topic, value=b"x" * 100, partition=p).get(30)
            # An incremental fetch names only what moved since the last one: the partition read last.
            moved = ends if not sessions else {} if previous is None else {previous: ends[previous]}
            # Only the fetch is timed (the append before it is the same in both modes).
            cpu0, t0 = cpu_seconds(broker.pid), time.perf_counter()
            response = client.request(fetch_request(session_id, epoch, moved, topic), VERSION)
            elapsed += time.perf_counter() - t0
            cpu += cpu_seconds(broker.pid) - cpu0
            assert response.error_code == 0, response.error_code
            answered = {(t.topic, q.partition_index): q for t in response.responses for q in t.partitions}
            assert answered[(topic, p)].high_watermark == ends[p] + 1
            ends[p] += 1
            previous = p
            if sessions:
                epoch += 1
        return {"fetches_per_s": fetches / elapsed, "request_bytes": client.sent / fetches,
                "response_bytes": client.received / fetches, "broker_cpu_us_per_fetch": cpu / fetches * 1e6}


def end_offsets(broker: BrokerProcess, topic: str, partitions: int) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    try:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: o for tp, o in ends.items()}
    finally:
        consumer.close()


def consume(broker: BrokerProcess, topic: str, partitions: int, records: int, sessions: bool) -> dict[str, float]:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=100, enable_incremental_fetch_sessions=sessions)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    want = partitions * records
    got = 0
    try:
        cpu0, t0 = cpu_seconds(broker.pid), time.perf_counter()
        deadline = time.monotonic() + 600
        while got < want:
            assert time.monotonic() < deadline, f"read {got} of {want}"
            got += sum(len(recs) for recs in consumer.poll(200, max_records=100_000).values())
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(broker.pid) - cpu0
    finally:
        consumer.close()
    return {"records_per_s": got / elapsed, "broker_cpu_us_per_record": cpu / got * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=500)
    parser.add_argument("--fetches", type=int, default=300, help="caught-up polls per run")
    parser.add_argument("--records", type=int, default=10, help="records per partition for the consume run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = {"max.partitions.per.request": str(max(args.partitions, 1000)),
                  "max.partitions.per.topic": str(max(args.partitions, 1000))}
        with ads_broker_process(Path(tmp) / "data", config=config, log_path=Path(tmp) / "broker.log") as broker:
            run(broker, args)


def run(broker: BrokerProcess, args: argparse.Namespace) -> None:
    topic = "bench-sessions"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics({topic: {"num_partitions": args.partitions, "replication_factor": 1}},
                        wait_for_metadata=True)
    admin.close()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    for p in range(args.partitions):
        for i in range(args.records):
            producer.send(topic, value=b"r%d" % i, partition=p)
    producer.flush(60)
    rows: dict[str, list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for mode in ("full", "session"):
            sessions = mode == "session"
            row = caught_up(broker, producer, topic, args.partitions, args.fetches, sessions)
            row.update(consume(broker, topic, args.partitions, args.records, sessions))
            rows.setdefault(mode, []).append(row)
            print(f"run {repeat} {mode:>7}: " + "  ".join(f"{k} {v:,.1f}" for k, v in row.items()), flush=True)
    producer.close(10)
    med = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in rows.items()}
    print(f"\nmedians over {args.repeats} run(s), {args.partitions} partitions, {args.fetches} caught-up fetches, "
          f"{args.records} records a partition:")
    for mode, m in med.items():
        print(f"{mode:>7}: " + "  ".join(f"{k} {v:,.1f}" for k, v in m.items()))
    print("ratio session/full: " + "  ".join(f"{k} {med['session'][k] / med['full'][k]:.2f}" for k in med["full"]))


if __name__ == "__main__":
    main()
