"""Exceptions raised by `ads_broker`; every one derives from :class:`BrokerError`.

Each carries the Kafka protocol error code (``error_code``) the broker sends to the client when
the exception reaches a request handler, so the mapping lives in one place.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Root of all `ads_broker` errors. Unmapped errors reach clients as UNKNOWN_SERVER_ERROR."""

    error_code: int = -1


class CorruptRecordError(BrokerError):
    """A batch failed validation: bad CRC, impossible length, truncated (CORRUPT_MESSAGE)."""

    error_code = 2


class InvalidRecordError(BrokerError):
    """A well-formed batch the broker refuses: magic != 2, control batch from a client,
    keyless record on a compacted topic, offsets inconsistent with the count (INVALID_RECORD)."""

    error_code = 87


class RecordTooLargeError(BrokerError):
    """A batch larger than ``max.message.bytes`` (MESSAGE_TOO_LARGE)."""

    error_code = 10


class OffsetOutOfRangeError(BrokerError):
    """A fetch or delete offset outside [log_start_offset, log_end_offset] (OFFSET_OUT_OF_RANGE)."""

    error_code = 1


class OutOfOrderSequenceError(BrokerError):
    """An idempotent producer's batch does not follow its last sequence (OUT_OF_ORDER_SEQUENCE_NUMBER)."""

    error_code = 45


class InvalidProducerEpochError(BrokerError):
    """A producer epoch older than the one the partition has seen (INVALID_PRODUCER_EPOCH)."""

    error_code = 47


class InvalidTxnStateError(BrokerError):
    """A non-transactional batch from a producer with an open transaction (INVALID_TXN_STATE)."""

    error_code = 48


class TxnVerificationError(BrokerError):
    """A transactional batch whose transaction was fenced or ended before the batch reached the
    log; the code is the coordinator's answer (INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE or
    INVALID_PRODUCER_ID_MAPPING)."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code


class InvalidTimestampError(BrokerError):
    """A timestamp outside ``message.timestamp.*.max.ms`` (INVALID_TIMESTAMP)."""

    error_code = 32


class UnknownTopicOrPartitionError(BrokerError):
    """The topic or partition does not exist (UNKNOWN_TOPIC_OR_PARTITION)."""

    error_code = 3


class InvalidTopicError(BrokerError):
    """A topic name Kafka would reject (INVALID_TOPIC_EXCEPTION)."""

    error_code = 17


class TopicAlreadyExistsError(BrokerError):
    """CreateTopics for a topic that exists (TOPIC_ALREADY_EXISTS)."""

    error_code = 36


class InvalidPartitionsError(BrokerError):
    """A partition count that is not positive or would shrink a topic (INVALID_PARTITIONS)."""

    error_code = 37


class InvalidReplicationFactorError(BrokerError):
    """A replication factor larger than the number of brokers (INVALID_REPLICATION_FACTOR)."""

    error_code = 38


class PolicyViolationError(BrokerError):
    """A request the broker's limits refuse, e.g. more partitions than ``max.broker.partitions``
    (POLICY_VIOLATION, as Kafka's create.topic.policy answers)."""

    error_code = 44


class KafkaStorageError(BrokerError):
    """A log could not be created or written (an ``OSError`` such as EMFILE or ENOSPC); nothing of
    the failed operation is left behind (KAFKA_STORAGE_ERROR)."""

    error_code = 56


class InvalidConfigurationError(BrokerError):
    """An unknown or out-of-range configuration value (INVALID_CONFIG)."""

    error_code = 40


class InvalidRequestError(BrokerError):
    """A request that decodes but makes no sense (INVALID_REQUEST)."""

    error_code = 42


class UnsupportedVersionError(BrokerError):
    """An API version the broker does not advertise (UNSUPPORTED_VERSION)."""

    error_code = 35


class BrokerNotAvailableError(BrokerError):
    """The broker is shutting down and did not apply the request (BROKER_NOT_AVAILABLE, retriable)."""

    error_code = 8


class ConfigError(BrokerError):
    """A broker configuration file or override the operator must fix before the broker starts."""


class MalformedFrameError(BrokerError):
    """A request frame that cannot be decoded; the connection is closed, no state is touched."""


class AuthorizationError(BrokerError):
    """The ACLs deny the principal an operation on a resource (TOPIC_AUTHORIZATION_FAILED and the
    others: ``error_code`` is set per resource type, see ``ads_broker.security.acl.DENIED_CODE``)."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code
