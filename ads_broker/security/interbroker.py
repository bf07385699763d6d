"""How this broker connects to other brokers: the inter-broker listener, as Kafka selects it.

Kafka's rules (``KafkaConfig.getInterBrokerListenerNameAndSecurityProtocol`` and its checks):

* ``inter.broker.listener.name`` names a listener; its security protocol comes from
  ``listener.security.protocol.map``. Without it, ``security.inter.broker.protocol`` (default
  PLAINTEXT) names both the protocol and the listener (the listener called like the protocol).
  Setting both is an error, and the listener must be in ``advertised.listeners``: every broker
  connects to the others' registered endpoint of that name.
* On a SASL listener the broker logs in with ``sasl.mechanism.inter.broker.protocol`` (Kafka's
  default GSSAPI is not supported here: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512), which must be in
  the listener's ``sasl.enabled.mechanisms``. The user name and password come from the listener's
  ``listener.name.<listener>.<mechanism>.sasl.jaas.config`` (``username``/``password`` of
  Kafka's ``ScramLoginModule`` or ``PlainLoginModule``), as Kafka's inter-broker clients take them.
* On a TLS listener the broker is a TLS client with the listener's ``ssl.*`` settings: the
  truststore verifies the other broker's certificate (and ``ssl.endpoint.identification.algorithm``
  = https, Kafka's default, its host name), and the keystore, if any, is presented as the client
  certificate (mTLS).

Every connection a broker opens to another broker goes through :class:`InterBrokerSecurity`
(:mod:`ads_broker.cluster.channel`): the replica fetchers and the transaction marker sender. The
principal it authenticates as needs CLUSTER_ACTION on the Cluster (or ``super.users``) once an
authorizer is on (docs/SECURITY.md, "Inter-broker listener").
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from ads_broker.exceptions import ConfigError
from ads_broker.security.listeners import SECURITY_PROTOCOLS, parse_endpoints, parse_protocol_map
from ads_broker.security.sasl_client import CLIENT_MECHANISMS, SaslCredentials, credentials_from_jaas

if TYPE_CHECKING:
    from ads_broker.cluster.zookeeper import BrokerRegistration
    from ads_broker.config import BrokerConfig, BrokerSettings


def validate_security_protocol(value: str) -> str:
    if value.upper() not in SECURITY_PROTOCOLS:
        raise ValueError(f"expected one of {', '.join(SECURITY_PROTOCOLS)}")
    return value.upper()


def jaas_key(listener: str, mechanism: str) -> str:
    """Kafka's per-listener, per-mechanism key of the JAAS login entry."""
    return f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"


@dataclass(frozen=True)
class InterBrokerSecurity:
    """The listener this broker reaches other brokers on, and how it authenticates there."""

    listener_name: str
    security_protocol: str
    #: the broker's SASL login; None on PLAINTEXT and SSL listeners
    credentials: SaslCredentials | None
    #: the listener's settings (its ``listener.name.<l>.ssl.*`` on top of the broker's)
    settings: BrokerSettings

    @classmethod
    def from_config(cls, config: BrokerConfig) -> InterBrokerSecurity:
        """Kafka's selection and checks; a ConfigError naming the setting and the fix."""
        settings = config.settings
        name = settings.inter_broker_listener_name.strip().upper()
        protocols = parse_protocol_map(settings.listener_security_protocol_map)
        if name:
            if "security.inter.broker.protocol" in config.explicit:
                raise ConfigError("Only one of inter.broker.listener.name and security.inter.broker.protocol "
                                  "should be set.")
            if name not in protocols:
                raise ConfigError(f"Listener with name {name} defined in inter.broker.listener.name not found in "
                                  f"listener.security.protocol.map ({settings.listener_security_protocol_map}).")
            protocol = protocols[name]
        else:
            protocol = settings.security_inter_broker_protocol.upper()
            name = protocol
        advertised = [e.name for e in parse_endpoints(settings.advertised_listeners)]
        if name not in advertised:
            raise ConfigError(f"inter.broker.listener.name must be a listener name defined in advertised.listeners. "
                              f"The valid options based on currently configured listeners are {','.join(advertised)} "
                              f"(the inter-broker listener is {name}: set inter.broker.listener.name or "
                              "security.inter.broker.protocol to one of them)")
        listener = config.for_listener(name)
        credentials = None
        if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            credentials = cls._credentials(config, listener.settings, name)
        return cls(name, protocol, credentials, listener.settings)

    @staticmethod
    def _credentials(config: BrokerConfig, listener: BrokerSettings, name: str) -> SaslCredentials:
        mechanism = config.settings.sasl_mechanism_inter_broker_protocol.strip().upper()
        if mechanism not in CLIENT_MECHANISMS:
            raise ConfigError(f"sasl.mechanism.inter.broker.protocol={mechanism}: not supported here; the "
                              f"inter-broker listener {name} uses SASL, so set it to one of "
                              f"{', '.join(CLIENT_MECHANISMS)}")
        enabled = [m.strip().upper() for m in listener.sasl_enabled_mechanisms.split(",") if m.strip()]
        if mechanism not in enabled:
            raise ConfigError(f"sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms "
                              f"when SASL is used for inter-broker communication ({mechanism} is not in "
                              f"{','.join(enabled)} of listener {name})")
        key = jaas_key(name, mechanism)
        jaas = config.listener_overrides.get(name, {}).get(f"{mechanism.lower()}.sasl.jaas.config")
        if not jaas:
            raise ConfigError(f"{key} is not set: the inter-broker listener {name} uses SASL {mechanism}, and the "
                              "broker logs in to other brokers with that entry's username and password "
                              "(e.g. org.apache.kafka.common.security.scram.ScramLoginModule required "
                              'username="broker" password="...";)')
        return credentials_from_jaas(mechanism, str(jaas), key)

    @property
    def principal(self) -> str:
        """What the other brokers see this broker as (grant it CLUSTER_ACTION or list it in
        ``super.users``); on PLAINTEXT and SSL without a keystore, ``User:ANONYMOUS``."""
        return f"User:{self.credentials.username}" if self.credentials else "User:ANONYMOUS"

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS client context (built on first use; a ConfigError for unreadable files)."""
        if not self.uses_tls:
            return None
        from ads_broker.security.tls import client_context

        return client_context(self.settings)

    def endpoint(self, registration: BrokerRegistration) -> tuple[str, int] | None:
        """HOST, PORT of another broker's listener of this name (from its registration), or None
        when it does not advertise one (then the brokers are configured differently)."""
        for entry in registration.endpoints:
            try:
                (e,) = parse_endpoints(entry)
            except ValueError:
                continue
            if e.name == self.listener_name:
                return e.host, e.port
        if not registration.endpoints and self.listener_name == "PLAINTEXT":
            return registration.host, registration.port  # a registration without endpoints (older form)
        return None
