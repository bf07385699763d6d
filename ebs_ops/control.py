"""Client for the dedupe worker's control endpoint (docs/CONTRACTS.md, "Worker control endpoint").

The one rule this module keeps: a partition paused by :func:`paused` is resumed on every exit
path, and as soon as the caller's snapshot has *started* — a snapshot's content is fixed when it
starts, so holding the pause until it completes would only stall the pipeline.
"""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import structlog

from ebs_ops.exceptions import BadInputError, UnknownPartitionError, WorkerControlError
from ebs_ops.models import WorkerPosition

log = structlog.get_logger(__name__)


class WorkerControlClient:
    """HTTP/1.1 JSON client; one short connection per request (no I/O in the constructor)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise BadInputError(
                f"worker control url {url!r} is not of the form http://HOST:PORT; "
                "pass the address given to `dedupe-worker run --control-port`"
            )
        self.url = f"http://{parts.hostname}:{parts.port}"
        self._host = parts.hostname
        self._port = parts.port
        self._timeout_s = timeout_s

    def partitions(self) -> list[dict[str, Any]]:
        body = self._request("GET", "/partitions", None)
        if not isinstance(body, list):
            raise WorkerControlError(f"GET {self.url}/partitions returned {body!r}, expected a list")
        return body

    def pause(self, partition: int) -> WorkerPosition:
        return self._position(self._request("POST", f"/partitions/{partition}/pause", {}))

    def checkpoint(self, partition: int, path: str) -> WorkerPosition:
        return self._position(self._request("POST", f"/partitions/{partition}/checkpoint", {"path": path}))

    def _position(self, body: Any) -> WorkerPosition:
        fields = ("partition", "input_offset", "output_offset", "sequence")
        if not isinstance(body, dict) or any(body.get(f) is None for f in fields):
            raise WorkerControlError(
                f"worker {self.url} reported no offsets ({body!r}); its partition store is not open yet: "
                "wait until GET /partitions shows it running, then re-run"
            )
        return WorkerPosition.from_json(body)

    def resume(self, partition: int) -> dict[str, Any]:
        body = self._request("POST", f"/partitions/{partition}/resume", {})
        return body if isinstance(body, dict) else {}

    def _request(self, method: str, path: str, payload: dict[str, Any] | None) -> Any:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
        data = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except OSError as exc:
            raise WorkerControlError(
                f"worker control endpoint {self.url} unreachable for {method} {path}: {exc}; "
                "check that `dedupe-worker run --control-port` is running and the url is right"
            ) from exc
        finally:
            conn.close()
        return self._decode(method, path, resp.status, raw)

    def _decode(self, method: str, path: str, status: int, raw: bytes) -> Any:
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"error": raw[:200].decode(errors="replace")}
        if status == 404:
            raise UnknownPartitionError(
                f"worker {self.url} does not serve the partition in {method} {path}: "
                f"{_error_text(body)}; list what it serves with GET {self.url}/partitions"
            )
        if status >= 400:
            raise WorkerControlError(
                f"worker {self.url} refused {method} {path} with HTTP {status}: {_error_text(body)}"
            )
        return body


def _error_text(body: Any) -> str:
    return str(body.get("error", body)) if isinstance(body, dict) else str(body)


@contextmanager
def paused(client: WorkerControlClient, partition: int) -> Iterator[WorkerPosition]:
    """Pause ``partition``; always resume it when the block exits, even on error.

    Keep the block short: start the snapshot inside it, wait for completion outside.
    """
    try:
        position = client.pause(partition)
    except WorkerControlError:
        # The pause may have taken effect before the failure (e.g. a bad reply): undo it.
        with contextlib.suppress(WorkerControlError):
            client.resume(partition)
        raise
    log.info("worker_paused", partition=partition, input_offset=position.input_offset,
             output_offset=position.output_offset, sequence=position.sequence)
    try:
        yield position
    except BaseException:
        # The original error is what the operator must see; a failed resume is logged next to it
        # with how to finish the job by hand.
        try:
            client.resume(partition)
        except WorkerControlError as resume_error:
            log.error("worker_still_paused", partition=partition, error=str(resume_error),
                      next_step=f"resume it: curl -X POST {client.url}/partitions/{partition}/resume")
        raise
    client.resume(partition)
    log.info("worker_resumed", partition=partition)
