"""Produce and consume throughput through confluent-kafka: ads-broker vs tansu, side by side.

    .venv/bin/python bench/broker_throughput.py --messages 1000000 --repeats 3
    .venv/bin/python bench/broker_throughput.py --compression lz4,zstd,none   # each codec side by side

For each broker (started fresh on loopback) and each repeat: produce N messages (idempotent,
acks=all, 300-byte values, 4 partitions, murmur2 partitioner) with one producer, then consume
them all with one consumer (assign, consume(1000)). Prints messages/s, the broker's CPU time per
message (utime+stime of its PID from /proc), and the ads-broker / tansu ratios of the medians.
``--compression`` sets the producer's ``compression.type`` (a comma-separated list runs each in
turn, interleaved per round): ads-broker decompresses and walks every record of a compressed batch
on append (issue 12), so its ratio against tansu and against ``none`` shows that validation's cost.
Both brokers and the client share the machine's cores; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ads_broker.embedded import BrokerProcess, ads_broker_process, tansu_process

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def produce(bootstrap: str, topic: str, n: int, value: bytes, compression: str = "none") -> float:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "partitioner": "murmur2_random", "linger.ms": 5, "compression.type": compression})
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    p.produce(topic, b"warm-up")
    p.flush(30)
    started = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, key=b"%d" % i, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.005)
        if i & 1023 == 0:
            p.poll(0)
    if p.flush(300):
        raise SystemExit("produce did not finish")
    if errors:
        raise SystemExit(f"{len(errors)} delivery errors, first: {errors[0]}")
    return time.perf_counter() - started


def consume(bootstrap: str, topic: str, partitions: int, n: int) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                  "enable.partition.eof": True, "fetch.wait.max.ms": 100})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen, eof = 0, set()
    started = time.perf_counter()
    while seen < n or len(eof) < partitions:
        for msg in c.consume(1000, 0.1):
            err = msg.error()
            if err is None:
                seen += 1
            elif err.code() == KafkaError._PARTITION_EOF:
                eof.add(msg.partition())
    elapsed = time.perf_counter() - started
    c.close()
    return elapsed


def run_one(broker: BrokerProcess, name: str, n: int, partitions: int, repeat: int,
            compression: str = "none") -> dict[str, float]:
    topic = f"bench-{repeat}-{compression}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config={"retention.ms": "-1",
                                                                  "retention.bytes": "-1"})])[topic].result(30)
    value = os.urandom(150).hex().encode()  # 300 bytes, incompressible-ish
    cpu0 = cpu_seconds(broker.pid)
    produce_s = produce(broker.bootstrap, topic, n, value, compression)
    cpu1 = cpu_seconds(broker.pid)
    consume_s = consume(broker.bootstrap, topic, partitions, n + 1)  # + the warm-up message
    cpu2 = cpu_seconds(broker.pid)
    row = {"produce_mps": n / produce_s, "consume_mps": n / consume_s,
           "produce_cpu_us": (cpu1 - cpu0) / n * 1e6, "consume_cpu_us": (cpu2 - cpu1) / n * 1e6}
    print(f"{name:>10} {compression:>5} run {repeat}: produce {row['produce_mps']:>10,.0f} msg/s "
          f"({row['produce_cpu_us']:.2f} µs broker CPU/msg)   consume {row['consume_mps']:>10,.0f} msg/s "
          f"({row['consume_cpu_us']:.2f} µs/msg)", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compression", default="none", help="producer compression.type(s), comma-separated")
    args = ap.parse_args()
    codecs = [c.strip() for c in args.compression.split(",") if c.strip()]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for codec in codecs:
            for name in ("ads-broker", "tansu"):  # interleaved, so drift on a shared machine hits both
                tmp = Path(tempfile.mkdtemp(prefix="bench-broker-"))
                proc = ads_broker_process(tmp / "data", log_path=tmp / "broker.log") if name == "ads-broker" \
                    else tansu_process(log_path=tmp / "tansu.log")
                with proc:
                    row = run_one(proc, name, args.messages, args.partitions, repeat, codec)
                results.setdefault((name, codec), []).append(row)
                shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nmedians over {args.repeats} run(s), {args.messages:,} messages of 300 bytes, "
          f"{args.partitions} partitions")
    med = {key: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for key, rows in results.items()}
    for (name, codec), m in med.items():
        print(f"{name:>10} {codec:>5}: produce {m['produce_mps']:>10,.0f} msg/s  broker {m['produce_cpu_us']:.2f} "
              f"µs/msg | consume {m['consume_mps']:>10,.0f} msg/s  broker {m['consume_cpu_us']:.2f} µs/msg")
    for codec in codecs:
        ours, peer = med[("ads-broker", codec)], med[("tansu", codec)]
        print(f"ratio ads-broker/tansu {codec:>5}: produce {ours['produce_mps'] / peer['produce_mps']:.2f}  "
              f"consume {ours['consume_mps'] / peer['consume_mps']:.2f}")
    if "none" in codecs:
        base = med[("ads-broker", "none")]
        for codec in codecs:
            m = med[("ads-broker", codec)]
            print(f"ads-broker {codec:>5} / none: produce {m['produce_mps'] / base['produce_mps']:.2f}  "
                  f"broker CPU/msg {m['produce_cpu_us'] / base['produce_cpu_us']:.2f}")


if __name__ == "__main__":
    main()
