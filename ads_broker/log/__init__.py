"""Kafka-format storage for one broker: record batches, segments, indexes, producer state, logs.

The broker's request handlers use :class:`Log` (one per partition directory ``topic-N/``);
everything below it works per record batch, never per record, on the append and fetch paths.

The names below are imported on first use (PEP 562), so a light submodule such as
:mod:`ads_broker.log.fileutil`, which the dedupe worker imports, does not pull in the record
codec and kafka-python (~1.5 s of a worker's start-up, measured with ``python -X importtime``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ads_broker.log.config import TOPIC_CONFIG_KEYS, LogConfig
    from ads_broker.log.log import AppendInfo, FileSlice, Log
    from ads_broker.log.producer_state import ProducerStateManager

_WHERE = {"TOPIC_CONFIG_KEYS": "config", "LogConfig": "config", "AppendInfo": "log", "FileSlice": "log",
          "Log": "log", "ProducerStateManager": "producer_state"}

__all__ = ["TOPIC_CONFIG_KEYS", "AppendInfo", "FileSlice", "Log", "LogConfig", "ProducerStateManager"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
