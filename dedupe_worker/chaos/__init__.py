"""dedupe-chaos: the exactly-once proof harness (docs/RELIABILITY.md)."""
