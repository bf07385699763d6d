"""The broker: builds one node's parts, runs its background maintenance and dispatches requests.

Handlers get :attr:`Broker.context` (a :class:`~ads_broker.protocol.context.HandlerContext`),
never the broker itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

import structlog
from kafka.protocol.api_message import ApiMessage
from prometheus_client import CollectorRegistry

from ads_broker import dynamic_config
from ads_broker.cluster.node import ClusterNode
from ads_broker.config import BrokerConfig
from ads_broker.coordinator.group import GroupCoordinator
from ads_broker.coordinator.loader import CoordinatorLoader
from ads_broker.coordinator.markers import TxnMarkerSender
from ads_broker.coordinator.offsets import OffsetManager
from ads_broker.coordinator.transaction import TransactionCoordinator
from ads_broker.exceptions import ConfigError
from ads_broker.faults import BrokerFaults
from ads_broker.log.manager import now_ms
from ads_broker.metrics import FetchSessionCollector, serve_metrics
from ads_broker.producer_ids import ProducerIdManager
from ads_broker.protocol.apis import APIS
from ads_broker.protocol.codec import Chunk, DecodedRequest
from ads_broker.protocol.context import HandlerContext, set_client_host
from ads_broker.replication.replica_manager import ReplicaManager
from ads_broker.request_metrics import BrokerMetrics
from ads_broker.security.acl import ACL_FILE, AclStore, Authorizer, parse_super_users
from ads_broker.security.scram import CREDENTIALS_FILE, Credentials, CredentialStore
from ads_broker.security.zk_store import ZkAuthorizer, ZkSecurity

log = structlog.get_logger("ads_broker.broker")


class Broker:
    """One node: replica manager, coordinators and producer ids, plus periodic maintenance."""

    def __init__(self, data_dir: Path, config: BrokerConfig, faults: BrokerFaults | None = None) -> None:
        self.config = config
        self.faults = faults
        self.node_id = config.settings.broker_id
        dynamic_config.load(data_dir, config)  # before any log is opened: topic configs use its defaults
        self.replicas = ReplicaManager(data_dir, config, record_synced_length=faults is not None)
        #: Request, byte and connection counters (served by ``metrics.port`` with the scrape-time gauges).
        self.registry = CollectorRegistry(auto_describe=False)
        self.metrics = BrokerMetrics(max_topic_labels=config.settings.metrics_topic_labels_max,
                                     max_connections=config.settings.max_connections)
        self.registry.register(self.metrics)
        self.replicas.metrics = self.metrics
        self.groups = GroupCoordinator(
            initial_rebalance_delay_ms=config.settings.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=config.settings.group_min_session_timeout_ms,
            max_session_timeout_ms=config.settings.group_max_session_timeout_ms,
            max_group_size=config.settings.group_max_size)
        self.offsets = OffsetManager(self.replicas, config.settings.offsets_topic_num_partitions)
        self.producer_ids = ProducerIdManager(data_dir)
        self.txn = TransactionCoordinator(
            self.replicas, self.offsets, self.producer_ids,
            num_partitions=config.settings.transaction_state_log_num_partitions,
            max_timeout_ms=config.settings.transaction_max_timeout_ms,
            id_expiration_ms=config.settings.transactional_id_expiration_ms,
            marker_delay_s=faults.marker_delay_s if faults is not None else None)
        self.replicas.verify_txn = self.txn.verify_append  # transactional batches are re-verified under the lock
        authorizer: Authorizer | None = None
        super_users = parse_super_users(config.settings.super_users)
        #: Cluster mode: ACLs and SCRAM credentials in ZooKeeper, shared by every broker (read in start()).
        self.security: ZkSecurity | None = None
        self.credentials: Credentials
        if config.settings.zookeeper_connect:
            refuse_local_security_files(data_dir)
            zk_authorizer = (ZkAuthorizer(super_users, config.settings.allow_everyone_if_no_acl_found)
                             if config.settings.authorizer_class_name else None)
            self.security = ZkSecurity(config.settings.zookeeper_connect,
                                       config.settings.zookeeper_session_timeout_ms, zk_authorizer)
            authorizer, self.credentials = zk_authorizer, self.security.credentials
        else:
            if config.settings.authorizer_class_name:
                authorizer = Authorizer(AclStore(data_dir), super_users, config.settings.allow_everyone_if_no_acl_found)
            self.credentials = CredentialStore(data_dir)
        #: Cluster mode: loads and unloads the coordinators' partitions with their leadership.
        self.loader: CoordinatorLoader | None = None
        #: Cluster mode (``zookeeper.connect`` set): this broker's membership; None on a single node.
        self.cluster = ClusterNode(config, self.replicas) if config.settings.zookeeper_connect else None
        if self.cluster is not None:
            self.producer_ids.block_source = self.cluster.allocate_producer_ids
            # The coordinators follow their internal partitions' leadership (docs/CLUSTER.md "Coordinators").
            self.loader = CoordinatorLoader(
                self.replicas, self.groups, self.offsets, self.txn,
                load_fault=faults.coordinator_load_fails if faults is not None else None)
            self.cluster.on_internal_partition = self.loader.on_internal_partition
            self.cluster.on_topic_deleted = self.offsets.delete_topic_offsets
            if faults is not None:
                self.cluster.deletion_ack_fault = faults.deletion_ack_fails
            self.txn.send_markers = TxnMarkerSender(self.replicas, self.offsets, self.cluster,
                                                    config.settings.offsets_commit_timeout_ms).send
        #: What request handlers see of this broker.
        self.context = HandlerContext(config=config, data_dir=data_dir, replicas=self.replicas, groups=self.groups,
                                      offsets=self.offsets, txn=self.txn, producer_ids=self.producer_ids,
                                      authorizer=authorizer, faults=faults, cluster=self.cluster,
                                      metrics=self.metrics, credentials=self.credentials, security=self.security)
        # Kafka's FetchSessionCache gauges and eviction count, served with the other metrics.
        self.registry.register(FetchSessionCollector(self.context.fetch_sessions))
        self._tasks: list[asyncio.Task[None]] = []
        #: The metrics endpoint (``metrics.port``), when served.
        self._metrics: WSGIServer | None = None

    async def start(self) -> None:
        if self.security is not None:  # before any listener opens: logins and requests need them
            await asyncio.get_running_loop().run_in_executor(None, self.security.start)
        self.replicas.open()
        if self.cluster is None:  # cluster mode: each partition loads when this broker leads it
            self.offsets.load()
            self.txn.load()
        await self.groups.start()
        self.replicas.logs.start_cleaner()
        if self.config.settings.metrics_port:
            self._metrics = serve_metrics(self.replicas, self.node_id, self.config.settings.metrics_port,
                                          self.config.settings.metrics_host, self.registry)
            log.info("metrics endpoint serving", listen=f"{self.config.settings.metrics_host}:"
                     f"{self.config.settings.metrics_port}")
        self._tasks = [
            # Log maintenance fsyncs and unlinks under partition locks: run it on the writer threads so
            # the event loop (fetches, heartbeats) never waits on the disk.
            asyncio.create_task(self._every(self.config.settings.log_flush_scheduler_interval_ms, self._flush_due,
                                            off_loop=True)),
            asyncio.create_task(self._every(self.config.settings.log_retention_check_interval_ms,
                                            self.replicas.logs.enforce_retention, off_loop=True)),
            asyncio.create_task(self._every(self.config.settings.producer_id_expiration_check_interval_ms,
                                            self.replicas.logs.expire_producers, off_loop=True)),
            asyncio.create_task(self._every(60000, self.replicas.logs.write_recovery_checkpoint, off_loop=True)),
            asyncio.create_task(self._every(
                self.config.settings.transaction_abort_timed_out_transaction_cleanup_interval_ms,
                self.txn.abort_timed_out)),
            asyncio.create_task(self._every(3600000, self.txn.expire_ids)),
            asyncio.create_task(self._every(self.config.settings.offsets_retention_check_interval_ms,
                                            self._expire_offsets)),
        ]
        if self.cluster is not None:  # Kafka's isr-expiration and highwatermark-checkpoint tasks
            self._tasks.append(asyncio.create_task(self._every(
                max(self.config.settings.replica_lag_time_max_ms // 2, 1), self.replicas.maybe_shrink_isrs)))
            self._tasks.append(asyncio.create_task(self._every(
                self.config.settings.replica_high_watermark_checkpoint_interval_ms,
                self.replicas.checkpoint_high_watermarks, off_loop=True)))

    async def _every(self, interval_ms: int, job: Callable[[], Any], *, off_loop: bool = False) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                if off_loop:
                    await loop.run_in_executor(self.replicas.writers, job)
                else:
                    job()
            except Exception:
                log.exception("background job failed", job=getattr(job, "__name__", repr(job)))

    def _expire_offsets(self) -> None:
        """Committed offsets past ``offsets.retention`` (KIP-211; docs/BROKER.md "Offsets retention").
        On the event loop: it reads the group coordinator's state, and its tombstones go to
        ``__consumer_offsets`` as the coordinator's own appends do."""
        settings = self.config.settings
        retention_ms = (settings.offsets_retention_ms if settings.offsets_retention_ms >= 0
                        else settings.offsets_retention_minutes * 60000)
        expired = self.offsets.expire(self.groups.group_ids(), int(time.time() * 1000), retention_ms,
                                      self.groups.offset_expiry)
        for entry in expired:
            if entry.group_removed:
                self.groups.remove_expired_group(entry.group)
        if expired:
            log.info("committed offsets expired", groups=len(expired),
                     partitions=sum(len(e.partitions) for e in expired),
                     groups_removed=sum(e.group_removed for e in expired), retention_ms=retention_ms)

    def _flush_due(self) -> None:
        self.replicas.logs.flush_due(now_ms())

    async def join_cluster(self) -> None:
        """Cluster mode: register in ZooKeeper and take part in controller election (after the
        listeners are bound: the registration advertises them). A no-op on a single node."""
        if self.cluster is not None:
            await self.cluster.join()

    async def drain_cluster(self) -> None:
        """Cluster mode: controlled shutdown (leaderships move away while this broker still
        serves and is registered). A no-op on a single node."""
        if self.cluster is not None:
            try:
                await self.cluster.drain()
            except Exception:
                log.exception("controlled shutdown failed; the leaderships move when the session ends")

    async def leave_cluster(self) -> None:
        """Cluster mode: controlled shutdown if :meth:`drain_cluster` did not run, then the session
        closes. A no-op on a single node."""
        if self.cluster is not None:
            try:
                await self.cluster.leave()
            except Exception:
                log.exception("leaving the cluster failed; the session ends with the process")

    @property
    def stopping(self) -> bool:
        """Shutting down: long polls and held produces return at once."""
        return self.replicas.stopping

    def begin_stop(self) -> None:
        """Answer every long-polling fetch now (the first step of a shutdown)."""
        self.replicas.begin_shutdown()

    async def stop(self) -> None:
        self.begin_stop()
        if self.loader is not None:
            self.loader.cancel()
        self.txn.cancel_markers()
        if self.cluster is not None:
            await self.cluster.stop_fetchers()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.groups.stop()
        if self._metrics is not None:  # shutdown() waits for the serving thread's next poll
            await asyncio.get_running_loop().run_in_executor(None, self._metrics.shutdown)
            self._metrics.server_close()
        await asyncio.get_running_loop().run_in_executor(None, self.replicas.logs.stop_cleaner)
        self.replicas.close()
        if self.security is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.security.close)

    # -- request plumbing --------------------------------------------------------------------

    async def handle(self, req: DecodedRequest, client_host: str) -> ApiMessage | list[Chunk] | None:
        set_client_host(client_host)
        handler = APIS[req.api_key].handler
        assert handler is not None, f"api key {req.api_key} is served by the connection"
        return await handler(self.context, req)


def refuse_local_security_files(data_dir: Path) -> None:
    """Cluster mode keeps ACLs and users in ZooKeeper only (Kafka has no such files): a data dir's
    ``__acls.json`` or ``__scram_credentials.json`` is a startup error rather than a silent second
    source of truth (or a silent import that could give back a right revoked elsewhere)."""
    for name, what, command in (
            (ACL_FILE, "ACLs", "ads-broker acls add --zookeeper-connect ..."),
            (CREDENTIALS_FILE, "SCRAM credentials", "ads-broker users add --zookeeper-connect ...")):
        path = data_dir / name
        if path.exists():
            raise ConfigError(
                f"{path}: {what} of a single-node broker, but zookeeper.connect is set and in cluster mode {what} "
                f"live in ZooKeeper, shared by every broker. Review the file, create what you want to keep with "
                f"`{command}` (or `ads-broker {'acls' if name == ACL_FILE else 'users'} migrate --data-dir "
                f"{data_dir} --zookeeper-connect ...`), then delete the file; docs/SECURITY.md \"Cluster mode\"")


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)
