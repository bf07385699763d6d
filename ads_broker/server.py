"""The network layer: an asyncio TCP server speaking Kafka's framing.

Like Kafka, each connection handles one request at a time and answers in order (a client may
pipeline; responses go back in request order). Record bytes in Fetch responses go from the
segment files to the socket with ``sendfile``; large slices only, since for a few kilobytes one
``pread`` plus ``write`` costs less than handing the socket to the kernel. A TLS listener cannot
``sendfile``: its slices are read in 1 MiB pieces off the event loop and written encrypted.

Graceful shutdown (SIGTERM/SIGINT): stop accepting, wake long-polling fetches, let in-flight
requests finish, close connections, then flush and close every log and write the clean-shutdown
marker.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import errno
import os
import signal
import ssl
import struct
import time
from pathlib import Path
from typing import Any

import structlog
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from ads_broker.broker import Broker
from ads_broker.config import BrokerConfig
from ads_broker.errors import (
    ILLEGAL_SASL_STATE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
    UNSUPPORTED_VERSION,
)
from ads_broker.exceptions import BrokerError, ConfigError, MalformedFrameError
from ads_broker.faults import BrokerFaults
from ads_broker.protocol.apis import api_versions_response, decode_request
from ads_broker.protocol.codec import (
    API_VERSIONS_KEY,
    ARRAY_BUDGET,
    Chunk,
    DecodedRequest,
    SendfileSlice,
    encode_response,
    encodes_slowly,
)
from ads_broker.protocol.context import flush_rejections
from ads_broker.rejections import RejectionLog
from ads_broker.request_metrics import (
    AUTH_FAILED,
    AUTH_NO_REAUTH,
    AUTH_SUCCEEDED,
    EXPIRED_KILLED,
    REAUTH_FAILED,
    REAUTH_SUCCEEDED,
    REJECT_MAX_CONNECTIONS,
    REJECT_MAX_CONNECTIONS_PER_IP,
    REJECT_SHUTTING_DOWN,
)
from ads_broker.security.context import ANONYMOUS, Session, set_session
from ads_broker.security.listeners import ListenerSpec, resolve_listeners
from ads_broker.security.oauthbearer import (
    OAUTHBEARER,
    JwksCache,
    OAuthBearerSaslServer,
    TokenValidator,
    validator_for_listener,
)
from ads_broker.security.reauth import MIN_REAUTH_INTERVAL_S
from ads_broker.security.scram import MECHANISMS, SaslAuthenticationError, SaslServer
from ads_broker.security.tls import (
    handshake_failure_reason,
    principal_from_peercert,
    server_context,
    start_tls_server,
)

log = structlog.get_logger("ads_broker.server")
SENDFILE_MIN_BYTES = 64 * 1024
#: An encoded answer at least this large is written as it is, not gathered with the others first.
DIRECT_WRITE_BYTES = 1 << 20
TLS_COPY_BYTES = 1 << 20  # a slice's piece read at once for a TLS listener (see Connection._write_copied)
TLS_HANDSHAKE_TIMEOUT_S = 10.0
SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
#: accept() errors that mean "out of a resource" (file descriptors, socket buffers): asyncio then
#: takes the listening socket out of the selector and retries after ``ACCEPT_RETRY_DELAY`` (1 s)
ACCEPT_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def reauthentication_latency_ms(started_ns: int) -> int:
    """Milliseconds since ``started_ns`` as Kafka's ``ReauthInfo.reauthenticationLatencyMs`` rounds
    them: 0 only for no latency at all, else at least 1."""
    nanos = time.monotonic_ns() - started_ns
    return 0 if nanos <= 0 else max(1, round(nanos / 1_000_000))


class MemoryPool:
    """The budget for bytes of received requests, shared by every connection (Kafka's
    ``queued.max.request.bytes`` and its ``SimpleMemoryPool`` in non-strict mode).

    Invariant: ``used`` counts every byte of frame buffers allocated for requests not yet answered
    (complete frames waiting or being handled, and large frames being received). A receiver asks
    before growing a buffer; while the pool is exhausted its connection stops reading and waits in
    FIFO order, and is resumed as handled requests give their bytes back. Like Kafka's pool, a grant
    is made while *any* budget is left, so one request larger than the whole budget still goes through.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget  # -1: unbounded
        self.used = 0
        self._waiting: collections.deque[FrameReceiver] = collections.deque()

    @property
    def exhausted(self) -> bool:
        return 0 <= self.budget <= self.used

    def reserve(self, nbytes: int) -> None:
        self.used += nbytes

    def release(self, nbytes: int) -> None:
        self.used -= nbytes
        while self._waiting and not self.exhausted:
            self._waiting.popleft().memory_available()

    def wait(self, receiver: FrameReceiver) -> None:
        if receiver not in self._waiting:
            self._waiting.append(receiver)

    def forget(self, receiver: FrameReceiver) -> None:
        with contextlib.suppress(ValueError):
            self._waiting.remove(receiver)


class FrameReceiver(asyncio.BufferedProtocol):
    """Kafka framing with few copies and memory that follows the bytes actually received.

    The kernel reads into a scratch buffer shared by every connection (the loop reads one socket
    at a time), so an idle connection owns no read buffer. Small frames are copied out of it; a
    large frame gets its own buffer, which the kernel then fills in place and which grows (doubling,
    as its bytes arrive, never from the length prefix alone: a
    prefix claiming 100 MiB costs nothing until 100 MiB have been sent. Every frame buffer is
    charged to the server's :class:`MemoryPool`; while it is exhausted reading pauses.

    Complete frames are queued for the connection's request loop; reading also pauses while too
    many are waiting, so a client pipelining faster than we answer cannot grow memory without bound.
    The receiver holds no reference to its :class:`Connection` (no cycle: a closed connection's
    buffers are freed by reference counting, not by the cyclic GC).
    """

    SCRATCH_BUFFER = 64 * 1024
    LARGE_FRAME = SCRATCH_BUFFER // 2
    MAX_QUEUED_FRAMES = 16

    def __init__(self, server: BrokerServer, listener: ListenerSpec) -> None:
        self.server = server
        self.listener = listener
        #: The budget new frames are charged to: on a SASL listener, until the client has
        #: authenticated, the pre-authentication pool (anonymous clients never hold the bytes that
        #: authenticated clients' requests need; review s13-2, H1), then the request pool.
        self.pool = server.preauth_pool if listener.uses_sasl else server.pool
        #: The pool each queued frame was charged to, in the order of :attr:`frames`.
        self.frame_pools: collections.deque[MemoryPool] = collections.deque()
        self._frame_pool = self.pool  # what the large frame being received is charged to
        settings = server.broker.config.settings
        #: Before authentication a SASL listener reads frames up to ``sasl.server.max.receive.size``
        #: only (Kafka's SaslServerAuthenticator), so an anonymous client cannot make the broker
        #: buffer 100 MB; :meth:`authenticated` raises it to ``socket.request.max.bytes``.
        self.max_frame = settings.sasl_server_max_receive_size if listener.uses_sasl else \
            settings.socket_request_max_bytes
        self.frames: asyncio.Queue[bytearray | None] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self.peer_ip = ""
        self.last_active = time.monotonic()
        self.tls_principal: str | None = None
        self._pending = bytearray()  # bytes of an incomplete small frame (or of a length prefix)
        self._frame: bytearray | None = None  # a large frame being received in place
        self._frame_size = 0
        self._frame_got = 0
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._paused_for: set[str] = set()
        self.closed = False
        self.reading_stopped = False  # a bad frame size: no more frames, close once the queued ones are answered
        self.frame_too_large = False  # why reading stopped: a length prefix over max_frame
        #: After authentication: a SaslHandshake frame may begin a re-authentication, after which
        #: Kafka reads with sasl.server.max.receive.size; so no frame behind it is cut until the
        #: connection says which limit applies (:meth:`release`). During a re-authentication every
        #: frame is held that way (Kafka's authenticator reads one frame at a time).
        self.hold_handshakes = False
        self.one_at_a_time = False
        self.held = False
        self.held_frame: bytearray | None = None  # the frame whose handling ends the hold
        #: Counted in by :meth:`BrokerServer.admit` already: on a TLS listener at accept, before the
        #: handshake (Kafka's Acceptor counts a connection before any TLS byte), so
        #: :meth:`connection_made` after the handshake does not count it again.
        self.admitted = False

    # -- asyncio.BufferedProtocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "unknown"
        self.peer_ip = str(peer[0]) if peer else ""
        # On SSL listeners connection_made comes after the handshake: the client certificate (if
        # any, and verified) is known here.
        self.tls_principal = principal_from_peercert(transport.get_extra_info("peercert"))
        reason = None if self.admitted else self.server.admit(self)
        if reason is not None:
            self.server.rejections.warn(self.peer, f"closing connection: {reason}", host=self.peer_ip,
                                        listener=self.listener.name)
            self.closed = True
            transport.abort()
            return
        connection = Connection(self.server, self)
        self.server.connections.add(connection)
        connection.task = asyncio.ensure_future(connection.serve())

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            if self._frame_got == len(self._frame):
                # Asked for room while paused for memory (a TLS transport may still hold decrypted
                # bytes): grow past the budget rather than hand out an empty buffer.
                self._grow_frame(force=True)
            return memoryview(self._frame)[self._frame_got:]
        return self.server.scratch

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        if self.reading_stopped:
            return  # bytes a TLS transport had already decrypted after pause_reading: dropped
        if self._frame is not None:
            self._frame_got += nbytes
            if self._frame_got == self._frame_size:
                frame, self._frame = self._frame, None
                self._deliver(frame, self._frame_pool)
            elif self._frame_got == len(self._frame):
                self._grow_frame()
            return
        data = self.server.scratch[:nbytes]
        if self.held:  # bytes a transport delivers after pause_reading: kept uncut until release()
            self._pending += data
            return
        if self._pending:
            self._pending += data
            data = memoryview(self._pending)
        self._cut_frames(data)

    def authenticated(self) -> None:
        """The client (re-)authenticated: frames up to ``socket.request.max.bytes`` from now on, a
        SaslHandshake held until the connection decides whether it begins a re-authentication."""
        self.max_frame = self.server.broker.config.settings.socket_request_max_bytes
        self.hold_handshakes = self.listener.uses_sasl
        self.one_at_a_time = False
        self._switch_pool(self.server.pool)

    def _switch_pool(self, pool: MemoryPool) -> None:
        """Charge frames begun from now on to ``pool`` (a frame being received stays with its own)."""
        if pool is self.pool:
            return
        if self._frame is None:  # a large frame waiting for its pool's bytes keeps waiting there
            self.pool.forget(self)
            self._resume("memory")
        self.pool = pool

    def release(self, max_frame: int, *, one_at_a_time: bool) -> None:
        """The held frame was handled: cut what follows it with ``max_frame`` (Kafka: the
        authenticator's ``sasl.server.max.receive.size`` during a re-authentication, else
        ``socket.request.max.bytes``) and read on."""
        self.max_frame = max_frame
        self.one_at_a_time = one_at_a_time
        self.held, self.held_frame = False, None
        if one_at_a_time:  # a re-authentication: its frames are not the session's requests
            self._switch_pool(self.server.preauth_pool)
        if self._pending and not self.reading_stopped and not self.closed:
            self._cut_frames(memoryview(self._pending))
        if not self.held:
            self._resume("held")

    def _cut_frames(self, data: memoryview) -> None:
        pos, have = 0, len(data)
        while have - pos >= 4 and not self.held:
            (size,) = struct.unpack_from(">i", data, pos)
            if size < 0 or size > self.max_frame:
                self.server.rejections.warn(self.peer, "closing connection: bad frame size", size=size,
                                            max=self.max_frame)
                self.frame_too_large = True
                self._stop_reading()
                return
            available = have - pos - 4
            if available >= size:
                self._charge(size)
                self._deliver(bytearray(data[pos + 4:pos + 4 + size]), self.pool)
                pos += 4 + size
                continue
            if size > self.LARGE_FRAME:
                # Large frame: its own buffer, sized by what has arrived, filled in place from now on.
                capacity = min(size, max(available, self.SCRATCH_BUFFER))
                self._charge(capacity)
                self._frame_pool = self.pool
                frame = bytearray(capacity)
                frame[:available] = data[pos + 4:have]
                self._frame, self._frame_size, self._frame_got = frame, size, available
                pos = have
                if available == capacity:
                    self._grow_frame()
            break
        self._pending = bytearray(data[pos:have])
        self._check_pool()

    def _stop_reading(self) -> None:
        """Read nothing more, but let the requests already queued be handled and answered; the
        end-of-frames marker queued behind them makes the request loop close the connection.
        (Kafka mutes a connection while a request is in flight, so it answers every request it
        read before it reads, and fails on, the next size.)"""
        self.reading_stopped = True
        self._pending = bytearray()
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self.frames.put_nowait(None)

    def _charge(self, nbytes: int) -> None:
        self.pool.reserve(nbytes)

    def _grow_frame(self, force: bool = False) -> None:
        """The large frame's buffer is full but the frame is not: grow it if the pool allows,
        else stop reading until it does (:meth:`memory_available`)."""
        assert self._frame is not None
        pool = self._frame_pool
        if pool.exhausted and not force:
            self._pause("memory")
            pool.wait(self)
            return
        # The transport still holds a view of the old buffer (no resizing in place): copy into a
        # buffer twice as large. Copies add up to at most the frame's size.
        old = self._frame
        capacity = min(self._frame_size, 2 * len(old))
        pool.reserve(capacity)
        frame = bytearray(capacity)
        frame[:self._frame_got] = old
        self._frame = frame
        pool.release(len(old))

    def _check_pool(self) -> None:
        if self.pool.exhausted and not self.closed:
            self._pause("memory")
            self.pool.wait(self)

    def memory_available(self) -> None:
        """Called by the pool when bytes were given back: grow the waiting frame and read again."""
        if self.closed or self.reading_stopped:
            return
        if self._frame is not None and self._frame_got == len(self._frame):
            self._grow_frame()
            if "memory" in self._paused_for and self._frame_got == len(self._frame):
                return  # still waiting (the pool ran dry again)
        self._resume("memory")

    def _deliver(self, frame: bytearray, pool: MemoryPool) -> None:
        self.frame_pools.append(pool)
        self.frames.put_nowait(frame)
        if self.one_at_a_time or (self.hold_handshakes and len(frame) >= 2 and frame[0] == 0
                                  and frame[1] == SASL_HANDSHAKE_KEY):  # the api key, big-endian
            self.held, self.held_frame = True, frame
            self._pause("held")
        if self.frames.qsize() >= self.MAX_QUEUED_FRAMES:
            self._pause("queue")

    def next_frame_taken(self) -> None:
        if self.frames.qsize() < self.MAX_QUEUED_FRAMES // 2:
            self._resume("queue")

    def _pause(self, reason: str) -> None:
        if not self._paused_for and self.transport is not None and not self.closed and not self.reading_stopped:
            self.transport.pause_reading()
        self._paused_for.add(reason)

    def _resume(self, reason: str) -> None:
        if reason not in self._paused_for:
            return
        self._paused_for.discard(reason)
        if not self._paused_for and self.transport is not None and not self.closed and not self.reading_stopped:
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        if self._frame is not None or self._pending:
            self.server.rejections.warn(self.peer, "closing connection: truncated frame")
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        self._frame_pool.forget(self)
        if self._frame is not None:
            frame, self._frame = self._frame, None
            self._frame_pool.release(len(frame))
        self._pending = bytearray()
        self.frames.put_nowait(None)
        self._can_write.set()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # -- used by Connection ------------------------------------------------------------------

    async def drain(self) -> None:
        await self._can_write.wait()
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("connection lost")
        self.last_active = time.monotonic()

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class TlsAcceptor(asyncio.Protocol):
    """The first protocol of a connection on an SSL or SASL_SSL listener: runs the TLS handshake
    (``loop.start_tls``), then hands the TLS transport to a :class:`FrameReceiver`.

    Doing the handshake here rather than in ``create_server(ssl=...)`` means a failed handshake
    (no or an untrusted client certificate, wrong protocol, timeout) is logged like every other
    rejection, naming the client; asyncio itself only logs those in debug mode.
    """

    def __init__(self, server: BrokerServer, listener: ListenerSpec) -> None:
        self.server = server
        self.listener = listener
        self.task: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Count the connection in at accept, as Kafka's Acceptor does (``max.connections``,
        ``max.connections.per.ip``): connections still in their handshake hold a file descriptor
        each, and were not limited at all when only the handshake's end counted them."""
        assert isinstance(transport, asyncio.Transport)
        receiver = FrameReceiver(self.server, self.listener)
        peer = transport.get_extra_info("peername")
        receiver.peer = f"{peer[0]}:{peer[1]}" if peer else "unknown"
        receiver.peer_ip = str(peer[0]) if peer else ""
        reason = self.server.admit(receiver)
        if reason is not None:
            self.server.rejections.warn(receiver.peer, f"closing connection: {reason}", host=receiver.peer_ip,
                                        listener=self.listener.name)
            transport.abort()
            return
        receiver.admitted = True
        self.task = asyncio.ensure_future(self._handshake(transport, receiver))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def _handshake(self, transport: asyncio.Transport, receiver: FrameReceiver) -> None:
        context = self.server.ssl_contexts[self.listener.name]
        host, client = receiver.peer_ip or "unknown", receiver.peer
        try:
            # Not loop.start_tls: a refused certificate must reach the client as a TLS alert.
            tls = await start_tls_server(transport, receiver, context, TLS_HANDSHAKE_TIMEOUT_S)
        except asyncio.CancelledError:
            self.server.disconnected(receiver)
            transport.abort()
            raise
        except (OSError, TimeoutError, ConnectionError) as e:
            self.server.disconnected(receiver)
            if isinstance(e, ssl.SSLError):
                # Kafka's SslAuthenticationException: counted as a failed authentication (a client that
                # disconnects or times out during the handshake is not, as in Kafka's Selector).
                self.server.broker.metrics.authentication(self.listener.name, AUTH_FAILED)
            why = handshake_failure_reason(e)
            self.server.rejections.warn(client, "closing connection: TLS handshake failed", host=host,
                                        aggregate_as=f"TLS handshake failed: {why}", listener=self.listener.name,
                                        reason=why, error=f"{type(e).__name__}: {e}"[:300])
            transport.abort()
            return
        except BaseException:
            self.server.disconnected(receiver)
            raise
        if tls is None:  # the client went away during the handshake
            self.server.disconnected(receiver)
            transport.abort()
            return
        receiver.connection_made(tls)


class Connection:
    """One client connection: requests handled one at a time and answered in order.

    On a SASL listener the connection starts unauthenticated: only ApiVersions, SaslHandshake and
    SaslAuthenticate are served, anything else closes it (Kafka's rule), and a failed
    authentication is answered with SASL_AUTHENTICATION_FAILED and closes it too. The principal
    (SASL user, client certificate DN, or ANONYMOUS) is published to the handlers through
    :mod:`ads_broker.security.context`.

    Re-authentication (KIP-368, Kafka's ``KafkaChannel`` and ``SaslServerAuthenticator``): with a
    positive ``connections.max.reauth.ms`` for the listener and mechanism, a SASL login gets a
    session that ends that many ms after it completed (told to the client in SaslAuthenticate
    v1+'s ``session_lifetime_ms``). A SaslHandshake on the authenticated connection then starts a
    re-authentication (at most one a second); it must name the session's mechanism and end with
    the same principal, else the connection is closed. A request arriving after the session ended
    closes the connection instead of being handled. Without a session end a SaslHandshake after
    authentication is answered ILLEGAL_SASL_STATE, as before.
    """

    def __init__(self, server: BrokerServer, receiver: FrameReceiver) -> None:
        self.server = server
        self.receiver = receiver
        self.peer = receiver.peer
        self.busy = False
        self.task: asyncio.Future[None] | None = None
        self.listener = receiver.listener
        self.authenticated = not self.listener.uses_sasl
        self.sasl: SaslServer | OAuthBearerSaslServer | None = None
        #: After a SaslHandshake v0 the tokens come as raw size-prefixed frames (no request header),
        #: until the exchange completes (Kafka's enableKafkaSaslAuthenticateHeaders(false)).
        self.sasl_raw_tokens = False
        self.principal = receiver.tls_principal or ANONYMOUS
        #: The authenticated SASL session: its mechanism, and when it ends (time.monotonic(); None:
        #: never, connections.max.reauth.ms is 0 for it).
        self.session_mechanism: str | None = None
        self.session_expires: float | None = None
        self.last_reauth_start = 0.0
        #: Whether the client sent a SaslAuthenticate v1+ (Kafka's connectedClientSupportsReauthentication).
        self.client_supports_reauth = False
        #: During a re-authentication: the (mechanism, principal) the new login must keep.
        self.reauth_from: tuple[str, str] | None = None
        #: A re-authentication handshake named another mechanism: the next frame closes the connection.
        self.reauth_bad_mechanism: str | None = None
        #: time.monotonic_ns() of the SaslHandshake that began the running re-authentication
        #: (Kafka's reauthenticationBeginNanos), for the reauthentication-latency metrics.
        self.reauth_started_ns = 0
        if self.authenticated:
            # Kafka's Selector counts every channel that becomes ready (PLAINTEXT, SSL after its handshake).
            metrics = server.broker.metrics
            metrics.authentication(self.listener.name, AUTH_SUCCEEDED)
            metrics.authentication(self.listener.name, AUTH_NO_REAUTH)

    def _publish(self, principal: str) -> None:
        set_session(Session(principal=principal, listener=self.listener.name,
                            security_protocol=self.listener.security_protocol,
                            advertised=(self.listener.advertised_host, self.listener.advertised_port),
                            client_host=self.peer))

    def close(self) -> None:
        self.receiver._close()

    async def serve(self) -> None:
        frames = self.receiver.frames
        self._publish(self.principal)
        try:
            while not self.server.closing:
                frame = await frames.get()
                if frame is None:
                    if self.receiver.frame_too_large and not self.authenticated:
                        # Kafka's authenticator: "Failing SASL authentication due to invalid receive size"
                        self._count_auth_failure()
                    return
                if self.server.closing:
                    # Shutting down (Kafka's stopProcessingRequests): a request not started is not
                    # served; the connection closes and the client retries at another broker.
                    self.receiver.frame_pools.popleft().release(len(frame))
                    return
                self.receiver.next_frame_taken()
                self.busy = True
                size = len(frame)
                pool = self.receiver.frame_pools.popleft()
                try:
                    if not await self._handle_frame(bytes(frame) if size < 4096 else frame):
                        return
                    if self.receiver.held and self.receiver.held_frame is frame:
                        self._release_receiver()  # (not after a frame queued before the held one)
                except ConnectionError:
                    return  # the client went away while we answered
                finally:
                    self.busy = False
                    frame = None  # free it before waiting for the next one
                    pool.release(size)
        finally:
            self.close()
            while not frames.empty():  # frames queued behind the one that closed the connection
                queued = frames.get_nowait()
                if queued is not None:
                    self.receiver.frame_pools.popleft().release(len(queued))
            self.server.connections.discard(self)
            self.server.disconnected(self.receiver)

    async def _handle_frame(self, frame: bytes | bytearray) -> bool:
        """Decode, dispatch and answer one request; False closes the connection."""
        if self.sasl_raw_tokens:
            return await self._raw_sasl_token(bytes(frame))
        if self.reauth_bad_mechanism is not None:
            # Kafka's REAUTH_BAD_MECHANISM: whatever comes next fails the re-authentication, unanswered.
            self._auth_failed("SASL authentication failed", reason=self.reauth_bad_mechanism)
            return False
        started = time.perf_counter()
        try:
            req = decode_request(frame)
        except MalformedFrameError as e:
            self.server.rejections.warn(self.peer, "closing connection: malformed request", reason=str(e))
            return False
        if req.body is None:
            if req.api_key == API_VERSIONS_KEY:
                # Kafka answers an unsupported ApiVersions with a v0 response listing what it supports.
                await self._send([encode_response(api_versions_response(UNSUPPORTED_VERSION), 0, req.correlation_id)])
                return True
            self.server.rejections.warn(self.peer, "closing connection: unsupported api version",
                                        api_key=req.api_key, api_version=req.api_version)
            return False
        if req.api_key == SASL_HANDSHAKE_KEY and self._begin_reauthentication():
            return await self._sasl_request(req)
        if self.authenticated and self.session_expires is not None and time.monotonic() > self.session_expires:
            # Kafka's SocketServer: "Disconnecting expired channel", counted in expired-connections-killed-count.
            self.server.broker.metrics.authentication(self.listener.name, EXPIRED_KILLED)
            self.server.rejections.warn(self.peer, "closing connection: SASL session expired without re-authentication",
                                        listener=self.listener.name, principal=self.principal[:128],
                                        api_key=req.api_key, client_id=req.client_id)
            return False
        if req.api_key in (SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY):
            return await self._sasl_request(req)
        if not self.authenticated and (req.api_key != API_VERSIONS_KEY or self.reauth_from is not None):
            what = "during SASL re-authentication" if self.reauth_from is not None else "before SASL authentication"
            self.server.rejections.warn(self.peer, f"closing connection: request {what}",
                                        listener=self.listener.name, api_key=req.api_key, client_id=req.client_id)
            return False
        if not self.server.serving.is_set() and req.api_key != API_VERSIONS_KEY:
            await self.server.serving.wait()  # joining the cluster (BrokerServer.serving)
            if self.server.closing:
                return False
        try:
            response = await self.server.broker.handle(req, self.peer)
        except ConnectionAbortedError as e:
            log.warning("closing connection", client=self.peer, client_id=req.client_id, reason=str(e))
            return False
        except Exception:
            log.exception("closing connection: request handler failed", client=self.peer, client_id=req.client_id,
                          api_key=req.api_key, api_version=req.api_version)
            return False
        if response is not None:
            if isinstance(response, ApiMessage):
                try:
                    chunks: list[Chunk] = [await self.server.encode(response, req)]
                except Exception:  # a response the schema cannot carry: a bug, but one connection's
                    log.exception("closing connection: response encoding failed", client=self.peer,
                                  client_id=req.client_id, api_key=req.api_key, api_version=req.api_version)
                    return False
            else:
                chunks = response
            await self._send(chunks)
        self.server.broker.metrics.request_done(req, response, started)  # docs/BROKER.md, "Metrics"
        return True

    async def _sasl_request(self, req: DecodedRequest) -> bool:
        """SaslHandshake and SaslAuthenticate, as Kafka's SaslServerAuthenticator serves them (also
        during a re-authentication, which :meth:`_begin_reauthentication` started)."""
        mechanisms = self.server.sasl_mechanisms[self.listener.name]
        if req.api_key == SASL_HANDSHAKE_KEY:
            if self.authenticated or self.sasl is not None:
                # Kafka: a handshake on a non-SASL listener, or a second one, is ILLEGAL_SASL_STATE.
                await self._respond(req, SaslHandshakeResponse(error_code=ILLEGAL_SASL_STATE, mechanisms=mechanisms))
                return self.authenticated
            mechanism = str(req.body.mechanism)
            if mechanism not in mechanisms:
                # Not counted at a re-authentication, as in Kafka: its UnsupportedSaslMechanismException leaves
                # maybeBeginServerReauthentication before the Selector, which keeps the counts, sees it.
                self._auth_failed("unsupported SASL mechanism", counted=self.reauth_from is None,
                                  mechanism=mechanism[:64], enabled=mechanisms)
                await self._respond(req, SaslHandshakeResponse(error_code=UNSUPPORTED_SASL_MECHANISM,
                                                               mechanisms=mechanisms))
                return False
            await self._respond(req, SaslHandshakeResponse(error_code=0, mechanisms=mechanisms))
            if self.reauth_from is not None and mechanism != self.reauth_from[0]:
                # Kafka answers the handshake, then fails the re-authentication on the next frame.
                self.reauth_bad_mechanism = (f"SASL mechanism '{mechanism[:64]}' requested by client is not "
                                             f"supported for re-authentication of mechanism '{self.reauth_from[0]}'")
                return True
            reauthentication = self.reauth_from is not None
            self.sasl = (OAuthBearerSaslServer(self.server.oauth_validators[self.listener.name],
                                               reauthentication=reauthentication) if mechanism == OAUTHBEARER
                         else SaslServer(mechanism, self.server.credentials, reauthentication=reauthentication))
            self.sasl_raw_tokens = req.api_version == 0
            return True
        if self.authenticated or self.sasl is None:
            await self._respond(req, SaslAuthenticateResponse(
                error_code=ILLEGAL_SASL_STATE, error_message="SaslAuthenticate without a SaslHandshake",
                auth_bytes=b"", session_lifetime_ms=0))
            return self.authenticated
        if req.api_version > 0:
            self.client_supports_reauth = True
        try:
            token = await self._step(bytes(req.body.auth_bytes))
            lifetime_ms = self._login_completed() if self.sasl.principal is not None else 0
        except (SaslAuthenticationError, ConfigError) as e:
            self._auth_failed("SASL authentication failed", mechanism=self.sasl.mechanism, user=self.sasl.user[:128],
                              reason=self._failure_reason(e))
            await self._respond(req, SaslAuthenticateResponse(
                error_code=SASL_AUTHENTICATION_FAILED, error_message=str(e) if isinstance(e, SaslAuthenticationError)
                else "Authentication failed", auth_bytes=b"", session_lifetime_ms=0))
            return False
        await self._respond(req, SaslAuthenticateResponse(error_code=0, error_message=None, auth_bytes=token,
                                                          session_lifetime_ms=lifetime_ms))
        return True

    async def _raw_sasl_token(self, token: bytes) -> bool:
        """One SASL token after a v0 handshake; the answer is a raw size-prefixed frame (an empty
        one for PLAIN, as Kafka sends the mechanism's empty response). A failure has no error
        field to carry: the connection is closed without an answer, as Kafka does."""
        assert self.sasl is not None
        try:
            answer = await self._step(token)
            if self.sasl.principal is not None:
                self._login_completed(handshake_version=0)
        except (SaslAuthenticationError, ConfigError) as e:
            self._auth_failed("SASL authentication failed", mechanism=self.sasl.mechanism, user=self.sasl.user[:128],
                              reason=self._failure_reason(e), handshake_version=0)
            return False
        await self._send([len(answer).to_bytes(4, "big") + answer])
        return True

    async def _step(self, token: bytes) -> bytes:
        """One client token through the mechanism; OAUTHBEARER's may wait for a JWKS fetch (off the loop)."""
        assert self.sasl is not None
        if isinstance(self.sasl, OAuthBearerSaslServer):
            return await self.sasl.step(token)
        if self.sasl.mechanism == "PLAIN":
            # PLAIN derives the password's key (PBKDF2, thousands of iterations): on the loop, a few
            # clients retrying wrong passwords held every other connection (review s13, M1). On the
            # server's own small pool (hashlib releases the GIL), so attempts queue there instead.
            return await asyncio.get_running_loop().run_in_executor(self.server.sasl_executor, self.sasl.step, token)
        return self.sasl.step(token)

    def _failure_reason(self, e: Exception) -> str:
        """What the log line says: OAUTHBEARER's validation reason (the client's message is Kafka's
        generic text for a malformed one), else the exception's text. Never a token."""
        if isinstance(self.sasl, OAuthBearerSaslServer) and self.sasl.reason:
            return self.sasl.reason
        return str(e)

    def _begin_reauthentication(self) -> bool:
        """A SaslHandshake arrived: start a re-authentication if Kafka would
        (``KafkaChannel.maybeBeginServerReauthentication``): the connection is authenticated, its
        session has an end, and no re-authentication started in the last second."""
        if not self.authenticated or self.session_expires is None or self.session_mechanism is None:
            return False
        now = time.monotonic()
        if self.last_reauth_start and now - self.last_reauth_start < MIN_REAUTH_INTERVAL_S:
            return False
        self.last_reauth_start = now
        self.reauth_started_ns = time.monotonic_ns()
        self.reauth_from = (self.session_mechanism, self.principal)
        self.authenticated, self.sasl, self.sasl_raw_tokens = False, None, False
        return True

    def _login_completed(self, handshake_version: int = 1) -> int:
        """The SASL exchange authenticated :attr:`sasl`'s principal: start its session and return
        the session lifetime to tell the client (0: no end). A re-authentication must keep the
        principal (Kafka's ``ensurePrincipalUnchanged``), else SaslAuthenticationError."""
        assert self.sasl is not None and self.sasl.principal is not None
        principal, mechanism = self.sasl.principal, self.sasl.mechanism
        reauth = self.reauth_from
        if reauth is not None and principal != reauth[1]:
            raise SaslAuthenticationError(f"Cannot change principals during re-authentication from "
                                          f"{reauth[1].replace(':', '.', 1)}: {principal.replace(':', '.', 1)}")
        lifetime_ms, expires = self._session_lifetime_ms(mechanism)
        self.session_expires = time.monotonic() + lifetime_ms / 1000 if expires else None
        self.session_mechanism, self.principal = mechanism, principal
        self.authenticated, self.sasl_raw_tokens, self.reauth_from = True, False, None
        metrics = self.server.broker.metrics
        self.receiver.authenticated()
        if reauth is not None:
            metrics.authentication(self.listener.name, REAUTH_SUCCEEDED)
            metrics.reauthentication_latency(self.listener.name, reauthentication_latency_ms(self.reauth_started_ns))
            log.debug("re-authenticated", client=self.peer, listener=self.listener.name, principal=principal,
                      session_lifetime_ms=lifetime_ms)
            return lifetime_ms
        metrics.authentication(self.listener.name, AUTH_SUCCEEDED)
        if not self.client_supports_reauth:
            metrics.authentication(self.listener.name, AUTH_NO_REAUTH)
        self._publish(principal)
        log.info("authenticated", client=self.peer, listener=self.listener.name, mechanism=mechanism,
                 principal=principal, session_lifetime_ms=lifetime_ms,
                 **({"handshake_version": 0} if handshake_version == 0 else {}))
        return lifetime_ms

    def _session_lifetime_ms(self, mechanism: str) -> tuple[int, bool]:
        """Kafka's ``ReauthInfo.calcCompletionTimesAndReturnSessionLifetimeMs``: the session ends
        at ``connections.max.reauth.ms`` (when positive) or when the credential expires
        (OAUTHBEARER's token ``exp``), whichever comes first; (lifetime ms, whether it ends)."""
        max_reauth_ms = self.server.config.connections_max_reauth_ms(self.listener.name, mechanism)
        expiration_ms = getattr(self.sasl, "credential_expiration_ms", None)
        if expiration_ms is None:
            return (max_reauth_ms, True) if max_reauth_ms > 0 else (0, False)
        left_ms = expiration_ms - int(time.time() * 1000)
        return max(0, min(left_ms, max_reauth_ms) if max_reauth_ms > 0 else left_ms), True

    def _release_receiver(self) -> None:
        """The receiver held the frames behind a SaslHandshake (or behind any frame during a
        re-authentication): cut them with the limit Kafka reads them with now."""
        settings = self.server.broker.config.settings
        reauthenticating = not self.authenticated and self.session_mechanism is not None
        self.receiver.release(settings.sasl_server_max_receive_size if not self.authenticated
                              else settings.socket_request_max_bytes, one_at_a_time=reauthenticating)

    def _count_auth_failure(self) -> None:
        """Kafka's Selector: a failure on a connection that authenticated before is a failed
        re-authentication, else a failed authentication."""
        reauth = self.session_mechanism is not None
        self.server.broker.metrics.authentication(self.listener.name, REAUTH_FAILED if reauth else AUTH_FAILED)

    def _auth_failed(self, event: str, *, counted: bool = True, **fields: Any) -> None:
        """A refused (re-)authentication: counted (unless ``counted`` is False), logged through the
        aggregated rejection log (no secret in ``fields``); the caller closes the connection."""
        reauth = self.reauth_from is not None or self.reauth_bad_mechanism is not None
        if counted:
            self.server.broker.metrics.authentication(self.listener.name, REAUTH_FAILED if reauth else AUTH_FAILED)
        if reauth:  # one line kind for every re-authentication failure, the cause as a field
            fields = {"cause": event, "principal": self.principal[:128], **fields}
            event = "SASL re-authentication failed"
        self.server.rejections.warn(self.peer, f"closing connection: {event}", listener=self.listener.name, **fields)

    async def _respond(self, req: DecodedRequest, response: ApiMessage) -> None:
        await self._send([encode_response(response, req.api_version, req.correlation_id)])

    async def _send(self, chunks: list[Chunk]) -> None:
        """Write a response; the slices' descriptors are closed on every path (they pin segment
        files that retention may already have deleted)."""
        loop = asyncio.get_running_loop()
        try:
            transport = self.receiver.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("connection lost")  # e.g. the client left during a long poll
            pending = bytearray()
            for chunk in chunks:
                if isinstance(chunk, bytes | bytearray):
                    if len(chunk) < DIRECT_WRITE_BYTES:
                        pending += chunk
                        continue
                    if pending:  # a large answer (86 MB for 600,000 record errors) is not copied twice more
                        transport.write(bytes(pending))
                        pending.clear()
                    transport.write(chunk)
                elif chunk.size < SENDFILE_MIN_BYTES:
                    pending += chunk.read()
                else:
                    if pending:
                        transport.write(bytes(pending))
                        pending.clear()
                    if self.listener.uses_tls:
                        await self._write_copied(loop, chunk)
                    else:
                        with os.fdopen(chunk.fd, "rb", closefd=False) as f:  # the slice's private fd
                            await loop.sendfile(transport, f, chunk.position, chunk.size)
            if pending:
                transport.write(bytes(pending))
            await self.receiver.drain()
        finally:
            for chunk in chunks:
                if isinstance(chunk, SendfileSlice):
                    os.close(chunk.fd)


    async def _write_copied(self, loop: asyncio.AbstractEventLoop, chunk: SendfileSlice) -> None:
        """A slice through a TLS transport, which cannot ``sendfile``: read in pieces of
        ``TLS_COPY_BYTES`` in the default executor (a cold page must not stall the event loop) and
        write each after the previous one drained, so a fetch holds at most one piece in memory.
        asyncio's own fallback for ``loop.sendfile`` does the same with 16 KiB pieces, one executor
        round trip each: it held TLS consume to a quarter of plaintext's (docs/BENCHMARKS.md)."""
        sent = 0
        while sent < chunk.size:
            want = min(TLS_COPY_BYTES, chunk.size - sent)
            data = await loop.run_in_executor(None, chunk.read, sent, want)
            await self.receiver.drain()
            self.receiver.transport.write(data)  # type: ignore[union-attr]
            sent += want


class BrokerServer:
    """Accepts connections on the listeners and enforces the connection limits: ``max.connections``
    and ``max.connections.per.ip`` (a connection over either is closed at accept), and
    ``connections.max.idle.ms`` (a connection with no traffic that long is closed)."""

    def __init__(self, data_dir: Path, config: BrokerConfig) -> None:
        self.broker = Broker(data_dir, config, BrokerFaults.from_env())
        self.config = config
        self.closing = False
        #: Set once the broker has joined its cluster (at once on a single node). Requests other than
        #: ApiVersions wait for it, as Kafka enables request processing only after the broker has
        #: registered: the listeners open first (the registration advertises the bound ports), and a
        #: Metadata answered in between said "no controller", which librdkafka's admin client took as
        #: a reason to wait for a controller until its request timed out. Also set by shutdown, so
        #: the waiting requests end (their connections close).
        self.serving = asyncio.Event()
        self.connections: set[Connection] = set()
        self.pool = MemoryPool(config.settings.queued_max_request_bytes)
        #: Frames of SASL connections not authenticated yet (each at most
        #: ``sasl.server.max.receive.size``): a budget of their own, the same size, so anonymous
        #: clients can exhaust only it (Kafka's authenticator reads them outside its memory pool).
        self.preauth_pool = MemoryPool(config.settings.queued_max_request_bytes)
        self.scratch = memoryview(bytearray(FrameReceiver.SCRATCH_BUFFER))
        self.rejections = RejectionLog()
        #: One thread for answers too large to encode on the loop (:meth:`encode`): its own, so they
        #: neither wait behind nor hold the default executor's work (TLS file reads); one, so two
        #: such answers do not both contend with the loop for the GIL.
        self.encoder = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-encoder")
        #: SASL/PLAIN password checks (key derivations), off the event loop and bounded.
        self.sasl_executor = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="sasl-plain")
        self.max_connections = config.settings.max_connections
        self.max_connections_per_ip = config.settings.max_connections_per_ip
        self.idle_s = config.settings.connections_max_idle_ms / 1000
        #: Kafka's ``ConnectionQuotas.protectedListener``: with more than one listener, connections on
        #: the inter-broker listener are admitted at ``max.connections`` (another listener's least
        #: recently active connection is closed instead), so clients cannot lock followers out.
        self.inter_broker_listener = (config.settings.inter_broker_listener_name.strip()
                                      or config.settings.security_inter_broker_protocol).upper()
        ARRAY_BUDGET.max_elements = config.settings.request_max_array_elements
        self.credentials = self.broker.credentials
        try:
            self.listener_specs = resolve_listeners(config.settings.listeners, config.settings.advertised_listeners,
                                                    config.settings.listener_security_protocol_map)
        except ValueError as e:
            raise ConfigError(f"listeners: {e}") from None
        # Per listener: the broker-wide ssl.* / sasl.enabled.mechanisms under its listener.name.<name>.* entries.
        self.sasl_mechanisms: dict[str, list[str]] = {}
        #: Per listener with OAUTHBEARER enabled: its token validator, and the JWKS caches to refresh.
        self.oauth_validators: dict[str, TokenValidator] = {}
        self.jwks_caches: list[JwksCache] = []
        self._jwks_tasks: list[asyncio.Task[None]] = []
        self.ssl_contexts: dict[str, ssl.SSLContext] = {}
        for spec in self.listener_specs:
            own = config.for_listener(spec.name).settings
            mechanisms = [m.strip() for m in own.sasl_enabled_mechanisms.split(",") if m.strip()]
            for mechanism in mechanisms:
                if mechanism not in MECHANISMS:
                    raise ConfigError(f"sasl.enabled.mechanisms: {mechanism!r} is not one of {', '.join(MECHANISMS)}")
            self.sasl_mechanisms[spec.name] = mechanisms
            if OAUTHBEARER in mechanisms and spec.uses_sasl:
                validator, cache = validator_for_listener(config, spec.name, log=log.warning)
                self.oauth_validators[spec.name] = validator
                if cache is None:
                    log.warning("OAUTHBEARER with the unsecured validator: unsigned tokens are accepted, anyone can "
                                "claim any principal (tests only)", listener=spec.name)
                else:
                    self.jwks_caches.append(cache)
            if spec.uses_tls:
                self.ssl_contexts[spec.name] = server_context(own)
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._receivers: set[FrameReceiver] = set()
        self._servers: list[asyncio.Server] = []
        self._reaper: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._shutdown_task: asyncio.Future[None] | None = None
        self._starting = False  # run_until_signalled: start-up in progress (a signal then defers the stop)
        self._stop_requested: str | None = None  # the signal received during start-up
        self._leaving = False
        self._accept_failures = 0  # failed accepts (out of fds) since connections were last accepted

    async def start(self) -> None:
        await self.broker.start()
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._on_loop_exception)
        for listener in self.listener_specs:
            self.broker.metrics.add_listener(listener.name)
            self._servers.append(await loop.create_server(
                lambda listener=listener: TlsAcceptor(self, listener) if listener.uses_tls
                else FrameReceiver(self, listener),
                listener.host or None, listener.port, reuse_address=True))
            log.info("ads-broker listening", listener=listener.name, protocol=listener.security_protocol,
                     listen=f"{listener.host}:{listener.port}",
                     advertised=f"{listener.advertised_host}:{listener.advertised_port}",
                     node_id=self.broker.node_id, data_dir=str(self.broker.replicas.data_dir))
        self._reaper = asyncio.create_task(self._reap_idle())
        self._jwks_tasks = [asyncio.create_task(cache.run()) for cache in self.jwks_caches]
        await self.broker.join_cluster()
        self.serving.set()

    def _on_loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        """Out of file descriptors, asyncio's accept loop fails up to 100 times per wake-up, logging
        a traceback for each, then pauses the listener for 1 s and tries again: while the process
        stays out of fds that was 100 tracebacks a second. Those failures go through the
        aggregated rejection log instead (one line per listener per interval, with a count);
        everything else goes to asyncio's default handler."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in ACCEPT_RESOURCE_ERRNOS and "accept" in str(
                context.get("message", "")):
            self._accept_failures += 1
            sock = context.get("socket")
            try:
                where = str(sock.getsockname()) if sock is not None else "unknown"  # type: ignore[attr-defined]
            except OSError:
                where = "unknown"
            self.rejections.warn(f"listener {where}", "accepting paused: out of resources", host=f"listener {where}",
                                 error=f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc.strerror}",
                                 retry_after_ms=1000, existing_connections=len(self._receivers),
                                 action="raise the file-descriptor limit (ulimit -n) or lower max.connections")
            return
        loop.default_exception_handler(context)

    def admit(self, receiver: FrameReceiver) -> str | None:
        """Count a new connection in, or the reason it is refused (then it is not counted)."""
        if self._accept_failures:
            log.warning("accepting connections again", failed_accepts=self._accept_failures)
            self._accept_failures = 0
        refused: tuple[str, str] | None = None
        protected = self._protected(receiver.listener)
        if self.closing:
            refused = REJECT_SHUTTING_DOWN, "broker is shutting down"
        elif len(self._receivers) >= self.max_connections and not protected:
            refused = REJECT_MAX_CONNECTIONS, f"too many connections (max.connections={self.max_connections})"
        elif self._per_ip[receiver.peer_ip] >= self.max_connections_per_ip:
            refused = REJECT_MAX_CONNECTIONS_PER_IP, ("too many connections from one address "
                                                      f"(max.connections.per.ip={self.max_connections_per_ip})")
        if refused is not None:
            self.broker.metrics.connection_rejected(receiver.listener.name, refused[0])
            return refused[1]
        self._receivers.add(receiver)
        self._per_ip[receiver.peer_ip] += 1
        self.broker.metrics.connection_opened(receiver.listener.name)
        if protected and len(self._receivers) > self.max_connections:
            self._close_least_recently_active()
        return None

    def _protected(self, listener: ListenerSpec) -> bool:
        return listener.name == self.inter_broker_listener and len(self.listener_specs) > 1

    def _close_least_recently_active(self) -> None:
        """Kafka's ``Processor.closeExcessConnections``: over ``max.connections`` after admitting an
        inter-broker connection, close the least recently active connection of another listener."""
        others = [c for c in self.connections if not self._protected(c.listener) and not c.receiver.closed]
        if not others:
            return
        victim = min(others, key=lambda c: (c.busy, c.receiver.last_active))
        self.rejections.warn(victim.peer, "closing connection: max.connections reached and an inter-broker "
                             "connection needs the slot", host=victim.receiver.peer_ip, listener=victim.listener.name,
                             max_connections=self.max_connections)
        victim.close()

    def disconnected(self, receiver: FrameReceiver) -> None:
        if receiver in self._receivers:
            self._receivers.discard(receiver)
            self.broker.metrics.connection_closed(receiver.listener.name)
            self._per_ip[receiver.peer_ip] -= 1
            if self._per_ip[receiver.peer_ip] <= 0:
                del self._per_ip[receiver.peer_ip]

    async def _reap_idle(self) -> None:
        """Close connections idle longer than connections.max.idle.ms; flush aggregated warnings."""
        interval = min(max(self.idle_s / 4, 0.05), 10.0)
        while True:
            await asyncio.sleep(interval)
            deadline = time.monotonic() - self.idle_s
            for conn in list(self.connections):
                if not conn.busy and conn.receiver.last_active < deadline:
                    log.debug("closing idle connection", client=conn.peer, idle_ms=int(self.idle_s * 1000))
                    conn.close()
            self.rejections.flush()
            flush_rejections()

    async def encode(self, response: ApiMessage, req: DecodedRequest) -> bytes:
        """``response`` framed for ``req``; one that would hold the loop long (:func:`encodes_slowly`:
        a Produce answer naming a great many refused records) is encoded on the encoder thread, so
        every other connection keeps being served meanwhile (hostile review F3)."""
        if not encodes_slowly(response):
            return encode_response(response, req.api_version, req.correlation_id)
        return await asyncio.get_running_loop().run_in_executor(
            self.encoder, encode_response, response, req.api_version, req.correlation_id)

    async def shutdown(self, reason: str) -> None:
        if self.closing or self._leaving:
            return
        self._leaving = True
        log.info("shutting down", reason=reason)
        # Cluster mode: the controller moves this broker's leaderships away while it still serves
        # (clients and followers follow the new leaders). The registration goes once requests have
        # stopped (below), as Kafka's shutdown closes its ZooKeeper session last: until then this
        # broker answers Metadata from the cluster's state, never LEADER_NOT_AVAILABLE.
        await self.broker.drain_cluster()
        self.closing = True
        self.serving.set()  # requests still waiting for the join end (closing: their connections close)
        for server in self._servers:
            server.close()
        if self._reaper is not None:
            self._reaper.cancel()
        for task in self._jwks_tasks:
            task.cancel()
        self.broker.begin_stop()
        # Idle connections close now, as Kafka's stopProcessingRequests closes every one: clients
        # go to the other brokers at once instead of asking this one, which left the cluster, for
        # metadata it no longer has (LEADER_NOT_AVAILABLE) until the busy connections finish.
        for conn in list(self.connections):
            if not conn.busy:
                conn.close()
        # Finish in-flight requests (bounded), then drop the remaining connections.
        for _ in range(100):
            if not any(c.busy for c in self.connections):
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()
        await self.broker.leave_cluster()
        self.rejections.flush()  # the suppressed counts: every rejection ends up counted in a line
        flush_rejections()
        try:
            await self.broker.stop()
        except Exception:
            # Without the marker the next start recovers every log: safe, only slower.
            log.exception("unclean shutdown: flushing or checkpointing failed")
        finally:
            self.encoder.shutdown(wait=False)
            self.sasl_executor.shutdown(wait=False)
            self._stopped.set()

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._starting:
            # Start-up is not cut short mid-step (a stray rename, a ZooKeeper registration, log
            # recovery): the broker stops gracefully once the step in progress ends (bounded: every
            # step of the join has a timeout). A second signal ends the process at once, as before.
            if self._stop_requested is not None:
                log.warning("second signal during start-up: exiting at once, without a clean shutdown",
                            signal=sig.name)
                os._exit(128 + int(sig))
            self._stop_requested = sig.name
            log.info("signal received during start-up: the broker stops gracefully once start-up ends",
                     signal=sig.name)
            return
        self._shutdown_task = asyncio.ensure_future(self.shutdown(sig.name))

    async def run_until_signalled(self) -> None:
        """Start, serve until SIGTERM/SIGINT, shut down gracefully. The handlers are installed before
        start-up, so a signal while the broker recovers its logs or joins its cluster is a graceful
        stop too (Kafka's shutdown hook is registered before ``KafkaServer.startup``); before
        2026-11-28 it killed the process there, leaving its ZooKeeper registration to expire and
        every log to recover again (review s12-2, L1)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        self._starting = True
        try:
            await self.start()
        except BrokerError:
            # E.g. ZooKeeper unreachable or another cluster's id: close the logs cleanly, then say why.
            self._starting = False
            await self.shutdown("start-up failed")
            raise
        self._starting = False
        if self._stop_requested is not None:
            self._shutdown_task = asyncio.ensure_future(self.shutdown(f"{self._stop_requested} during start-up"))
        await self._stopped.wait()
        log.info("stopped cleanly")
