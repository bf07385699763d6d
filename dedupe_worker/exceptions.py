"""Exceptions raised by `dedupe_worker`; every one derives from :class:`DedupeError`."""


class DedupeError(Exception):
    """Root of all `dedupe_worker` errors."""


class ConfigError(DedupeError):
    """The worker's configuration is invalid; the message names the setting and how to fix it."""


class StoreError(DedupeError):
    """A partition store could not be opened, read or written."""


class StoreUnusableError(StoreError):
    """The open store cannot serve (its key filters could not be rebuilt from its column
    families): restarting the partition on the same store cannot help; the worker stops."""


class VolumeMismatchError(StoreError):
    """A partition volume belongs to another topic or partition than the one requested."""


class TopicLayoutError(DedupeError):
    """Input and output topics are missing or have different partition counts."""


class DeliveryError(DedupeError):
    """A batch's output was not fully acknowledged; the partition restarts from reconcile."""


class ReconcileError(DedupeError):
    """The output partition could not be replayed into the store."""


class OutputLostError(ReconcileError):
    """The output partition is shorter than the store recorded: the broker lost acknowledged
    output. The worker repairs by rebuilding the store from the output and re-reading the input."""


class FencedError(DedupeError):
    """Another worker took over this partition (a newer producer with its transactional.id)."""
