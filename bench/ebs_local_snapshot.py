"""Benchmark: local snapshot of a large partition served by a real worker.

1. Build a partition store with N keys (default 10M) using the worker's own store class
   (``dedupe_worker.store.rocksdb.RocksDBStore`` with its default options), keys shaped like
   messageIds (UUIDv4 text).
   The built store is kept as ``<workdir>/pristine`` and copied for each invocation (the worker
   records offsets in it, so a used volume does not match a fresh broker).
2. Start tansu and a real ``dedupe-worker run --control-port`` on that volume.
3. ``--runs`` times: feed ``--feed`` new events and wait until the worker has applied them (so
   its memtables hold unflushed keys, as in production), then take a snapshot with
   ``LocalVolumeBackend`` (the code behind ``ebs-ops snapshot --backend local``) and measure the
   worker pause time (pause request sent → resume reply received, which includes the worker's
   memtable + WAL flush and the checkpoint) and the total snapshot time, plus the bytes the
   snapshot does not share with the volume through hard links.

Usage:
    .venv/bin/python bench/ebs_local_snapshot.py [--keys 10000000] [--runs 3] [--feed 50000]
        [--workdir DIR] [--json]

Everything started here is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from ads_broker.embedded import free_port, tansu_process
from dedupe_worker.kafka import create_topics, producer_config
from dedupe_worker.store.rocksdb import RocksDBOptions, RocksDBStore
from ebs_ops.backends.local import LocalVolumeBackend
from ebs_ops.control import WorkerControlClient
from ebs_ops.models import WorkerPosition

TOPIC = "bench-events"


class TimedControl(WorkerControlClient):
    """Records when the pause was requested and when the resume returned."""

    pause_sent = 0.0
    resumed = 0.0

    def pause(self, partition: int) -> WorkerPosition:
        self.pause_sent = time.perf_counter()
        return super().pause(partition)

    def resume(self, partition: int) -> dict[str, Any]:
        out = super().resume(partition)
        self.resumed = time.perf_counter()
        return out


def build_store(volume: Path, keys: int, batch: int = 50_000) -> float:
    start = time.perf_counter()
    store = RocksDBStore(volume, RocksDBOptions(), topic=f"{TOPIC}-in", partition=0)
    now_ms = int(time.time() * 1000)
    try:
        done = 0
        while done < keys:
            n = min(batch, keys - done)
            ids = [str(uuid.uuid4()).encode() for _ in range(n)]
            # Offsets stay 0: the bench topics are empty, so reconcile on start has nothing to replay.
            store.record(ids, [now_ms] * n, input_offset=0, output_offset=0)
            done += n
        store.flush()
    finally:
        store.close()
    return time.perf_counter() - start


def du(path: Path) -> int:
    """Bytes of distinct inodes under ``path`` (hard links counted once)."""
    seen: set[int] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(root, name))
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def own_bytes(path: Path) -> int:
    """Bytes under ``path`` that are not hard links shared with the volume (what the snapshot costs)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(root, name))
            if st.st_nlink == 1:
                total += st.st_size
    return total


def wait_running(url: str, proc: subprocess.Popen[bytes], input_end: int = 0, timeout_s: float = 600) -> None:
    """Until partition 0 is running and has applied every input record below ``input_end``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/partitions", timeout=5) as resp:  # noqa: S310 (loopback)
                st = json.loads(resp.read())[0]
                if st["state"] == "running" and (st["input_offset"] or 0) >= input_end:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("worker did not reach running / did not consume the feed")


def feed(bootstrap: str, n: int) -> None:
    producer = Producer(producer_config(bootstrap))
    for _ in range(n):
        mid = str(uuid.uuid4())
        producer.produce(f"{TOPIC}-in", key=mid.encode(), partition=0,
                         value=json.dumps({"messageId": mid, "type": "track"}).encode())
        producer.poll(0)
    producer.flush(120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--feed", type=int, default=50_000, help="new events the worker applies before each run")
    ap.add_argument("--workdir", type=Path, default=None, help="kept if given; a temp dir otherwise")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ebs-bench-"))
    data, snaps = work / "data", work / "snapshots"
    volume, pristine = data / "partition-0", work / "pristine"
    build_s = build_store(pristine, args.keys) if not pristine.exists() else 0.0
    volume_bytes = du(pristine)
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(snaps, ignore_errors=True)
    shutil.copytree(pristine, volume)
    results: list[dict[str, float]] = []
    with tansu_process(log_path=work / "tansu.log") as broker:
        create_topics(broker.bootstrap, {f"{TOPIC}-in": 1, f"{TOPIC}-out": 1, f"{TOPIC}-dlq": 1})
        port = free_port()
        argv = [sys.executable, "-m", "dedupe_worker", "run", "--bootstrap", broker.bootstrap,
                "--input", f"{TOPIC}-in", "--output", f"{TOPIC}-out", "--dlq", f"{TOPIC}-dlq",
                "--partitions", "0", "--data-dir", str(data), "--group", f"bench-{uuid.uuid4().hex[:8]}",
                "--control-port", str(port)]
        with open(work / "worker.log", "ab") as log:
            worker = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            control = TimedControl(f"http://127.0.0.1:{port}", timeout_s=120)
            wait_running(control.url, worker)
            backend = LocalVolumeBackend(data, snaps, control)
            for i in range(args.runs):
                feed(broker.bootstrap, args.feed)
                wait_running(control.url, worker, input_end=(i + 1) * args.feed)
                start = time.perf_counter()
                snap = backend.snapshot(0)
                total = time.perf_counter() - start
                results.append({"pause_s": control.resumed - control.pause_sent, "total_s": total,
                                "snapshot_extra_bytes": own_bytes(Path(snap.location))})
        finally:
            worker.terminate()
            worker.wait(120)
    report = {"keys": args.keys, "feed_per_run": args.feed, "build_s": round(build_s, 1), "volume_bytes": volume_bytes,
              "runs": [{k: round(v, 4) for k, v in r.items()} for r in results],
              "max_pause_s": round(max(r["pause_s"] for r in results), 4)}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"keys={args.keys:,} build={build_s:.1f}s volume={volume_bytes / 1e6:.0f} MB "
              f"feed per run={args.feed:,}")
        for i, r in enumerate(results, 1):
            print(f"run {i}: worker pause {r['pause_s'] * 1000:.1f} ms, snapshot total "
                  f"{r['total_s'] * 1000:.1f} ms, snapshot's own (not hard-linked) bytes "
                  f"{r['snapshot_extra_bytes'] / 1e3:.0f} kB")
    if args.workdir is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
