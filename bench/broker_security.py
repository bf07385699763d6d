"""Cost of security on ads-broker: SASL_SSL vs PLAINTEXT throughput, and RSS per idle connection.

    .venv/bin/python bench/broker_security.py --messages 200000 --repeats 3 --idle 2000

One broker with two listeners (PLAINTEXT and SASL_SSL, SCRAM-SHA-256, a certificate generated at
start by :mod:`ads_broker.security.testcerts`). For each repeat, in alternating order: produce N messages
(idempotent, acks=all, 300-byte values, 4 partitions) with one confluent-kafka producer, then
consume them all with one consumer, through each listener; prints messages/s per listener and
the SASL_SSL / PLAINTEXT ratio of the medians. Then opens ``--idle`` plaintext connections that
each complete one ApiVersions round trip and stay idle, and prints the broker's VmRSS growth per
connection. Broker and client share the machine's cores.
"""

from __future__ import annotations

import argparse
import secrets
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ads_broker.embedded import ads_broker_process, free_port
from ads_broker.security import testcerts
from ads_broker.security.scram import CredentialStore, ScramCredential

PASSWORD = secrets.token_urlsafe(16)


def make_pki(d: Path) -> tuple[Path, Path]:
    """(ca.pem, server.pem with chain and key) for 127.0.0.1."""
    return testcerts.server_files(d, "ads-bench")


def produce(conf: dict[str, Any], topic: str, n: int, value: bytes) -> float:
    p = Producer({**conf, "enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random",
                  "linger.ms": 5})
    errors: list[KafkaError] = []
    p.produce(topic, b"warm-up")
    p.flush(30)
    started = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, key=b"%d" % i,
                          on_delivery=lambda err, _m: errors.append(err) if err else None)
                break
            except BufferError:
                p.poll(0.005)
        if i & 1023 == 0:
            p.poll(0)
    if p.flush(300) or errors:
        raise SystemExit(f"produce failed: {errors[:3]}")
    return n / (time.perf_counter() - started)


def consume(conf: dict[str, Any], topic: str, partitions: int, n: int) -> float:
    c = Consumer({**conf, "group.id": "bench", "enable.auto.commit": False, "fetch.max.bytes": 52428800})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    started = time.perf_counter()
    while got < n + 1:  # + the warm-up record
        # Ask for no more than what is left: consume() waits its whole timeout for a short batch.
        for msg in c.consume(min(1000, n + 1 - got), 5.0):
            if msg.error() is None:
                got += 1
    elapsed = time.perf_counter() - started
    c.close()
    return n / elapsed


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def idle_connections(port: int, pid: int, count: int) -> float:
    """Bytes of broker RSS per connection that did one ApiVersions round trip and stays idle."""
    api_versions = struct.pack(">hhih", 18, 0, 1, 5) + b"bench"
    frame = struct.pack(">i", len(api_versions)) + api_versions
    warm = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    for s in warm:
        s.sendall(frame)
        s.recv(65536)
    time.sleep(0.5)
    before = rss(pid)
    conns = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(frame)
        s.recv(65536)
        conns.append(s)
    time.sleep(1.0)
    grown = rss(pid) - before
    for s in conns + warm:
        s.close()
    return grown / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--idle", type=int, default=2000)
    args = ap.parse_args()
    value = b"v" * 300
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ca, server = make_pki(d)
        store = CredentialStore(d / "data")
        store.upsert("bench", "SCRAM-SHA-256", ScramCredential.from_password("SCRAM-SHA-256", PASSWORD))
        plain_port, secure_port = free_port(), free_port()
        config = {"listeners": f"PLAINTEXT://127.0.0.1:{plain_port},SASL_SSL://127.0.0.1:{secure_port}",
                  "ssl.keystore.location": str(server), "max.connections.per.ip": str(args.idle + 1000)}
        confs = {
            "PLAINTEXT": {"bootstrap.servers": f"127.0.0.1:{plain_port}"},
            "SASL_SSL": {"bootstrap.servers": f"127.0.0.1:{secure_port}", "security.protocol": "SASL_SSL",
                         "ssl.ca.location": str(ca), "sasl.mechanisms": "SCRAM-SHA-256",
                         "sasl.username": "bench", "sasl.password": PASSWORD},
        }
        with ads_broker_process(d / "data", port=plain_port, config=config, log_path=d / "broker.log") as broker:
            results: dict[str, dict[str, list[float]]] = {k: {"produce": [], "consume": []} for k in confs}
            admin = AdminClient(confs["PLAINTEXT"])
            for r in range(args.repeats):
                order = list(confs) if r % 2 == 0 else list(reversed(confs))
                for name in order:
                    topic = f"bench-{name.lower()}-{r}"
                    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
                    p = produce(confs[name], topic, args.messages, value)
                    c = consume(confs[name], topic, 4, args.messages)
                    results[name]["produce"].append(p)
                    results[name]["consume"].append(c)
                    print(f"repeat {r} {name:<9} produce {p:>9.0f} msg/s  consume {c:>9.0f} msg/s", flush=True)
            for what in ("produce", "consume"):
                plain = statistics.median(results["PLAINTEXT"][what])
                secure = statistics.median(results["SASL_SSL"][what])
                print(f"{what}: PLAINTEXT {plain:.0f} msg/s, SASL_SSL {secure:.0f} msg/s, "
                      f"ratio SASL_SSL/PLAINTEXT {secure / plain:.2f}")
            per = idle_connections(plain_port, broker.pid, args.idle)
            print(f"idle connections: {args.idle}, broker RSS growth {per / 1024:.1f} KiB per connection")


if __name__ == "__main__":
    main()
