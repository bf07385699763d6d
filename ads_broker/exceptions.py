"""Exceptions raised by `ads_broker`; every one derives from :class:`BrokerError`."""


class BrokerError(Exception):
    """Root of all `ads_broker` errors."""
