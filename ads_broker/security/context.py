"""The security context of the request being handled: its listener and authenticated principal.

The server sets these once per connection, inside the connection's own asyncio task, so every
handler awaited from that task sees its own connection's values (contextvars are per task).
An authorizer (ACLs, not implemented yet) reads :func:`current_principal`.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

ANONYMOUS = "User:ANONYMOUS"


@dataclass(frozen=True, slots=True)
class Session:
    """Who is on the other end of a connection: Kafka's ``KafkaPrincipal`` as ``Type:name``, the
    listener it connected on and the address to advertise back to it."""

    principal: str
    listener: str
    security_protocol: str
    advertised: tuple[str, int]
    client_host: str = ""


_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar("ads_broker_session", default=None)


def set_session(session: Session) -> None:
    _session.set(session)


def current_session() -> Session | None:
    return _session.get()


def current_principal() -> str:
    """``User:<name>`` (SASL), ``User:<certificate DN>`` (mTLS) or ``User:ANONYMOUS``."""
    session = _session.get()
    return session.principal if session is not None else ANONYMOUS


def current_advertised(default: tuple[str, int]) -> tuple[str, int]:
    """The advertised address of the listener the current request came in on."""
    session = _session.get()
    return session.advertised if session is not None else default
