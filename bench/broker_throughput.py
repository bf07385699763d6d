"""Produce and consume throughput through confluent-kafka: ads-broker vs tansu, side by side.

    .venv/bin/python bench/broker_throughput.py --messages 1000000 --repeats 3
    .venv/bin/python bench/broker_throughput.py --compression lz4,zstd,none   # each codec side by side
    # this tree against another commit's ads_broker (git archive <commit> ads_broker | tar -x -C /tmp/base)
    .venv/bin/python bench/broker_throughput.py --brokers ads-broker --baseline /tmp/base --linger-ms 0
    # the cost of validating client batches: this tree against itself with the record walk off
    .venv/bin/python bench/broker_throughput.py --brokers ads-broker --no-validation-baseline \
        --compression none,lz4,zstd

For each broker (started fresh on loopback) and each repeat: produce N messages (idempotent,
acks=all, 300-byte values, 4 partitions, murmur2 partitioner) with one producer, then consume
them all with one consumer (assign, consume(1000)). Prints messages/s, the broker's CPU time per
message (utime+stime of its PID from /proc), and the ads-broker / tansu ratios of the medians.
``--compression`` sets the producer's ``compression.type`` (a comma-separated list runs each in
turn, interleaved per round): ads-broker decompresses and walks every record of a compressed batch
on append (issue 12), so its ratio against tansu and against ``none`` shows that validation's cost.
``--baseline DIR`` adds "ads-base": ads-broker run from the ``ads_broker`` package under DIR (another
commit's tree, first on PYTHONPATH), interleaved with this tree's, and prints this/base ratios (the
cost of a change on the request path). ``--no-validation-baseline`` adds "ads-noval": this tree's
ads-broker with the per-record validation of client batches switched off in its process (the bench
launches it through ``NOVALIDATION_LAUNCHER``, which replaces ``validate_records`` with one that
returns the header's summary before the broker starts: no setting, no environment variable, nothing
in the broker reads), and prints ads-broker/ads-noval ratios: validation's cost in one command.
``--brokers ads-broker,ads-cluster,tansu`` adds "ads-cluster": three brokers and ZooKeeper with the
topic at replication factor 3, ``min.insync.replicas=2`` (issue 13's "single node and with RF=3";
tansu does not replicate, so its row is the same single node), and prints each /tansu ratio.
``--linger-ms 0`` makes the producer send many small
requests, where per-request costs show. Both brokers and the client share the machine's cores; run
it on a quiet machine.
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
from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port, tansu_process

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def produce(bootstrap: str, topic: str, n: int, value: bytes, compression: str = "none", linger_ms: int = 5) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "partitioner": "murmur2_random", "linger.ms": linger_ms, "compression.type": compression})
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


def consume(bootstrap: str, topic: str, partitions: int, n: int, queue_backoff_ms: int | None = None) -> float:
    """Read ``n`` messages of ``partitions`` with one consumer; ``queue_backoff_ms`` sets librdkafka's
    ``fetch.queue.backoff.ms`` (None: its default, 1000 ms)."""
    config: dict[str, object] = {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                                 "enable.partition.eof": True, "fetch.wait.max.ms": 100}
    if queue_backoff_ms is not None:
        config["fetch.queue.backoff.ms"] = queue_backoff_ms
    c = Consumer(config)
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


def warm_group(bootstrap: str, topic: str) -> None:
    """Ask the consumer group's coordinator once before anything is timed. The first group request
    to a fresh broker creates ``__consumer_offsets`` (50 partitions; on a three-broker cluster 150
    replicas opened and led): that was inside the consume time and CPU, 2.6 µs/msg of the
    cluster's 1M-message consume (py-spy: ``Log._load``, leader-epoch checkpoints), and Kafka pays
    it once per cluster's life, not per read."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
    try:
        c.committed([TopicPartition(topic, 0)], timeout=120)
    finally:
        c.close()


#: Runs ``python -m ads_broker`` with the directory in argv[1] first on sys.path: ahead of the working
#: directory (``-m`` would put this tree's ads_broker there) and of the editable install.
BASELINE_LAUNCHER = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
                     "runpy.run_module('ads_broker', run_name='__main__', alter_sys=True)")


#: Runs this tree's ``python -m ads_broker`` with the per-record walk of client batches off (Log's
#: ``validate_records`` returns the header's summary, as docs/BENCHMARKS.md's hand-made baseline
#: did): header, size and CRC checks stay. For the bench's baseline only; never a broker setting.
NOVALIDATION_LAUNCHER = (
    "import runpy\n"
    "import ads_broker.log.log as log_module\n"
    "from ads_broker.log.records import RECORD_BATCH_OVERHEAD, RecordsSummary\n"
    "def header_summary(buf, header, *, max_decompressed):\n"
    "    return RecordsSummary(header.base_timestamp, header.max_timestamp, False,\n"
    "                          header.size - RECORD_BATCH_OVERHEAD)\n"
    "log_module.validate_records = header_summary\n"
    "runpy.run_module('ads_broker', run_name='__main__', alter_sys=True)\n")


def novalidation_process(data_dir: Path, log_path: Path) -> BrokerProcess:
    port = free_port()
    argv = [sys.executable, "-c", NOVALIDATION_LAUNCHER, "serve", "--data-dir", str(data_dir),
            "--listen", f"127.0.0.1:{port}"]
    return BrokerProcess(argv, port, log_path=log_path)


def baseline_process(base: Path, data_dir: Path, log_path: Path) -> BrokerProcess:
    port = free_port()
    argv = [sys.executable, "-c", BASELINE_LAUNCHER, str(base.resolve()), "serve", "--data-dir", str(data_dir),
            "--listen", f"127.0.0.1:{port}"]
    return BrokerProcess(argv, port, log_path=log_path)


class ClusterBrokers:
    """"ads-cluster": ZooKeeper and three ``ads-broker serve`` processes in cluster mode
    (bench/cluster_replication.py's cluster); the topic gets replication factor 3 and
    ``min.insync.replicas=2``, so acks=all waits for a follower. CPU is the three brokers' sum
    (ZooKeeper's is not counted)."""

    replication_factor = 3

    def __init__(self, root: Path) -> None:
        from bench.cluster_replication import Cluster  # it imports this module's produce/consume

        self.cluster = Cluster(root, session_ms=18000)
        self.bootstrap = self.cluster.bootstrap
        self.pids = [p.pid for p in self.cluster.procs.values()]

    def __enter__(self) -> ClusterBrokers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.close()


def run_one(broker: BrokerProcess | ClusterBrokers, name: str, n: int, partitions: int, repeat: int,
            compression: str = "none", linger_ms: int = 5, queue_backoff_ms: int | None = None) -> dict[str, float]:
    topic = f"bench-{repeat}-{compression}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {"retention.ms": "-1", "retention.bytes": "-1"}
    rf = 1
    if isinstance(broker, ClusterBrokers):
        rf, config["min.insync.replicas"] = broker.replication_factor, "2"
        pids = broker.pids
    else:
        pids = [broker.pid]
    admin.create_topics([NewTopic(topic, partitions, rf, config=config)])[topic].result(30)
    if isinstance(broker, ClusterBrokers):
        broker.cluster.full_isr(topic)
    warm_group(broker.bootstrap, topic)
    value = os.urandom(150).hex().encode()  # 300 bytes, incompressible-ish

    def cpu() -> float:
        return sum(cpu_seconds(pid) for pid in pids)

    cpu0 = cpu()
    produce_s = produce(broker.bootstrap, topic, n, value, compression, linger_ms)
    cpu1 = cpu()
    consume_s = consume(broker.bootstrap, topic, partitions, n + 1, queue_backoff_ms)  # + the warm-up message
    cpu2 = cpu()
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
    ap.add_argument("--brokers", default="ads-broker,tansu", help="brokers to run, comma-separated")
    ap.add_argument("--baseline", type=Path, help="a directory holding another tree's ads_broker package")
    ap.add_argument("--no-validation-baseline", action="store_true",
                    help="also run this tree with the per-record validation of client batches off (ads-noval)")
    ap.add_argument("--linger-ms", type=int, default=5, help="the producer's linger.ms")
    ap.add_argument("--fetch-queue-backoff-ms", type=int, default=None,
                    help="the consumer's fetch.queue.backoff.ms (default: librdkafka's, 1000 ms)")
    args = ap.parse_args()
    names = [b.strip() for b in args.brokers.split(",") if b.strip()] + (["ads-base"] if args.baseline else []) + (
        ["ads-noval"] if args.no_validation_baseline else [])
    codecs = [c.strip() for c in args.compression.split(",") if c.strip()]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for codec in codecs:
            for name in names:  # interleaved, so drift on a shared machine hits both
                tmp = Path(tempfile.mkdtemp(prefix="bench-broker-"))
                proc: BrokerProcess | ClusterBrokers
                if name == "tansu":
                    proc = tansu_process(log_path=tmp / "tansu.log")
                elif name == "ads-cluster":
                    proc = ClusterBrokers(tmp)
                elif name == "ads-base":
                    proc = baseline_process(args.baseline, tmp / "data", tmp / "broker.log")
                elif name == "ads-noval":
                    proc = novalidation_process(tmp / "data", tmp / "broker.log")
                else:
                    proc = ads_broker_process(tmp / "data", log_path=tmp / "broker.log")
                with proc:
                    row = run_one(proc, name, args.messages, args.partitions, repeat, codec, args.linger_ms,
                                  args.fetch_queue_backoff_ms)
                results.setdefault((name, codec), []).append(row)
                shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nmedians over {args.repeats} run(s), {args.messages:,} messages of 300 bytes, "
          f"{args.partitions} partitions, linger.ms={args.linger_ms}, fetch.queue.backoff.ms="
          f"{args.fetch_queue_backoff_ms if args.fetch_queue_backoff_ms is not None else 'default (1000)'}")
    med = {key: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for key, rows in results.items()}
    for (name, codec), m in med.items():
        print(f"{name:>10} {codec:>5}: produce {m['produce_mps']:>10,.0f} msg/s  broker {m['produce_cpu_us']:.2f} "
              f"µs/msg | consume {m['consume_mps']:>10,.0f} msg/s  broker {m['consume_cpu_us']:.2f} µs/msg")
    for codec in codecs:
        if ("ads-cluster", codec) in med and ("tansu", codec) in med:
            ours, theirs = med[("ads-cluster", codec)], med[("tansu", codec)]
            print(f"ratio ads-cluster/tansu {codec:>5}: produce {ours['produce_mps'] / theirs['produce_mps']:.2f}  "
                  f"consume {ours['consume_mps'] / theirs['consume_mps']:.2f}")
        for other in ("ads-base", "ads-noval"):
            if (other, codec) in med and ("ads-broker", codec) in med:
                ours, base = med[("ads-broker", codec)], med[(other, codec)]
                print(f"ratio ads-broker/{other} {codec:>5}: produce {ours['produce_mps'] / base['produce_mps']:.3f}  "
                      f"consume {ours['consume_mps'] / base['consume_mps']:.3f}  broker CPU/msg produce "
                      f"{ours['produce_cpu_us'] / base['produce_cpu_us']:.3f} consume "
                      f"{ours['consume_cpu_us'] / base['consume_cpu_us']:.3f}")
        if ("tansu", codec) not in med or ("ads-broker", codec) not in med:
            continue
        ours, peer = med[("ads-broker", codec)], med[("tansu", codec)]
        print(f"ratio ads-broker/tansu {codec:>5}: produce {ours['produce_mps'] / peer['produce_mps']:.2f}  "
              f"consume {ours['consume_mps'] / peer['consume_mps']:.2f}")
    if "none" in codecs and "ads-broker" in names:
        base = med[("ads-broker", "none")]
        for codec in codecs:
            m = med[("ads-broker", codec)]
            print(f"ads-broker {codec:>5} / none: produce {m['produce_mps'] / base['produce_mps']:.2f}  "
                  f"broker CPU/msg {m['produce_cpu_us'] / base['produce_cpu_us']:.2f}")


if __name__ == "__main__":
    main()
