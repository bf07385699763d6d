"""Segment-style exactly-once dedupe workers on RocksDB."""

__version__ = "0.1.0"
