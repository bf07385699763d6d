"""The group-subscribed transactional copier (Kafka's ``TransactionalMessageCopier`` with
``--use-group-metadata``, KIP-447): both processes subscribe to the input in one consumer group,
commit their offsets with the group metadata (generation, member id) in every transaction, abort
on revocation and rewind to the committed offsets after an abort. A zombie from an older
generation is fenced by the group coordinator. Exits 0 once the committed offsets of every input
partition reach ``--end``."""

from __future__ import annotations

import argparse
import random
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--transactional-id", required=True)
    ap.add_argument("--end", required=True, help="comma-separated end offsets of every input partition")
    ap.add_argument("--batch", type=int, default=300)
    ap.add_argument("--abort-rate", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ends = [int(e) for e in args.end.split(",")]
    rng = random.Random(args.seed)
    producer = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": args.transactional_id,
                         "partitioner": "murmur2_random", "linger.ms": 5, "transaction.timeout.ms": 10000})
    producer.init_transactions(60)
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                         "max.poll.interval.ms": 20000})
    in_txn = False

    def rewind() -> None:
        assignment = consumer.assignment()
        if assignment:
            for tp in consumer.committed(assignment, timeout=60):
                consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))

    def on_revoke(_c: Consumer, _parts: list[TopicPartition]) -> None:
        nonlocal in_txn
        if in_txn:
            producer.abort_transaction(60)
            in_txn = False

    consumer.subscribe([args.input], on_revoke=on_revoke)
    all_parts = [TopicPartition(args.input, p) for p in range(len(ends))]
    last_check = 0.0
    while True:
        msgs = [m for m in consumer.consume(args.batch, 0.5) if m.error() is None]
        if not msgs:
            if time.monotonic() - last_check > 1.0:
                last_check = time.monotonic()
                committed = consumer.committed(all_parts, timeout=60)
                if all(tp.offset >= ends[tp.partition] for tp in committed):
                    break
            continue
        try:
            producer.begin_transaction()
            in_txn = True
            for m in msgs:
                while True:
                    try:
                        producer.produce(args.output, key=m.key(), value=m.value(), partition=m.partition())
                        break
                    except BufferError:
                        producer.poll(0.05)
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 60)
            if rng.random() < args.abort_rate:
                producer.flush(60)
                producer.abort_transaction(60)
                in_txn = False
                rewind()
            else:
                producer.commit_transaction(60)
                in_txn = False
        except KafkaException as e:
            if not e.args[0].txn_requires_abort():
                raise
            # e.g. the group rebalanced under us (KIP-447 generation fencing): abort, rewind, go on.
            producer.abort_transaction(60)
            in_txn = False
            rewind()
    consumer.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KafkaException as e:
        print(f"copier failed: {e}", file=sys.stderr)
        sys.exit(3)
