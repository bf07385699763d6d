"""Aggregated, rate-limited warnings for rejected clients and requests.

A hostile or broken client can make the broker reject thousands of things a second (connections
over a limit, topics with invalid names, malformed frames). One log line each would let it fill
the disk and stall the event loop on logging. :class:`RejectionLog` writes the first rejection
for a (client host, reason) pair at once, then at most one line per ``interval_s`` for that pair,
carrying the number of rejections it stands for (``count``).

The key is the client's *host*, not its ``host:port``: a client that reconnects after every
rejection comes from a new ephemeral port each time, and keying by port gave each attempt a
"first" line of its own (one line per rejection again, and one pending entry per port). The line
names the host as ``client`` and the last connection's ``host:port`` as ``peer``.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

log = structlog.get_logger("ads_broker.rejections")


#: client strings in a rejection line are cut to this many characters (a topic name or id may be
#: 32,767 bytes; one line per rejection must not be able to copy them whole)
MAX_FIELD_CHARS = 256


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return f"{value[:MAX_FIELD_CHARS]}…({len(value)} chars)"
    return value


def host_of(client: str) -> str:
    """The host of a client address as the server writes it (``f"{host}:{port}"``):
    ``10.0.0.5:51234`` -> ``10.0.0.5``, ``::1:51234`` -> ``::1``; an address without a port
    (``10.0.0.5``) or a name (``unknown``) as it is. A bare IPv6 address cannot be told from one
    with a port: callers that have one pass ``host=`` to :meth:`RejectionLog.warn`."""
    head, sep, port = client.rpartition(":")
    return head if sep and head and port.isdigit() else client


class RejectionLog:
    """Invariant: for every (client host, reason) pair at most one line per ``interval_s``; every
    rejection is counted in exactly one line (the next one written, or a later :meth:`flush`).
    Pending counts are flushed at least once per ``interval_s`` while rejections keep coming (and
    by the owner's periodic :meth:`flush`), so a suppressed count is never held back for long."""

    def __init__(self, interval_s: float = 10.0, max_keys: int = 10000) -> None:
        self.interval_s = interval_s
        self.max_keys = max_keys
        #: (host, reason) -> [time of the last line written, rejections since, last fields, event]
        self._pending: dict[tuple[str, str], list[Any]] = {}
        self._last_flush = time.monotonic()

    def __len__(self) -> int:
        """(host, reason) pairs remembered."""
        return len(self._pending)

    def warn(self, client: str, event: str, count: int = 1, aggregate_as: str | None = None,
             host: str | None = None, **fields: Any) -> None:
        """Count ``count`` rejections of ``client`` (``host:port``, or a host) for ``aggregate_as``
        (a fixed text; default ``event``, the log line's event name); write a line unless one was
        written for the same (host, reason) less than ``interval_s`` ago."""
        host = host if host is not None else host_of(client)
        key = (host, aggregate_as or event)
        fields = {k: _clip(v) for k, v in fields.items()}
        if client != host:
            fields["peer"] = _clip(client)
        now = time.monotonic()
        if now - self._last_flush >= self.interval_s:
            self.flush(now)
        entry = self._pending.get(key)
        if entry is None:
            if len(self._pending) >= self.max_keys:
                self.flush(now)
                if len(self._pending) >= self.max_keys:
                    self._pending.clear()
            self._pending[key] = [now, 0, fields, event]
            log.warning(event, client=host, count=count, **fields)
            return
        entry[1] += count
        entry[2], entry[3] = fields, event
        if now - entry[0] >= self.interval_s:
            log.warning(event, client=host, count=entry[1], **fields)
            entry[0], entry[1] = now, 0

    def flush(self, now: float | None = None) -> None:
        """Write the counts still pending and forget pairs quiet for a whole interval."""
        now = time.monotonic() if now is None else now
        self._last_flush = now
        for (host, reason), entry in list(self._pending.items()):
            if entry[1]:
                log.warning(entry[3], client=host, count=entry[1], **entry[2])
                entry[0], entry[1] = now, 0
            elif now - entry[0] >= self.interval_s:
                del self._pending[(host, reason)]
