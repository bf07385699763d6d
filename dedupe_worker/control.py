"""HTTP control endpoint (docs/CONTRACTS.md, "Worker control endpoint"); stdlib server in a thread."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from dedupe_worker.exceptions import DedupeError
from dedupe_worker.worker import PartitionWorker

_ROUTE = re.compile(r"^/partitions/(\d+)/(pause|checkpoint|resume)$")


class ControlServer:
    """Serves ``GET /partitions`` and ``POST /partitions/{p}/pause|checkpoint|resume``."""

    def __init__(self, workers: Mapping[int, PartitionWorker], port: int = 0,
                 host: str = "127.0.0.1") -> None:
        self.workers = workers
        handler = _handler(workers)
        self._server = ThreadingHTTPServer((host, port), handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="control", daemon=True)

    def start(self) -> ControlServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(workers: Mapping[int, PartitionWorker]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet; the worker logs in JSON
            return

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/partitions":
                self._reply(200, [w.status() for _, w in sorted(workers.items())])
            else:
                self._reply(404, {"error": f"no route GET {self.path}; try GET /partitions"})

        def do_POST(self) -> None:
            m = _ROUTE.match(self.path)
            if m is None:
                self._reply(404, {"error": f"no route POST {self.path}"})
                return
            partition, action = int(m.group(1)), m.group(2)
            worker = workers.get(partition)
            if worker is None:
                self._reply(404, {"error": f"partition {partition} is not served here; served: "
                                           f"{sorted(workers)}"})
                return
            try:
                self._reply(200, self._act(worker, action))
            except DedupeError as e:
                self._reply(409, {"error": str(e)})
            except ValueError as e:
                self._reply(400, {"error": str(e)})

        def _act(self, worker: PartitionWorker, action: str) -> dict[str, Any]:
            if action == "pause":
                return worker.pause()
            if action == "resume":
                return worker.resume()
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                raise ValueError('checkpoint body must be JSON like {"path": "/new/dir"}') from None
            if not isinstance(body, dict) or not isinstance(body.get("path"), str):
                raise ValueError('checkpoint body must be JSON like {"path": "/new/dir"}')
            return worker.checkpoint(Path(body["path"]))

    return Handler
