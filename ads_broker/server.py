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
import contextlib
import os
import signal
import struct
from pathlib import Path

import structlog
from kafka.protocol.api_message import ApiMessage

from ads_broker.broker import Broker
from ads_broker.config import BrokerConfig
from ads_broker.exceptions import MalformedFrameError
from ads_broker.protocol.codec import API_VERSIONS_KEY, Chunk, SendfileSlice, decode_request, encode_response
from ads_broker.protocol.metadata import api_versions_response

log = structlog.get_logger("ads_broker.server")
SENDFILE_MIN_BYTES = 64 * 1024
UNSUPPORTED_VERSION = 35


class Connection:
    def __init__(self, server: BrokerServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "unknown"
        self.busy = False

    async def serve(self) -> None:
        max_bytes = int(self.server.broker.config["socket.request.max.bytes"])
        try:
            while not self.server.closing:
                try:
                    size_bytes = await self.reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                (size,) = struct.unpack(">i", size_bytes)
                if size < 0 or size > max_bytes:
                    log.warning("closing connection: bad frame size", client=self.peer, size=size, max=max_bytes)
                    return
                try:
                    frame = await self.reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    log.warning("closing connection: truncated frame", client=self.peer, expected=size)
                    return
                self.busy = True
                try:
                    if not await self._handle_frame(frame):
                        return
                except ConnectionError:
                    return  # the client went away while we answered
                finally:
                    self.busy = False
        finally:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def _handle_frame(self, frame: bytes) -> bool:
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
        loop = asyncio.get_running_loop()
        transport = self.writer.transport
        try:
            pending = bytearray()
            for chunk in chunks:
                if isinstance(chunk, bytes | bytearray):
                    pending += chunk
                elif chunk.size < SENDFILE_MIN_BYTES:
                    pending += chunk.read()
                else:
                    if pending:
                        self.writer.write(bytes(pending))
                        pending.clear()
                    with os.fdopen(os.dup(chunk.fd), "rb", closefd=True) as f:
                        await loop.sendfile(transport, f, chunk.position, chunk.size)
            if pending:
                self.writer.write(bytes(pending))
            await self.writer.drain()
        finally:
            for chunk in chunks:
                if isinstance(chunk, SendfileSlice):
                    os.close(chunk.fd)


class BrokerServer:
    def __init__(self, data_dir: Path, config: BrokerConfig) -> None:
        self.broker = Broker(data_dir, config)
        self.config = config
        self.closing = False
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._stopped = asyncio.Event()
        self._shutdown_task: asyncio.Future[None] | None = None

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(self, reader, writer)
        self.connections.add(conn)
        try:
            await conn.serve()
        finally:
            self.connections.discard(conn)

    async def start(self) -> None:
        await self.broker.start()
        host, port = self.config.listen
        self._server = await asyncio.start_server(self._on_connect, host, port, reuse_address=True,
                                                  limit=1 << 20)
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
            conn.writer.close()
        await self.broker.stop()
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
