"""Dedupe worker throughput, side by side on one broker, data set and client settings.

(a) raw pipe: consume → produce, no dedupe (the ceiling for any Kafka-in/Kafka-out worker);
(a1) the raw pipe with one transaction per batch (begin, produce, ``commit_transaction``), as the
    worker now publishes to fence a second writer (issue 16, hole 4): (a1)/(a) is what the fence
    costs the pipe itself;
(b) our worker as configured by default: PartitionWorker batch loop, serial (per batch: consume, look
    up, publish, wait, write, commit) on a pre-filled store;
(b1) the same worker with ``pipeline = true`` (batch N+1 is read and looked up while N's acks are in
    flight);
(c) naive worker: the same store and clients, but one lookup and one write per message.

Also measures bytes on disk per stored key, aging deletes/s and reconcile records/s. Every
pipeline reads the same input partition from offset 0 and writes its own output topic; each
waits for every delivery and commits per batch. Numbers are medians of ``--rounds`` runs with the
pipelines interleaved. Each measured run is a fresh process (spawned, its GC set as a worker's),
so its CPU time is its own: in one long-lived process, the runs after the naive pipeline's first
round measured ~50 % more user CPU for the same work. Usage:

    .venv/bin/python bench/dedupe_throughput.py --messages 1000000 --prefill 10000000 --broker tansu
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from ads_broker.embedded import ads_broker_process, tansu_process
from dedupe_worker.config import load_config
from dedupe_worker.kafka import consumer_config, create_topics, producer_config
from dedupe_worker.keys import encode_message_id
from dedupe_worker.metrics import WorkerMetrics
from dedupe_worker.reconcile import reconcile
from dedupe_worker.records import with_source
from dedupe_worker.runner import tune_gc
from dedupe_worker.store.rocksdb import RocksDBOptions, RocksDBStore
from dedupe_worker.worker import PartitionWorker

BATCH = 5000  # the worker's default batch_size; --batch overrides it for every pipeline
GENERATION_KEYS = 2_000_000  # set from --prefill: the store in 4 generations, as with max_keys = prefill
INPUT = "bench-in"


def produce_input(bootstrap: str, n: int, dup_rate: float) -> int:
    """n records (300-byte JSON values, UUID keys, ``dup_rate`` retries); returns unique count."""
    p = Producer(producer_config(bootstrap, None, **{"linger.ms": 20}))
    pad = "x" * 200
    unique = 0
    recent: list[bytes] = []
    for i in range(n):
        if recent and (i * 2654435761 % 1000) < dup_rate * 1000:
            key = recent[(i * 40503) % len(recent)]
        else:
            key = str(uuid.uuid4()).encode()
            unique += 1
            recent.append(key)
            recent = recent[-5000:]
        value = b'{"messageId":"' + key + b'","type":"track","event":"Bench","p":"' + pad.encode() + b'"}'
        while True:
            try:
                p.produce(INPUT, key=key, value=value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0
    return unique


def _consume_all(consumer: Any, n: int, handle: Callable[[list[Any]], None]) -> None:
    done = 0
    while done < n:
        msgs = [m for m in consumer.consume(BATCH, 0.05) if m.error() is None]
        if msgs:
            handle(msgs)
            done += len(msgs)


def raw_pipe(bootstrap: str, n: int, tag: str, transactional: bool = False) -> None:
    """(a) consume → produce every record (same headers as the worker), flush + commit per batch;
    (a1) ``transactional``: each batch in one transaction of a transactional producer."""
    out = f"bench-out-raw-{tag}"
    create_topics(bootstrap, {out: 1})
    c = Consumer(consumer_config(bootstrap, f"raw-{tag}", None))
    c.assign([TopicPartition(INPUT, 0, 0)])
    extra = {"transactional.id": f"raw-{tag}", "delivery.report.only.error": True} if transactional else {}
    p = Producer(producer_config(bootstrap, None, **extra))
    if transactional:
        p.init_transactions(30)

    def handle(msgs: list[Any]) -> None:
        if transactional:
            p.begin_transaction()
        for m in msgs:  # the worker's call: positional arguments, the input's timestamp kept
            p.produce(out, m.value(), m.key(), 0, None, None, max(m.timestamp()[1], 0),
                      with_source(m.headers(), 0, m.offset()))
        if transactional:
            p.commit_transaction(30)
        else:
            assert p.flush(30) == 0
        # asynchronous, as the worker's reconcile loop commits since e38dd0c (a like-for-like baseline)
        c.commit(offsets=[TopicPartition(INPUT, 0, msgs[-1].offset() + 1)], asynchronous=True)

    _consume_all(c, n, handle)
    c.close()


def naive(bootstrap: str, n: int, tag: str, store: RocksDBStore) -> None:
    """(c) one lookup and one atomic write per message (same store, same clients)."""
    out = f"bench-out-naive-{tag}"
    create_topics(bootstrap, {out: 1})
    c = Consumer(consumer_config(bootstrap, f"naive-{tag}", None))
    c.assign([TopicPartition(INPUT, 0, 0)])
    p = Producer(producer_config(bootstrap, None))

    def handle(msgs: list[Any]) -> None:
        for m in msgs:
            key = encode_message_id(m.key().decode())
            if store.lookup(key) is None:
                p.produce(out, key=m.key(), value=m.value(), partition=0,
                          headers=with_source(m.headers(), 0, m.offset()))
                store.record([key], [m.timestamp()[1]], input_offset=m.offset() + 1, output_offset=0)
        assert p.flush(30) == 0
        c.commit(offsets=[TopicPartition(INPUT, 0, msgs[-1].offset() + 1)], asynchronous=False)

    _consume_all(c, n, handle)
    c.close()


def ours(bootstrap: str, n: int, tag: str, data: Path, pipeline: bool = False) -> PartitionWorker:
    cfg = load_config(None, bootstrap=bootstrap, input_topic=INPUT, output_topic=f"bench-out-ours-{tag}",
                      dlq_topic=f"bench-dlq-{tag}", data_dir=data, group=f"ours-{tag}", batch_size=BATCH,
                      store={"generation_keys": GENERATION_KEYS}, pipeline=pipeline)
    create_topics(bootstrap, {cfg.output_topic: 1, cfg.dlq_topic: 1})
    w = PartitionWorker(cfg, 0, WorkerMetrics(CollectorRegistry()))
    w.start()
    done = 0
    while done < n:
        done += w.step().consumed
    w.drain()  # pipelined: the last batch is still in flight
    w.close_clients()
    return w


def _options() -> RocksDBOptions:
    return RocksDBOptions(generation_keys=GENERATION_KEYS)


def prefill(path: Path, keys: int, tag: str) -> RocksDBStore:
    store = RocksDBStore(path, _options(), topic=INPUT, partition=0)
    chunk = 100_000
    base = int(time.time() * 1000) - 3600_000
    for start in range(0, keys, chunk):
        batch = [uuid.uuid4().bytes for _ in range(min(chunk, keys - start))]
        store.record(batch, [base] * len(batch), input_offset=0, output_offset=0)
    store.flush()
    return store


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def ours_run(bootstrap: str, n: int, tag: str, data: Path, pipeline: bool) -> tuple[int, str]:
    """(b) or (b1); returns the store's sequence and the output topic."""
    worker = ours(bootstrap, n, tag, data, pipeline=pipeline)
    assert worker.store is not None
    sequence = worker.store.meta().sequence
    worker.close()
    return sequence, worker.cfg.output_topic


def naive_run(bootstrap: str, n: int, tag: str, path: Path) -> None:
    store = RocksDBStore(path, _options(), topic=INPUT, partition=0)
    naive(bootstrap, n, tag, store)
    store.close()


def reconcile_run(bootstrap: str, tag: str, output_topic: str, path: Path) -> tuple[int, float]:
    """Rebuild a fresh store from ``output_topic``; returns the records replayed and the seconds
    the replay took (opening and closing the store not included)."""
    fresh = RocksDBStore(path, _options(), topic=INPUT, partition=0)
    cfg = load_config(None, bootstrap=bootstrap, input_topic=INPUT, output_topic=output_topic,
                      dlq_topic="unused-dlq", group=f"rec-{tag}")
    seconds, _, result = timed(lambda: reconcile(fresh, cfg, 0))
    fresh.close()
    return result.records, seconds


def _child(settings: tuple[int, int], fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[float, float, Any]:
    global BATCH, GENERATION_KEYS
    BATCH, GENERATION_KEYS = settings
    tune_gc()  # the worker process's GC setting (dedupe_worker.runner), for every pipeline alike
    return timed(lambda: fn(*args))


def isolated(fn: Callable[..., Any], *args: Any) -> tuple[float, float, Any]:
    """``fn(*args)`` in a fresh spawned process: (wall s, that process's CPU s, result)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_child, (BATCH, GENERATION_KEYS), fn, args).result()


def main() -> None:
    global BATCH, GENERATION_KEYS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--prefill", type=int, default=1_000_000, help="keys in the store before each run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--broker", choices=["tansu", "ads-broker"], default="tansu")
    ap.add_argument("--json", type=Path, help="also write results here")
    ap.add_argument("--batch", type=int, default=BATCH, help="batch size for every pipeline")
    args = ap.parse_args()
    BATCH = args.batch
    GENERATION_KEYS = max(1, args.prefill // 4)
    tune_gc()  # the worker process's GC setting (dedupe_worker.runner), for every pipeline alike
    tmp = Path(tempfile.mkdtemp(prefix="dedupe-bench-"))
    proc = tansu_process() if args.broker == "tansu" else ads_broker_process(tmp / "broker")
    results: dict[str, list[tuple[float, float]]] = {"raw": [], "raw_txn": [], "ours": [], "pipelined": [],
                                                     "naive": []}
    extra: dict[str, float] = {}
    loads: list[float] = []  # 1-minute load average before each round and at the end (a shared machine)
    with proc:
        bs = proc.bootstrap
        create_topics(bs, {INPUT: 1})
        unique = produce_input(bs, args.messages, 0.006)
        template = tmp / "template"
        t_fill, _, store = timed(lambda: prefill(template, args.prefill, "t"))
        store.compact()  # steady-state size, as after background compaction (every column family)
        store.flush()
        extra["prefill_keys_per_s"] = args.prefill / t_fill
        extra["disk_bytes_per_key"] = store.disk_bytes() / args.prefill
        store.close()
        shutil.copytree(template, tmp / "aging")
        aging = RocksDBStore(tmp / "aging", _options(), topic=INPUT, partition=0)
        to_delete = min(max(500_000, GENERATION_KEYS), args.prefill // 2)
        t_age, _, deleted = timed(lambda: aging.age(to_delete, 2**62).deleted)
        extra["aging_keys_per_s"] = deleted / t_age
        aging.close()
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            tag = f"{r}-{uuid.uuid4().hex[:6]}"
            results["raw"].append(isolated(raw_pipe, bs, args.messages, tag)[:2])
            results["raw_txn"].append(isolated(raw_pipe, bs, args.messages, f"t{tag}", True)[:2])
            data = tmp / f"ours-{tag}"
            shutil.copytree(template, data / "partition-0")
            wall, cpu, (sequence, out_topic) = isolated(ours_run, bs, args.messages, tag, data, False)
            results["ours"].append((wall, cpu))
            assert sequence - args.prefill == unique, \
                f"ours stored {sequence - args.prefill} new keys, expected {unique}"
            sdata = tmp / f"pipelined-{tag}"
            shutil.copytree(template, sdata / "partition-0")
            wall, cpu, (sequence, _) = isolated(ours_run, bs, args.messages, f"p{tag}", sdata, True)
            results["pipelined"].append((wall, cpu))
            assert sequence - args.prefill == unique
            shutil.rmtree(sdata)
            records, t_rec = isolated(reconcile_run, bs, tag, out_topic, tmp / f"rec-{tag}")[2]
            extra.setdefault("reconcile_records_per_s", records / t_rec)
            ndata = tmp / f"naive-{tag}"
            shutil.copytree(template, ndata)
            results["naive"].append(isolated(naive_run, bs, args.messages, tag, ndata)[:2])
            shutil.rmtree(data)
            shutil.rmtree(ndata)
    loads.append(os.getloadavg()[0])
    shutil.rmtree(tmp, ignore_errors=True)
    report(args, results, extra, loads)


def report(args: argparse.Namespace, results: dict[str, list[tuple[float, float]]], extra: dict[str, float],
           loads: list[float]) -> None:
    n = args.messages
    rate = {k: statistics.median(n / w for w, _ in v) for k, v in results.items()}
    cpu_us = {k: statistics.median(c / n * 1e6 for _, c in v) for k, v in results.items()}
    print(f"\n{n:,} messages, store pre-filled with {args.prefill:,} keys, broker {args.broker}, "
          f"median of {args.rounds}")
    print(f"{'pipeline':<28}{'msg/s':>12}{'process CPU µs/msg':>22}")
    for name, label in (("raw", "(a) raw pipe, no dedupe"), ("raw_txn", "(a1) raw pipe, txn per batch"),
                        ("ours", "(b) our worker (default)"),
                        ("pipelined", "(b1) pipeline = true"),
                        ("naive", "(c) per-message get/put")):
        print(f"{label:<28}{rate[name]:>12,.0f}{cpu_us[name]:>22.2f}")
    print(f"ratio (b)/(a) = {rate['ours'] / rate['raw']:.2f}   (b1)/(a) = {rate['pipelined'] / rate['raw']:.2f}"
          f"   (b)/(c) = {rate['ours'] / rate['naive']:.2f}   (a1)/(a) = {rate['raw_txn'] / rate['raw']:.2f}")
    print(f"CPU per message (b)/(a) = {cpu_us['ours'] / cpu_us['raw']:.2f}x   "
          f"(a1)/(a) = {cpu_us['raw_txn'] / cpu_us['raw']:.2f}x")
    print("per round, process CPU µs/msg: " + "; ".join(
        f"{name} " + " ".join(f"{c / n * 1e6:.2f}" for _, c in v) for name, v in results.items()))
    print("CPU per message (b)/(a) per round: " + " ".join(
        f"{o / r:.2f}x" for (_, o), (_, r) in zip(results["ours"], results["raw"], strict=True)))
    print("1-minute load average before each round and at the end: " + " ".join(f"{x:.1f}" for x in loads))
    for k, v in extra.items():
        print(f"{k:<28}{v:>12,.1f}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "msgs_per_s": rate,
                                         "cpu_us_per_msg": cpu_us, **extra}, indent=2))


if __name__ == "__main__":
    main()
