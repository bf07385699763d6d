"""KIP-368 re-authentication rules shared by the broker's server side (``server.py``) and its
inter-broker client side (``cluster/channel.py``)."""

from __future__ import annotations

#: Kafka's ``KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS``: a connection starts at most one
#: re-authentication a second. The server handles a SaslHandshake sooner than this after the
#: previous login began as any other (ILLEGAL_SASL_STATE); the broker's own inter-broker
#: connections never try sooner.
MIN_REAUTH_INTERVAL_S = 1.0
