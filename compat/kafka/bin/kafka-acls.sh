#!/usr/bin/env bash
# Stand-in for Kafka's bin/kafka-acls.sh, which librdkafka's suite calls through KAFKA_PATH to add
# and remove topic ACLs (0109, 0115, 0119). Kafka's tool does this with the Admin API (CreateAcls,
# DeleteAcls); compat/kafka_acls.py sends the same requests without a JVM. Only the options the
# suite uses are understood.
unset LD_LIBRARY_PATH  # the test-runner's librdkafka build is not the Python client's
exec "${COMPAT_PYTHON:-python3}" "$(dirname "$0")/../../kafka_acls.py" "$@"
