"""A transactional copier (Kafka's ``TransactionalMessageCopier``) run as a child process by the
chaos test: read input partitions with read_committed, write every record to the same output
partition and commit the input offsets in the same transaction; abort some transactions on purpose
(seeded) and rewind. It exits 0 once every input partition is copied up to ``--end`` offsets."""

from __future__ import annotations

import argparse
import random
import sys

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--transactional-id", required=True)
    ap.add_argument("--partitions", required=True, help="comma-separated input partitions")
    ap.add_argument("--end", required=True, help="comma-separated end offsets, one per partition")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--abort-rate", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    parts = [int(p) for p in args.partitions.split(",")]
    ends = dict(zip(parts, (int(e) for e in args.end.split(",")), strict=True))
    rng = random.Random(args.seed)

    producer = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": args.transactional_id,
                         "partitioner": "murmur2_random", "linger.ms": 5, "transaction.timeout.ms": 10000})
    producer.init_transactions(60)  # fences a previous (killed) instance and aborts its transaction
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group,
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest"})
    meta = consumer.consumer_group_metadata()

    def rewind() -> dict[int, int]:
        committed = consumer.committed([TopicPartition(args.input, p) for p in parts], timeout=60)
        pos = {tp.partition: max(tp.offset, 0) for tp in committed}
        consumer.assign([TopicPartition(args.input, p, pos[p]) for p in parts])
        return pos

    position = rewind()
    while any(position[p] < ends[p] for p in parts):
        msgs = consumer.consume(args.batch, 0.5)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            continue
        producer.begin_transaction()
        for m in msgs:
            while True:
                try:
                    producer.produce(args.output, key=m.key(), value=m.value(), partition=m.partition())
                    break
                except BufferError:
                    producer.poll(0.05)
        new_pos = dict(position)
        for m in msgs:
            new_pos[m.partition()] = max(new_pos[m.partition()], m.offset() + 1)  # type: ignore[operator]
        producer.send_offsets_to_transaction(
            [TopicPartition(args.input, p, o) for p, o in new_pos.items()], meta, 60)
        if rng.random() < args.abort_rate:
            producer.flush(60)  # the data reaches the log, so the abort leaves aborted records there
            producer.abort_transaction(60)
            position = rewind()
        else:
            producer.commit_transaction(60)
            position = new_pos
    consumer.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KafkaException as e:
        print(f"copier failed: {e}", file=sys.stderr)
        sys.exit(3)
