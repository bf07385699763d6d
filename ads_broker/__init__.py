"""Kafka-wire-compatible log broker written in Python (the ADS broker core)."""

__version__ = "0.1.0"
