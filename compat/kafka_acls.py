"""The subset of Kafka's kafka-acls.sh that librdkafka's test suite uses (0109, 0115, 0119), over
the Admin API (CreateAcls, DeleteAcls), as Kafka's tool sends them:

    kafka-acls.sh --bootstrap-server H:P --add    --allow-principal P --operation OP --allow-host H --topic T
    kafka-acls.sh --bootstrap-server H:P --add    --deny-principal P  --operation OP --deny-host H  --topic T
    kafka-acls.sh --bootstrap-server H:P --remove --force ...           (the same binding, deleted)

Topic resources with the LITERAL pattern type (the tool's default). Exits non-zero with the
broker's error on failure, as the real tool does.
"""

from __future__ import annotations

import argparse
import sys

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kafka-acls.sh")
    ap.add_argument("--bootstrap-server", required=True)
    op = ap.add_mutually_exclusive_group(required=True)
    op.add_argument("--add", action="store_true")
    op.add_argument("--remove", action="store_true")
    ap.add_argument("--force", action="store_true", help="no confirmation prompt (there is none here)")
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--allow-principal")
    who.add_argument("--deny-principal")
    ap.add_argument("--allow-host", default="*")
    ap.add_argument("--deny-host", default="*")
    ap.add_argument("--operation", required=True, help="Kafka's names: All, Read, Write, Describe, ...")
    ap.add_argument("--topic", required=True)
    args = ap.parse_args(argv)

    allow = args.allow_principal is not None
    principal = args.allow_principal if allow else args.deny_principal
    host = args.allow_host if allow else args.deny_host
    permission = AclPermissionType.ALLOW if allow else AclPermissionType.DENY
    try:
        operation = AclOperation[args.operation.upper()]
    except KeyError:
        print(f"Invalid operation: {args.operation}", file=sys.stderr)
        return 1
    admin = AdminClient({"bootstrap.servers": args.bootstrap_server})
    fields = (ResourceType.TOPIC, args.topic, ResourcePatternType.LITERAL, principal, host, operation, permission)
    try:
        if args.add:
            for f in admin.create_acls([AclBinding(*fields)], request_timeout=30).values():
                f.result(60)
        else:
            for f in admin.delete_acls([AclBindingFilter(*fields)], request_timeout=30).values():
                f.result(60)
    except Exception as e:  # the KafkaException carries the broker's error code and message
        print(f"Error while executing ACL command: {e}", file=sys.stderr)
        return 1
    print(f"{'Adding' if args.add else 'Removing'} ACLs for resource `ResourcePattern(resourceType=TOPIC, "
          f"name={args.topic}, patternType=LITERAL)`: {principal} has {permission.name} permission for "
          f"operations: {operation.name} from hosts: {host}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
