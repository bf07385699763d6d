"""Exceptions raised by `dedupe_worker`; every one derives from :class:`DedupeError`."""


class DedupeError(Exception):
    """Root of all `dedupe_worker` errors."""
