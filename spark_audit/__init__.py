"""Nightly duplicate audit of the input and output topics on PySpark."""

__version__ = "0.1.0"
