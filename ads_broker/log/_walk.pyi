"""Types of the C extension ``ads_broker/log/_walk.c`` (the record walk, without the GIL)."""

from array import array

from ads_broker.log.walk_reference import ScanResult

def scan_span(data: bytes | bytearray | memoryview, pos: int, end: int, index: int, count: int, min_delta: int,
              max_delta: int, no_ts_delta: int, first_null_key: int,
              marks: bytearray | memoryview | None = None, deltas: bytearray | memoryview | array[int] | None = None,
              low_delta: int = 0, high_delta: int = 0, flags: int = 0, /) -> ScanResult: ...
