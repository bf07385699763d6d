"""Consistent snapshots, restore and move of dedupe worker volumes."""

__version__ = "0.1.0"
