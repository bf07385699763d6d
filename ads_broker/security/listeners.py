"""Kafka's listener settings: ``listeners``, ``advertised.listeners`` and
``listener.security.protocol.map``.

``listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093`` binds one endpoint per entry; the
name before ``://`` is looked up in the protocol map (by default each standard protocol maps to
itself). A bare ``HOST:PORT`` (this broker's original form, still used by ``--listen``) means
``PLAINTEXT://HOST:PORT``. ``advertised.listeners`` gives, per listener name, the address put in
Metadata and FindCoordinator responses for clients connected on that listener.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in SECURITY_PROTOCOLS)
_ENTRY = re.compile(r"^(?:(?P<name>[A-Za-z0-9_]+)://)?(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\[\]]*):(?P<port>\d+)$")


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """One configured listener: where it binds, what it advertises and its security protocol."""

    name: str
    security_protocol: str
    host: str
    port: int
    advertised_host: str
    advertised_port: int

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def parse_endpoints(value: str, *, allow_port_zero: bool = False) -> list[Endpoint]:
    """``NAME://HOST:PORT`` entries, comma-separated; a bare ``HOST:PORT`` is named PLAINTEXT."""
    out: list[Endpoint] = []
    for raw in value.split(","):
        entry = raw.strip()
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(f"expected HOST:PORT or NAME://HOST:PORT (comma-separated), got {entry!r}")
        port = int(match["port"])
        if not (0 if allow_port_zero else 1) <= port < 65536:
            raise ValueError(f"port {port} of {entry!r} is not in 1..65535")
        name = (match["name"] or "PLAINTEXT").upper()
        if any(e.name == name for e in out):
            raise ValueError(f"listener name {name} appears twice")
        out.append(Endpoint(name, match["host"].strip("[]"), port))
    if not out:
        raise ValueError("no listener")
    return out


def parse_protocol_map(value: str) -> dict[str, str]:
    """``NAME:PROTOCOL`` pairs, comma-separated (``listener.security.protocol.map``)."""
    out: dict[str, str] = {}
    for raw in value.split(","):
        name, sep, protocol = raw.strip().partition(":")
        if not sep or not name or protocol.upper() not in SECURITY_PROTOCOLS:
            raise ValueError(f"expected NAME:PROTOCOL with PROTOCOL one of {', '.join(SECURITY_PROTOCOLS)}, "
                             f"got {raw.strip()!r}")
        out[name.upper()] = protocol.upper()
    return out


def validate_listeners(value: str) -> str:
    parse_endpoints(value)
    return value


def validate_protocol_map(value: str) -> str:
    parse_protocol_map(value)
    return value


def resolve_listeners(listeners: str, advertised: str, protocol_map: str) -> list[ListenerSpec]:
    """The listeners with their protocol and advertised address; a clear error for a name missing
    from the map or an advertised name that is not a listener (Kafka's checks)."""
    protocols = parse_protocol_map(protocol_map)
    bound = parse_endpoints(listeners)
    told = {e.name: e for e in parse_endpoints(advertised)} if advertised else {}
    names = {e.name for e in bound}
    for name in told:
        if name not in names:
            raise ValueError(f"advertised.listeners names {name}, which is not in listeners ({listeners})")
    specs: list[ListenerSpec] = []
    for e in bound:
        if e.name not in protocols:
            raise ValueError(f"listener {e.name} is not in listener.security.protocol.map ({protocol_map})")
        adv = told.get(e.name, e)
        specs.append(ListenerSpec(e.name, protocols[e.name], e.host, e.port, adv.host, adv.port))
    return specs
