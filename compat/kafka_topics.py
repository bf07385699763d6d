"""The subset of Kafka's kafka-topics.sh that librdkafka's test suite uses, over the Admin API.

    kafka-topics.sh --bootstrap-server H:P --create --topic T --partitions N
                    --replication-factor R [--config K=V ...]
    kafka-topics.sh --bootstrap-server H:P --alter --topic T --partitions N
    kafka-topics.sh --bootstrap-server H:P --delete --topic T

Exits non-zero with the broker's error on failure, as the real tool does.
"""

from __future__ import annotations

import argparse
import sys

from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kafka-topics.sh")
    ap.add_argument("--bootstrap-server", required=True)
    op = ap.add_mutually_exclusive_group(required=True)
    op.add_argument("--create", action="store_true")
    op.add_argument("--alter", action="store_true")
    op.add_argument("--delete", action="store_true")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, default=-1)
    ap.add_argument("--replication-factor", type=int, default=-1)
    ap.add_argument("--config", action="append", default=[])
    args = ap.parse_args(argv)

    admin = AdminClient({"bootstrap.servers": args.bootstrap_server})
    if args.create:
        configs = dict(c.split("=", 1) for c in args.config)
        futures = admin.create_topics([NewTopic(args.topic, args.partitions, args.replication_factor,
                                                config=configs)], operation_timeout=30)
    elif args.alter:
        futures = admin.create_partitions([NewPartitions(args.topic, args.partitions)], operation_timeout=30)
    else:
        futures = admin.delete_topics([args.topic], operation_timeout=30)
    try:
        for f in futures.values():
            f.result(60)
    except Exception as e:  # the KafkaException carries the broker's error code and message
        print(f"Error while executing topic command : {e}", file=sys.stderr)
        return 1
    verb = "Created" if args.create else "Altered" if args.alter else "Deleted"
    print(f"{verb} topic {args.topic}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
