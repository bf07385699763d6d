"""Benchmark: transactional vs idempotent produce on ads-broker, and the log cleaner's throughput.

    .venv/bin/python bench/txn_throughput.py --messages 200000
    .venv/bin/python bench/txn_throughput.py --cleaner-mb 64 --buffer-mb 4

Produce: one confluent-kafka producer, 100-byte values, 4 partitions, against a fresh ads-broker
child process. "idempotent" is enable.idempotence=true; "transactional" commits every
``--per-txn`` messages (issue 3's target: >= 0.8x the idempotent rate). Wall time from the first
produce() to the last delivery (idempotent: flush; transactional: the last commit). ``--rounds R``
repeats the pair R times on the same broker (fresh topics), alternating which side goes first,
and adds the per-round ratios and their median (the first round alone is the old single result).

Cleaner: a compacted log of ``--cleaner-mb`` MB written directly through ``Log`` (1000 keys
overwritten over and over, 100-byte values, 1 MB segments), then one ``LogCleaner.clean`` pass
with a ``--buffer-mb`` key map and ``--io-buffer-kb`` of I/O buffers, on two copies of the log:
with tracemalloc (the peak of Python allocations during the pass, next to the bound
dedupe + io buffer; tracing slows the pass) and without (MB of log read per second).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ads_broker.embedded import ads_broker_process
from ads_broker.log.cleaner import CleanerStats, LogCleaner
from ads_broker.log.config import LogConfig
from ads_broker.log.log import Log
from ads_broker.log.records import Record, build_batch

PARTITIONS = 4


def produce(bootstrap: str, topic: str, n: int, per_txn: int | None) -> float:
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                               "enable.idempotence": True, "linger.ms": 5}
    if per_txn:
        conf["transactional.id"] = f"bench-{topic}"
    p = Producer(conf)
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    value = b"x" * 100
    if per_txn:
        p.init_transactions(30)
    start = time.perf_counter()
    for i in range(n):
        if per_txn and i % per_txn == 0:
            if i:
                p.commit_transaction(60)
            p.begin_transaction()
        while True:
            try:
                p.produce(topic, key=b"k%d" % i, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    if per_txn:
        p.commit_transaction(60)
    else:
        p.flush(120)
    elapsed = time.perf_counter() - start
    if errors:
        raise SystemExit(f"delivery errors: {errors[:3]}")
    return n / elapsed


def bench_produce(n: int, per_txn: int, rounds: int = 1) -> dict[str, object]:
    """Idempotent then transactional produce of ``n`` messages on one fresh broker, each into its
    own topic; with ``rounds`` > 1 the pair is repeated (fresh topics) and the order alternates
    (even rounds run the transactional side first), and the median ratio is reported too."""
    idems: list[float] = []
    txns: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, ads_broker_process(Path(tmp) / "data") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for r in range(rounds):
            names = (f"idem{r}" if r else "idem", f"txn{r}" if r else "txn")
            for t in names:
                admin.create_topics([NewTopic(t, PARTITIONS, 1)])[t].result(30)
            if r % 2 == 0:
                idems.append(produce(broker.bootstrap, names[0], n, None))
                txns.append(produce(broker.bootstrap, names[1], n, per_txn))
            else:
                txns.append(produce(broker.bootstrap, names[1], n, per_txn))
                idems.append(produce(broker.bootstrap, names[0], n, None))
    out: dict[str, object] = {"idempotent_msgs_per_s": round(idems[0]), "transactional_msgs_per_s": round(txns[0]),
                              "ratio": round(txns[0] / idems[0], 3)}
    if rounds > 1:
        ratios = [t / i for t, i in zip(txns, idems, strict=True)]
        out["rounds"] = [{"idempotent_msgs_per_s": round(i), "transactional_msgs_per_s": round(t),
                          "ratio": round(t / i, 3)} for i, t in zip(idems, txns, strict=True)]
        out["median_ratio"] = round(statistics.median(ratios), 3)
        out["median_idempotent_msgs_per_s"] = round(statistics.median(idems))
        out["median_transactional_msgs_per_s"] = round(statistics.median(txns))
    return out


class _Partition:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.topic = "bench"
        self.index = 0
        self.lock = threading.Lock()

    @property
    def high_watermark(self) -> int:
        return self.log.log_end_offset


def _build_log(path: Path, mb: int, config: LogConfig) -> int:
    """The bench's compacted log: 1000 keys overwritten over and over, 100 records a batch."""
    log = Log(path, config, topic="bench", partition=0, clean_shutdown=True)
    i = 0
    while log.size_bytes < mb << 20:
        batch = [Record(-1, 1_700_000_000_000, b"key-%d" % ((i + j) % 1000), b"v" * 100) for j in range(100)]
        log.append_as_leader(build_batch(batch), 0)
        i += 100
    log.roll()
    log.close()
    return i


def _clean_once(path: Path, config: LogConfig, buffer_bytes: int, io_buffer_bytes: int,
                traced: bool) -> tuple[float, int, CleanerStats]:
    """(seconds, peak Python allocation during the pass or 0, stats) of one pass over the log at ``path``."""
    log = Log(path, config, topic="bench", partition=0, clean_shutdown=True)
    partition = _Partition(log)
    cleaner = LogCleaner(lambda: [partition], buffer_bytes=buffer_bytes, io_buffer_bytes=io_buffer_bytes)
    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    stats = cleaner.clean(partition)
    elapsed = time.perf_counter() - start
    peak = 0
    if traced:
        _cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    log.close()
    return elapsed, peak, stats


def bench_cleaner(mb: int, buffer_mb: int, io_buffer_kb: int) -> dict[str, float]:
    """The same log cleaned twice (two copies): once with tracemalloc on (peak memory; tracing
    slows every allocation, so its time is the pessimistic one) and once without (throughput)."""
    config = LogConfig(cleanup_policy="compact", segment_bytes=1 << 20, min_cleanable_dirty_ratio=0.0)
    buffer_bytes, io_bytes = buffer_mb << 20, io_buffer_kb << 10
    with tempfile.TemporaryDirectory() as tmp:
        records = _build_log(Path(tmp) / "traced", mb, config)
        shutil.copytree(Path(tmp) / "traced", Path(tmp) / "untraced")
        size = sum(f.stat().st_size for f in (Path(tmp) / "traced").glob("*.log"))
        untraced_s, _, _ = _clean_once(Path(tmp) / "untraced", config, buffer_bytes, io_bytes, traced=False)
        elapsed, peak, stats = _clean_once(Path(tmp) / "traced", config, buffer_bytes, io_bytes, traced=True)
    return {"log_mb": round(size / 2**20, 1), "records": records, "seconds": round(elapsed, 2),
            "mb_read_per_s": round(stats.bytes_read / 2**20 / elapsed, 2),
            "seconds_untraced": round(untraced_s, 2),
            "mb_read_per_s_untraced": round(stats.bytes_read / 2**20 / untraced_s, 2),
            "mb_written": round(stats.bytes_written / 2**20, 3),
            "peak_python_alloc_mb": round(peak / 2**20, 3), "buffer_mb": buffer_mb,
            "io_buffer_mb": round(io_bytes / 2**20, 3),
            "bound_mb": round((buffer_bytes + io_bytes) / 2**20, 3),
            "within_bound": peak <= buffer_bytes + io_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--per-txn", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1,
                    help="produce rounds on the same broker, alternating which side goes first")
    ap.add_argument("--cleaner-mb", type=int, default=64)
    ap.add_argument("--buffer-mb", type=int, default=4, help="log.cleaner.dedupe.buffer.size in MiB")
    ap.add_argument("--io-buffer-kb", type=int, default=512, help="log.cleaner.io.buffer.size in KiB")
    ap.add_argument("--skip-produce", action="store_true")
    ap.add_argument("--skip-cleaner", action="store_true")
    args = ap.parse_args()
    out: dict[str, object] = {}
    if not args.skip_produce:
        out["produce"] = bench_produce(args.messages, args.per_txn, args.rounds)
    if not args.skip_cleaner:
        out["cleaner"] = bench_cleaner(args.cleaner_mb, args.buffer_mb, args.io_buffer_kb)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
