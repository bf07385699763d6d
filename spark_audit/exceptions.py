"""Exceptions raised by `spark_audit`; every one derives from :class:`AuditError`."""


class AuditError(Exception):
    """Root of all `spark_audit` errors."""


class TopicNotFoundError(AuditError):
    """A topic the audit needs does not exist on the broker."""

    def __init__(self, topic: str, consumer_bootstrap: str = "") -> None:
        where = f" on {consumer_bootstrap}" if consumer_bootstrap else ""
        super().__init__(
            f"topic {topic!r} does not exist{where}; check --input/--output/--dlq names and --bootstrap"
        )
        self.topic = topic
