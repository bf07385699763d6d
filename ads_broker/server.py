"""The network layer: an asyncio TCP server speaking Kafka's framing.

Like Kafka, each connection handles one request at a time and answers in order (a client may
pipeline; responses go back in request order). Record bytes in Fetch responses go from the
segment files to the socket with ``sendfile``; large slices only, since for a few kilobytes one
``pread`` plus ``write`` costs less than handing the socket to the kernel.

Graceful shutdown (SIGTERM/SIGINT): stop accepting, wake long-polling fetches, let in-flight
requests finish, close connections, then flush and close every log and write the clean-shutdown
marker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
from pathlib import Path

import structlog
from kafka.protocol.api_message import ApiMessage

from ads_broker.broker import Broker
from ads_broker.config import BrokerConfig
from ads_broker.exceptions import MalformedFrameError
from ads_broker.faults import BrokerFaults
from ads_broker.protocol.codec import API_VERSIONS_KEY, Chunk, SendfileSlice, decode_request, encode_response
from ads_broker.protocol.metadata import api_versions_response

log = structlog.get_logger("ads_broker.server")
SENDFILE_MIN_BYTES = 64 * 1024
UNSUPPORTED_VERSION = 35


class FrameReceiver(asyncio.BufferedProtocol):
    """Kafka framing with as few copies as possible: the kernel writes a large request's body
    straight into that frame's own buffer; small frames are cut out of a shared read buffer.

    Complete frames are queued for the connection's request loop; reading pauses while too many
    are waiting, so a client pipelining faster than we answer cannot grow memory without bound.
    """

    READ_BUFFER = 64 * 1024
    MAX_QUEUED_FRAMES = 16

    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.max_frame = int(server.broker.config["socket.request.max.bytes"])
        self.frames: asyncio.Queue[bytearray | None] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self._buf = bytearray(self.READ_BUFFER)
        self._view = memoryview(self._buf)
        self._have = 0  # bytes in _buf
        self._frame: bytearray | None = None  # a large frame being received in place
        self._frame_got = 0
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._paused_reading = False
        self.connection: Connection | None = None

    # -- asyncio.BufferedProtocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "unknown"
        self.connection = Connection(self.server, self)
        self.server.connections.add(self.connection)
        self.connection.task = asyncio.ensure_future(self.connection.serve())

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_got:]
        return self._view[self._have:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._frame_got += nbytes
            if self._frame_got == len(self._frame):
                self._deliver(self._frame)
                self._frame = None
            return
        self._have += nbytes
        self._cut_frames()

    def _cut_frames(self) -> None:
        pos = 0
        while self._have - pos >= 4:
            (size,) = struct.unpack_from(">i", self._buf, pos)
            if size < 0 or size > self.max_frame:
                log.warning("closing connection: bad frame size", client=self.peer, size=size, max=self.max_frame)
                self._close()
                return
            available = self._have - pos - 4
            if available >= size:
                self._deliver(bytearray(self._view[pos + 4:pos + 4 + size]))
                pos += 4 + size
                continue
            if size > self.READ_BUFFER // 2:
                # Large frame: receive the rest directly into its own buffer.
                frame = bytearray(size)
                frame[:available] = self._view[pos + 4:self._have]
                self._frame, self._frame_got = frame, available
                pos = self._have
            break
        remaining = self._have - pos
        if pos and remaining:
            self._buf[:remaining] = self._view[pos:self._have]
        self._have = remaining

    def _deliver(self, frame: bytearray) -> None:
        self.frames.put_nowait(frame)
        if self.frames.qsize() >= self.MAX_QUEUED_FRAMES and not self._paused_reading and self.transport:
            self._paused_reading = True
            self.transport.pause_reading()

    def next_frame_taken(self) -> None:
        if self._paused_reading and self.frames.qsize() < self.MAX_QUEUED_FRAMES // 2 and self.transport:
            self._paused_reading = False
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        if self._frame is not None or self._have:
            log.warning("closing connection: truncated frame", client=self.peer)
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
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

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Connection:
    """One client connection: requests handled one at a time and answered in order."""

    def __init__(self, server: BrokerServer, receiver: FrameReceiver) -> None:
        self.server = server
        self.receiver = receiver
        self.peer = receiver.peer
        self.busy = False
        self.task: asyncio.Future[None] | None = None

    def close(self) -> None:
        self.receiver._close()

    async def serve(self) -> None:
        try:
            while not self.server.closing:
                frame = await self.receiver.frames.get()
                if frame is None:
                    return
                self.receiver.next_frame_taken()
                self.busy = True
                try:
                    if not await self._handle_frame(bytes(frame) if len(frame) < 4096 else frame):
                        return
                except ConnectionError:
                    return  # the client went away while we answered
                finally:
                    self.busy = False
        finally:
            self.close()
            self.server.connections.discard(self)

    async def _handle_frame(self, frame: bytes | bytearray) -> bool:
        """Decode, dispatch and answer one request; False closes the connection."""
        try:
            req = decode_request(frame)
        except MalformedFrameError as e:
            log.warning("closing connection: malformed request", client=self.peer, reason=str(e))
            return False
        if req.body is None:
            if req.api_key == API_VERSIONS_KEY:
                # Kafka answers an unsupported ApiVersions with a v0 response listing what it supports.
                await self._send([encode_response(api_versions_response(UNSUPPORTED_VERSION), 0, req.correlation_id)])
                return True
            log.warning("closing connection: unsupported api version", client=self.peer, client_id=None,
                        api_key=req.api_key, api_version=req.api_version)
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
        if response is None:
            return True
        if isinstance(response, ApiMessage):
            chunks: list[Chunk] = [encode_response(response, req.api_version, req.correlation_id)]
        else:
            chunks = response
        await self._send(chunks)
        return True

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
                    pending += chunk
                elif chunk.size < SENDFILE_MIN_BYTES:
                    pending += chunk.read()
                else:
                    if pending:
                        transport.write(bytes(pending))
                        pending.clear()
                    with os.fdopen(chunk.fd, "rb", closefd=False) as f:  # the slice's private fd
                        await loop.sendfile(transport, f, chunk.position, chunk.size)
            if pending:
                transport.write(bytes(pending))
            await self.receiver.drain()
        finally:
            for chunk in chunks:
                if isinstance(chunk, SendfileSlice):
                    os.close(chunk.fd)


class BrokerServer:
    def __init__(self, data_dir: Path, config: BrokerConfig) -> None:
        self.broker = Broker(data_dir, config, BrokerFaults.from_env())
        self.config = config
        self.closing = False
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._stopped = asyncio.Event()
        self._shutdown_task: asyncio.Future[None] | None = None

    async def start(self) -> None:
        await self.broker.start()
        host, port = self.config.listen
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: FrameReceiver(self), host, port, reuse_address=True)
        log.info("ads-broker listening", listen=f"{host}:{port}",
                 advertised="{}:{}".format(*self.config.advertised), node_id=self.broker.node_id,
                 data_dir=str(self.broker.replicas.data_dir))

    async def shutdown(self, reason: str) -> None:
        if self.closing:
            return
        self.closing = True
        log.info("shutting down", reason=reason)
        if self._server is not None:
            self._server.close()
        self.broker.stopping = True
        self.broker.wake_fetchers()
        # Finish in-flight requests (bounded), then drop idle connections.
        for _ in range(100):
            if not any(c.busy for c in self.connections):
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()
        try:
            await self.broker.stop()
        except Exception:
            # Without the marker the next start recovers every log: safe, only slower.
            log.exception("unclean shutdown: flushing or checkpointing failed")
        finally:
            self._stopped.set()

    def _on_signal(self, sig: signal.Signals) -> None:
        self._shutdown_task = asyncio.ensure_future(self.shutdown(sig.name))

    async def run_until_signalled(self) -> None:
        await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        await self._stopped.wait()
        log.info("stopped cleanly")
