"""Memory tracing for leak hunts (docs/FUZZING.md, "Memory"): off unless the environment says so.

``ADS_BROKER_MEMTRACE=<dir>`` makes the broker write, every ``ADS_BROKER_MEMTRACE_INTERVAL_S``
seconds (60), a line to ``<dir>/memtrace.jsonl``: VmRSS, the interpreter's allocated blocks, glibc's
``mallinfo2`` (bytes in use vs. held free in the heap arenas, bytes in mmapped chunks) and the 15
object types whose live count grew most since the first sample. RSS growing while Python's blocks
and the in-use bytes stay flat is the allocator holding freed memory (fragmentation), not a leak of
objects. Cheap enough for a long fuzz run (one ``gc.get_objects`` walk per interval).

``ADS_BROKER_MEMTRACE_TRACEMALLOC=1`` also starts :mod:`tracemalloc` and adds the 25 source lines
whose allocations grew most; that slows the broker several times over: short runs only.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

ENV_DIR = "ADS_BROKER_MEMTRACE"
ENV_INTERVAL = "ADS_BROKER_MEMTRACE_INTERVAL_S"
ENV_TRACEMALLOC = "ADS_BROKER_MEMTRACE_TRACEMALLOC"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def mallinfo() -> dict[str, int]:
    """glibc's heap counters in bytes ({} where there is no ``mallinfo2``, e.g. musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {"arena": info.arena, "in_use": info.uordblks, "free_held": info.fordblks, "mmapped": info.hblkhd}


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def type_counts() -> collections.Counter[str]:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


def sample(types0: collections.Counter[str], first: tracemalloc.Snapshot | None) -> dict[str, Any]:
    types = type_counts()
    grown = sorted(((n - types0.get(t, 0), t) for t, n in types.items()), reverse=True)[:15]
    record: dict[str, Any] = {"t": round(time.time(), 1), "rss_mib": round(rss_bytes() / 2**20, 1),
                              "py_blocks": sys.getallocatedblocks(), "objects": sum(types.values()),
                              "malloc": mallinfo(), "types_grown": {t: d for d, t in grown if d > 0}}
    if first is not None:
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        record["traced_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 2)
        record["lines_grown"] = [str(s) for s in snapshot.compare_to(first, "lineno")[:25]]
    return record


def start_from_env() -> None:
    """Start sampling in a daemon thread when ``ADS_BROKER_MEMTRACE`` is set."""
    target = os.environ.get(ENV_DIR)
    if not target:
        return
    interval = float(os.environ.get(ENV_INTERVAL, "60"))
    out = Path(target)
    out.mkdir(parents=True, exist_ok=True)
    if os.environ.get(ENV_TRACEMALLOC) == "1":
        tracemalloc.start(1)

    def run() -> None:
        first = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
        types0 = type_counts()
        with open(out / "memtrace.jsonl", "a", encoding="utf-8") as f:
            while True:
                time.sleep(interval)
                f.write(json.dumps(sample(types0, first)) + "\n")
                f.flush()

    threading.Thread(target=run, name="memtrace", daemon=True).start()
