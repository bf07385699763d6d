"""Exceptions raised by `spark_audit`; every one derives from :class:`AuditError`."""


class AuditError(Exception):
    """Root of all `spark_audit` errors."""
