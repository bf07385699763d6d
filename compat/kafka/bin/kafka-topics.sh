#!/usr/bin/env bash
# Stand-in for Kafka's bin/kafka-topics.sh, which librdkafka's suite calls through KAFKA_PATH to
# create (with --config), grow and delete topics. Kafka's tool does this with the Admin API
# (CreateTopics, CreatePartitions, DeleteTopics); compat/kafka_topics.py sends the same requests
# without a JVM. Only the options the suite uses are understood.
unset LD_LIBRARY_PATH  # the test-runner's librdkafka build is not the Python client's
exec "${COMPAT_PYTHON:-python3}" "$(dirname "$0")/../../kafka_topics.py" "$@"
