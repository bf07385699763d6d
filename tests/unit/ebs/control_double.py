"""A stand-in for the dedupe worker's control endpoint, for unit tests of ebs_ops.

Not a mock: it is a real HTTP server on 127.0.0.1 serving the contract in docs/CONTRACTS.md over a
real RocksDB (rocksdict) it owns, and it takes real checkpoints. It stands in for
`dedupe-worker run --control-port` only where the worker process is not needed (the end-to-end
test in tests/integration/ebs uses the real worker). It records every request so tests can check
that a paused partition is always resumed.

HeldOpen is the other half of a running worker: a separate process holding the volume's RocksDB
LOCK (in another process, as in production: a POSIX lock probe from the holding process itself
would release it); stop_hook builds a `--stop-cmd` that records its arguments and stops it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rocksdict import Checkpoint, Rdict


class WorkerDouble:
    def __init__(self, data_dir: Path, partition: int, *, db_subdir: str = "db",
                 fail_checkpoint: bool = False) -> None:
        self.partition = partition
        self.volume = data_dir / f"partition-{partition}"
        self.db_path = self.volume / db_subdir if db_subdir else self.volume
        self.db_path.mkdir(parents=True, exist_ok=True)
        (self.volume / "volume.json").write_text(json.dumps({"topic": "events", "partition": partition}))
        self.db = Rdict(str(self.db_path))
        self.state = "running"
        self.input_offset = 0
        self.output_offset = 0
        self.sequence = 0
        self.fail_checkpoint = fail_checkpoint
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._stopped = False

    def __enter__(self) -> WorkerDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving and close the DB (releasing its LOCK), as a stopped worker does; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self.db.close()

    def write(self, keys: list[str]) -> None:
        """Record keys the way the worker does: keys + offsets in the DB, then advance."""
        for k in keys:
            self.db[k.encode()] = str(self.sequence).encode()
            self.sequence += 1
        self.input_offset += len(keys)
        self.output_offset += len(keys)
        self.db[b"__offsets__"] = json.dumps([self.input_offset, self.output_offset, self.sequence]).encode()

    def _status(self) -> dict[str, Any]:
        return {"partition": self.partition, "state": self.state, "input_offset": self.input_offset,
                "output_offset": self.output_offset, "sequence": self.sequence, "db_path": str(self.db_path)}

    def _route(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        self.requests.append(f"{method} {path}")
        if method == "GET" and path == "/partitions":
            return 200, [self._status()]
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "partitions" or parts[1] != str(self.partition):
            return 404, {"error": f"unknown partition in {path}"}
        action = parts[2]
        if action == "pause":
            self.db.flush(True)
            self.db.flush_wal(True)
            self.state = "paused"
            return 200, self._status()
        if action == "resume":
            self.state = "running"
            return 200, self._status()
        if action == "checkpoint":
            if self.state != "paused":
                return 409, {"error": "checkpoint while running: pause first"}
            if self.fail_checkpoint:
                return 500, {"error": "disk full"}
            Checkpoint(self.db).create_checkpoint(body["path"])
            return 200, {**self._status(), "checkpoint_path": body["path"]}
        return 404, {"error": f"unknown action {action}"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        worker = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                status, out = worker._route(method, self.path, body)
                raw = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


class HeldOpen:
    """A separate process holding a RocksDB open (what a running worker does to its volume)."""

    def __init__(self, db_dir: Path) -> None:
        code = ("import sys, rocksdict; db = rocksdict.Rdict(sys.argv[1]); "
                "print('open', flush=True); sys.stdin.read()")
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(db_dir)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def __enter__(self) -> HeldOpen:
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "open"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def stop_hook(log: Path, pid: int | None = None, *, exit_code: int = 0) -> str:
    """A stop hook that logs its arguments, SIGTERMs ``pid`` (the worker) and exits ``exit_code``."""
    code = ("import os, signal, sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[4:]) + '\\n'); "
            "pid = int(sys.argv[2]); pid and os.kill(pid, signal.SIGTERM); sys.exit(int(sys.argv[3]))")
    return f"{sys.executable} -c \"{code}\" {log} {pid or 0} {exit_code} {{partition}} {{instance}} {{volume}}"
