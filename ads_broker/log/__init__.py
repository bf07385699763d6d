"""Kafka-format storage for one broker: record batches, segments, indexes, producer state, logs.

The broker's request handlers use :class:`Log` (one per partition directory ``topic-N/``);
everything below it works per record batch, never per record, on the append and fetch paths.
"""

from ads_broker.log.config import TOPIC_CONFIG_KEYS, LogConfig
from ads_broker.log.log import AppendInfo, FileSlice, Log
from ads_broker.log.producer_state import ProducerStateManager

__all__ = ["TOPIC_CONFIG_KEYS", "AppendInfo", "FileSlice", "Log", "LogConfig", "ProducerStateManager"]
