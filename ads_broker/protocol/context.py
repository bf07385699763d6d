"""What a request handler may use of the broker (:class:`HandlerContext`).

Handlers get this, never the :class:`~ads_broker.broker.Broker`: they reach partitions only
through the replica manager's append and read APIs, and neither start, stop nor schedule
anything. Per-request facts (the client's address, its principal, the listener it came in on)
are context variables set for the task serving the connection.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ads_broker.cluster.node import ClusterNode
from ads_broker.cluster.zookeeper import BrokerRegistration
from ads_broker.config import BrokerConfig
from ads_broker.coordinator.group import GroupCoordinator
from ads_broker.coordinator.offsets import OffsetManager
from ads_broker.coordinator.transaction import TransactionCoordinator
from ads_broker.errors import COORDINATOR_NOT_AVAILABLE, NONE, NOT_COORDINATOR
from ads_broker.exceptions import AuthorizationError, BrokerError, KafkaStorageError, NotLeaderOrFollowerError
from ads_broker.faults import BrokerFaults
from ads_broker.producer_ids import ProducerIdManager
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.fetch_session import FetchSessionCache
from ads_broker.rejections import RejectionLog
from ads_broker.replication.replica_manager import ReplicaManager
from ads_broker.security.acl import DENIED_CODE, NAMES, Authorizer
from ads_broker.security.context import ANONYMOUS, current_advertised, current_session
from ads_broker.security.scram import Credentials, CredentialStore
from ads_broker.security.zk_store import ZkSecurity

if TYPE_CHECKING:  # request_metrics imports the API table, whose handlers import this module
    from ads_broker.request_metrics import BrokerMetrics

_client_host: contextvars.ContextVar[str] = contextvars.ContextVar("client_host", default="")
_rejections = RejectionLog()


def flush_rejections() -> None:
    """Write the request rejections still pending (the server calls it periodically)."""
    _rejections.flush()


def set_client_host(client_host: str) -> None:
    """The address of the client whose request the current task handles."""
    _client_host.set(client_host)


class HandlerContext:
    """The broker as request handlers see it: settings, identity, the replica manager, the
    coordinators, producer ids and the authorizer, plus authorization and rejection logging for
    the current request."""

    def __init__(self, *, config: BrokerConfig, data_dir: Path, replicas: ReplicaManager, groups: GroupCoordinator,
                 offsets: OffsetManager, txn: TransactionCoordinator, producer_ids: ProducerIdManager,
                 authorizer: Authorizer | None, faults: BrokerFaults | None,
                 cluster: ClusterNode | None = None, metrics: BrokerMetrics | None = None,
                 credentials: Credentials | None = None, security: ZkSecurity | None = None) -> None:
        self.config = config
        self.data_dir = data_dir
        #: Users' SCRAM credentials: the data dir's file, or ZooKeeper in cluster mode.
        self.credentials: Credentials = credentials if credentials is not None else CredentialStore(data_dir)
        #: Cluster mode: the ZooKeeper session ACLs and credentials are written through (None: single node).
        self.security = security
        self.node_id = config.settings.broker_id
        self.cluster_id = config.settings.cluster_id
        self._advertised = config.advertised
        self.replicas = replicas
        self.groups = groups
        self.offsets = offsets
        self.txn = txn
        self.producer_ids = producer_ids
        #: None when ``authorizer.class.name`` is empty: every request is allowed (Kafka without an authorizer).
        self.authorizer = authorizer
        #: The chaos tests' fault hook (faults.py, ADS_BROKER_FAULT_FILE); None in normal operation.
        self.faults = faults
        #: Cluster mode (``zookeeper.connect``): topics, leaders and brokers come from ZooKeeper.
        self.cluster = cluster
        #: Consumers' incremental fetch sessions (KIP-227; protocol/fetch_session.py).
        self.fetch_sessions = FetchSessionCache(config.settings.max_incremental_fetch_session_cache_slots,
                                                config.settings.min_incremental_fetch_session_eviction_ms,
                                                max_partitions=config.settings.max_broker_partitions)
        #: The request-path counters (None in tests that build a context without a broker).
        self.metrics = metrics
        #: Cluster mode: the live brokers' registrations as the last complete read of the cluster
        #: had them (every Metadata answer refreshes it), for KIP-951 leader endpoints without a
        #: ZooKeeper read (protocol/leader_hint.py). Swapped whole, never mutated.
        self.broker_registrations: dict[int, BrokerRegistration] = {}
        #: Each registration's broker's departure count (``ClusterNode.departures``) before it was
        #: read: one whose broker left since is not used (it may have come back on other ports).
        self.registration_departures: dict[int, int] = {}

    @property
    def advertised(self) -> tuple[str, int]:
        """HOST, PORT of the listener the request being handled came in on (issue 12, listeners)."""
        return current_advertised(self._advertised)

    @property
    def stopping(self) -> bool:
        """The broker is shutting down."""
        return self.replicas.stopping

    def current_client_host(self) -> str:
        return _client_host.get()

    def metrics_appended(self, topic: str, records: int, nbytes: int) -> None:
        """A client's batch was appended (Kafka's BytesInPerSec / MessagesInPerSec of the topic)."""
        if self.metrics is not None:
            self.metrics.appended(topic, records, nbytes)

    # -- authorization (docs/SECURITY.md, "ACLs") -----------------------------------------------

    def _who(self) -> tuple[str, str]:
        """(principal, client IP) of the current request; the IP without the port, as ACL hosts name it."""
        session = current_session()
        principal = session.principal if session is not None else ANONYMOUS
        peer = (session.client_host if session is not None else "") or _client_host.get()
        return principal, peer.rpartition(":")[0] or peer

    async def partition_counts(self, names: Iterable[str]) -> dict[str, int]:
        """Partitions per topic as the cluster knows them (unknown topics left out): this broker's
        topics and, in cluster mode, the cluster's metadata for the ones it does not replicate; a
        coordinator serves keys about topics anywhere in the cluster, as Kafka's metadata cache
        holds every topic."""
        wanted = list(dict.fromkeys(names))
        counts = {n: t.num_partitions for n in wanted if (t := self.replicas.topics.get(n)) is not None}
        missing = [n for n in wanted if n not in counts]
        if missing and self.cluster is not None:
            snapshot = await self.cluster.snapshot(missing)
            counts.update({n: len(view.partitions) for n, view in snapshot.topics.items() if n in missing})
        return counts

    async def coordinator_write_error(self, topic: str, index: int) -> int:
        """Cluster mode: wait until the ISR has every record a coordinator appended to its internal
        partition ``topic``-``index`` so far (Kafka answers an offset commit or a transaction state
        change only after acks=all). NONE once it has; otherwise Kafka's coordinator mapping:
        NOT_COORDINATOR when this broker stopped leading, COORDINATOR_NOT_AVAILABLE when the ISR is
        too small or did not catch up in ``offsets.commit.timeout.ms``. NONE at once on a single node."""
        try:
            partition = self.replicas.get_partition(topic, index)
            if not partition.replicated:
                return NONE
            await self.replicas.wait_for_high_watermark(partition, partition.log.log_end_offset,
                                                        self.config.settings.offsets_commit_timeout_ms)
        except (NotLeaderOrFollowerError, KafkaStorageError):
            return NOT_COORDINATOR
        except BrokerError:
            return COORDINATOR_NOT_AVAILABLE
        return NONE

    def allowed(self, operation: int, resource_type: int, name: str) -> bool:
        """Whether the current request's principal may do ``operation`` on the resource; silent
        (for filtering what a client sees, as Kafka's ``logIfDenied = false``)."""
        if self.authorizer is None:
            return True
        principal, host = self._who()
        return self.authorizer.authorize(principal, host, operation, resource_type, name)

    def allowed_operations(self, operations: tuple[int, ...], resource_type: int, name: str) -> set[int]:
        """The operations of ``operations`` the principal may do on the resource, silent (one lookup
        of the resource's ACLs for all of them: Metadata v8+ asks this for every topic)."""
        if self.authorizer is None:
            return set(operations)
        principal, host = self._who()
        return self.authorizer.authorized_operations(principal, host, operations, resource_type, name)

    def allowed_any(self, operation: int, resource_type: int) -> bool:
        """Whether the principal may do ``operation`` on some resource of the type (Kafka's
        ``authorizeByResourceType``)."""
        if self.authorizer is None:
            return True
        principal, host = self._who()
        return self.authorizer.authorize_any(principal, host, operation, resource_type)

    def denial(self, operation: int, resource_type: int, name: str) -> AuthorizationError | None:
        """None if allowed, else the error to answer (Kafka's code for the resource type); the
        caller logs it through :meth:`log_client_error` (or uses :meth:`authorize`)."""
        if self.allowed(operation, resource_type, name):
            return None
        principal, host = self._who()
        return AuthorizationError(
            f"Principal = {principal} is not authorized to {NAMES['operation'][operation]} "
            f"{NAMES['resource'][resource_type]}:{name} from host = {host}", DENIED_CODE[resource_type])

    def authorize(self, req: DecodedRequest, api: str, operation: int, resource_type: int, name: str,
                  **fields: Any) -> int:
        """0 if allowed, else Kafka's error code for the resource type, with one aggregated log line."""
        error = self.denial(operation, resource_type, name)
        if error is None:
            return 0
        self.log_client_error(req, api, error, principal=self._who()[0], **fields)
        return error.error_code

    def log_client_error(self, req: DecodedRequest, api: str, error: BrokerError | None, **fields: Any) -> None:
        """One log line naming the client and the reason for every request-level error."""
        # Aggregated per (client host, principal, api, error code): one request naming 100,000 bad
        # topics, or a client retrying one all day from new ports, writes one line per interval with
        # a count (issue 12, hole 5). The principal is part of the key because one host may carry
        # several users (a NAT, a shared node); it stays bounded, as a principal must authenticate.
        code = fields.pop("error_code", error.error_code if error else None)
        principal = fields.get("principal") or self._who()[0]
        _rejections.warn(_client_host.get(), "request rejected", aggregate_as=f"{api} error {code} as {principal}",
                         api=api, client_id=req.client_id, correlation_id=req.correlation_id, error_code=code,
                         reason=str(error) if error else None, **fields)
