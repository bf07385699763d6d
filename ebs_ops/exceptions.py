"""Exceptions raised by `ebs_ops`; every one derives from :class:`EbsOpsError`."""


class EbsOpsError(Exception):
    """Root of all `ebs_ops` errors."""
