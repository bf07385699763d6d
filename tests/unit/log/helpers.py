"""Shared builders for the log tests: real files under tmp_path, an injectable clock."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ads_broker.log.config import LogConfig
from ads_broker.log.log import Log
from ads_broker.log.records import Record, build_batch, decode_batch, iter_batches

BASE_TS = 1_700_000_000_000


@dataclass
class Clock:
    now: int = BASE_TS

    def __call__(self) -> int:
        return self.now


def open_log(
    dir: Path, config: LogConfig | None = None, *, clock: Clock | None = None, clean: bool = True, **kw: int
) -> Log:
    return Log(
        dir,
        config or LogConfig(),
        topic="t",
        partition=0,
        clean_shutdown=clean,
        now_ms=clock or Clock(),
        **kw,
    )


def batch(
    n: int = 1,
    *,
    ts: int = BASE_TS,
    value_size: int = 10,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    tag: bytes = b"",
) -> bytes:
    return build_batch(
        [Record(-1, ts + i, tag + b"k%d" % i, b"v" * value_size) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def read_all(log: Log, offset: int | None = None, max_bytes: int = 2**31 - 1) -> bytes:
    start = log.log_start_offset if offset is None else offset
    return b"".join(s.read_bytes() for s in log.read(start, max_bytes))


def offsets_in(data: bytes) -> list[int]:
    out: list[int] = []
    for pos, header in iter_batches(data, validate=True):
        _, records = decode_batch(data[pos : pos + header.size])
        out.extend(r.offset for r in records)
    return out
