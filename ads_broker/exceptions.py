"""Exceptions raised by `ads_broker`; every one derives from :class:`BrokerError`.

Each carries the Kafka protocol error code (``error_code``, from the table in
:mod:`ads_broker.errors`) the broker sends to the client when the exception reaches a request
handler, so the mapping lives in one place.
"""

from __future__ import annotations

from collections.abc import Sequence

from ads_broker import errors


class BrokerError(Exception):
    """Root of all `ads_broker` errors. Unmapped errors reach clients as UNKNOWN_SERVER_ERROR."""

    error_code: int = errors.UNKNOWN_SERVER_ERROR


class CorruptRecordError(BrokerError):
    """A batch failed validation: bad CRC, impossible length, truncated (CORRUPT_MESSAGE)."""

    error_code = errors.CORRUPT_MESSAGE


class InvalidRecordError(BrokerError):
    """A well-formed batch the broker refuses: magic != 2, control batch from a client,
    keyless record on a compacted topic, offsets inconsistent with the count (INVALID_RECORD).

    ``record_errors`` are KIP-467's per-record errors, (batch index, message) of each record the
    broker refused by itself (Kafka's ``RecordValidationException``: a keyless record on a compacted
    topic); ProduceResponse v8+ carries them, and a client fails those records with INVALID_RECORD
    and the batch's others with ``_INVALID_DIFFERENT_RECORD``. Empty when the batch as a whole is
    refused (a malformed record, a bad header): every record fails with INVALID_RECORD."""

    error_code = errors.INVALID_RECORD

    def __init__(self, message: str, record_errors: Sequence[tuple[int, str | None]] = ()) -> None:
        super().__init__(message)
        self.record_errors = list(record_errors)


class RecordTooLargeError(BrokerError):
    """A batch larger than ``max.message.bytes`` (MESSAGE_TOO_LARGE)."""

    error_code = errors.MESSAGE_TOO_LARGE


class NotEnoughReplicasError(BrokerError):
    """acks=all to a partition whose in-sync replicas are fewer than its ``min.insync.replicas``
    (refused before the append, as Kafka's ``Partition.appendRecordsToLeader``)."""

    error_code = errors.NOT_ENOUGH_REPLICAS


class NotEnoughReplicasAfterAppendError(BrokerError):
    """An acks=all batch was written but the ISR shrank below ``min.insync.replicas`` before it was
    replicated (NOT_ENOUGH_REPLICAS_AFTER_APPEND; retriable, an idempotent retry is deduplicated)."""

    error_code = errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class OffsetNotAvailableError(BrokerError):
    """ListOffsets(latest) at a new leader whose high watermark has not reached the start of its
    leader epoch yet (OFFSET_NOT_AVAILABLE, retriable): it may still be below what the previous
    leader showed, and "latest" must not go backwards (Kafka's ``fetchOffsetForTimestamp``)."""

    error_code = errors.OFFSET_NOT_AVAILABLE


class RequestTimedOutError(BrokerError):
    """An acks=all batch was written but not replicated to the ISR within the request's timeout
    (REQUEST_TIMED_OUT; retriable)."""

    error_code = errors.REQUEST_TIMED_OUT


class OffsetOutOfRangeError(BrokerError):
    """A fetch or delete offset outside [log_start_offset, log_end_offset] (OFFSET_OUT_OF_RANGE)."""

    error_code = errors.OFFSET_OUT_OF_RANGE


class OutOfOrderSequenceError(BrokerError):
    """An idempotent producer's batch does not follow its last sequence (OUT_OF_ORDER_SEQUENCE_NUMBER)."""

    error_code = errors.OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(BrokerError):
    """A producer epoch older than the one the partition has seen (INVALID_PRODUCER_EPOCH)."""

    error_code = errors.INVALID_PRODUCER_EPOCH


class TransactionCoordinatorFencedError(BrokerError):
    """A transaction marker whose coordinator epoch is older than the one the partition stored for
    its producer: a newer coordinator owns the transaction (TRANSACTION_COORDINATOR_FENCED)."""

    error_code = errors.TRANSACTION_COORDINATOR_FENCED


class InvalidTxnStateError(BrokerError):
    """A non-transactional batch from a producer with an open transaction (INVALID_TXN_STATE)."""

    error_code = errors.INVALID_TXN_STATE


class TxnVerificationError(BrokerError):
    """A transactional batch whose transaction was fenced or ended before the batch reached the
    log; the code is the coordinator's answer (INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE or
    INVALID_PRODUCER_ID_MAPPING)."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code


class InvalidTimestampError(BrokerError):
    """A timestamp outside ``message.timestamp.*.max.ms`` (INVALID_TIMESTAMP).

    ``record_errors``: KIP-467's (batch index, message) of each refused record, as
    :class:`InvalidRecordError`'s (Kafka's ``processRecordErrors`` answers INVALID_TIMESTAMP with
    every record error of the batch when one of them is a timestamp)."""

    error_code = errors.INVALID_TIMESTAMP

    def __init__(self, message: str, record_errors: Sequence[tuple[int, str | None]] = ()) -> None:
        super().__init__(message)
        self.record_errors = list(record_errors)


class UnknownTopicOrPartitionError(BrokerError):
    """The topic or partition does not exist (UNKNOWN_TOPIC_OR_PARTITION)."""

    error_code = errors.UNKNOWN_TOPIC_OR_PARTITION


class InvalidTopicError(BrokerError):
    """A topic name Kafka would reject (INVALID_TOPIC_EXCEPTION)."""

    error_code = errors.INVALID_TOPIC_EXCEPTION


class TopicAlreadyExistsError(BrokerError):
    """CreateTopics for a topic that exists (TOPIC_ALREADY_EXISTS)."""

    error_code = errors.TOPIC_ALREADY_EXISTS


class InvalidReplicaAssignmentError(BrokerError):
    """A replica assignment (CreateTopics, CreatePartitions) naming unknown brokers, a broker twice,
    or a replication factor unlike the topic's (INVALID_REPLICA_ASSIGNMENT)."""

    error_code = errors.INVALID_REPLICA_ASSIGNMENT


class InvalidPartitionsError(BrokerError):
    """A partition count that is not positive or would shrink a topic (INVALID_PARTITIONS)."""

    error_code = errors.INVALID_PARTITIONS


class InvalidReplicationFactorError(BrokerError):
    """A replication factor larger than the number of brokers (INVALID_REPLICATION_FACTOR)."""

    error_code = errors.INVALID_REPLICATION_FACTOR


class PolicyViolationError(BrokerError):
    """A request the broker's limits refuse, e.g. more partitions than ``max.broker.partitions``
    (POLICY_VIOLATION, as Kafka's create.topic.policy answers)."""

    error_code = errors.POLICY_VIOLATION


class KafkaStorageError(BrokerError):
    """A log could not be created or written (an ``OSError`` such as EMFILE or ENOSPC); nothing of
    the failed operation is left behind (KAFKA_STORAGE_ERROR)."""

    error_code = errors.KAFKA_STORAGE_ERROR


class InvalidConfigurationError(BrokerError):
    """An unknown or out-of-range configuration value (INVALID_CONFIG)."""

    error_code = errors.INVALID_CONFIG


class InvalidRequestError(BrokerError):
    """A request that decodes but makes no sense (INVALID_REQUEST)."""

    error_code = errors.INVALID_REQUEST


class FetchSessionIdNotFoundError(BrokerError):
    """An incremental fetch named a session this broker does not have (evicted, closed, never made)."""

    error_code = errors.FETCH_SESSION_ID_NOT_FOUND


class InvalidFetchSessionEpochError(BrokerError):
    """An incremental fetch's epoch is not its session's next one (a retry, a stale or forged request)."""

    error_code = errors.INVALID_FETCH_SESSION_EPOCH


class UnsupportedVersionError(BrokerError):
    """An API version the broker does not advertise (UNSUPPORTED_VERSION)."""

    error_code = errors.UNSUPPORTED_VERSION


class BrokerNotAvailableError(BrokerError):
    """The broker is shutting down and did not apply the request (BROKER_NOT_AVAILABLE, retriable)."""

    error_code = errors.BROKER_NOT_AVAILABLE


class LeaderNotAvailableError(BrokerError):
    """The partition has no leader right now: being created, or no in-sync replica is alive
    (LEADER_NOT_AVAILABLE, retriable: the client refreshes its metadata and retries)."""

    error_code = errors.LEADER_NOT_AVAILABLE


class NotLeaderOrFollowerError(BrokerError):
    """This broker does not lead the partition (NOT_LEADER_OR_FOLLOWER, retriable: the client
    refreshes its metadata and goes to the leader)."""

    error_code = errors.NOT_LEADER_OR_FOLLOWER


class FencedLeaderEpochError(BrokerError):
    """The request names an older leader epoch than the partition's (FENCED_LEADER_EPOCH: the
    client's metadata is stale)."""

    error_code = errors.FENCED_LEADER_EPOCH


class UnknownLeaderEpochError(BrokerError):
    """The request names a newer leader epoch than this broker knows (UNKNOWN_LEADER_EPOCH: this
    broker has not yet seen the controller's change; retriable)."""

    error_code = errors.UNKNOWN_LEADER_EPOCH


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
