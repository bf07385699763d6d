"""The main job (`make run`): embedded ads-broker, load generator, workers, verified summary.

Starts ads-broker in a data dir, creates the topics, starts one worker process per core (each
serving a range of partitions), runs the load generator with a known duplicate rate, shows live
progress, and finishes by reading the output topic back: exit status 0 only if the output is
exactly the unique input and every malformed event is in the dead-letter topic.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from rich.console import Console
from rich.table import Table

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from dedupe_worker.kafka import consumer_config, create_topics
from dedupe_worker.loadgen import LoadManifest, LoadSpec, plan, send
from dedupe_worker.progress import ProgressView, logfmt, stdout_is_tty
from dedupe_worker.records import classify

#: seconds between two progress lines when stdout is not a terminal (a terminal gets a live table)
PROGRESS_INTERVAL_S = 10.0
_SAMPLE = re.compile(r'^dedupe_messages_total\{partition="(\d+)",result="(\w+)"\} ([0-9.e+]+)$', re.MULTILINE)


@dataclass
class DemoResult:
    """What the demo did; the audit step reads the same topics over the same time window."""

    bootstrap: str
    input_topic: str
    output_topic: str
    dlq_topic: str
    partitions: int
    start_ms: int
    end_ms: int
    data_dir: str
    sent: int
    unique: int
    duplicates_sent: int
    malformed_sent: int
    output: int = 0
    output_duplicates: int = 0
    missing: int = 0
    dead_lettered: int = 0
    duplicates_dropped: int = 0
    seconds: float = 0.0
    ok: bool = False
    counts: dict[str, float] = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0


def _scrape(ports: list[int]) -> dict[str, float]:
    totals: dict[str, float] = {"new": 0.0, "duplicate": 0.0, "invalid": 0.0}
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            continue
        for _, result, value in _SAMPLE.findall(text):
            totals[result] = totals.get(result, 0.0) + float(value)
    return totals


def _read_topic(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    c = Consumer(consumer_config(bootstrap, f"demo-verify-{time.monotonic_ns()}", None,
                                 **{"enable.partition.eof": True}))
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[Any] = []
    eof: set[int] = set()
    try:
        while len(eof) < partitions:
            for m in c.consume(10_000, 0.2):
                err = m.error()
                if err is None:
                    out.append(m)
                elif err.code() == KafkaError._PARTITION_EOF:
                    eof.add(int(m.partition() or 0))
    finally:
        c.close()
    return out


def _start_workers(bootstrap: str, data_dir: Path, partitions: int, processes: int, group: str,
                   log_dir: Path) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    per = [list(range(partitions))[i::processes] for i in range(processes)]
    for i, parts in enumerate(p for p in per if p):
        port = free_port()
        argv = [sys.executable, "-m", "dedupe_worker", "run", "--bootstrap", bootstrap,
                "--partitions", ",".join(map(str, parts)), "--data-dir", str(data_dir / "workers"),
                "--metrics-port", str(port), "--group", group, "--log-level", "WARNING"]
        with open(log_dir / f"worker-{i}.log", "ab") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        ports.append(port)
    return procs, ports


def _table(res: DemoResult, counts: dict[str, float], elapsed: float) -> Table:
    done = sum(counts.values())
    t = Table(title="dedupe demo (embedded ads-broker)")
    for col in ("consumed", "new", "duplicates", "dead letters", "lag", "msg/s"):
        t.add_column(col, justify="right")
    t.add_row(f"{int(done):,}", f"{int(counts['new']):,}", f"{int(counts['duplicate']):,}",
              f"{int(counts['invalid']):,}", f"{int(res.sent - done):,}", f"{done / max(elapsed, 1e-3):,.0f}")
    return t


def run_demo(unique: int = 50_000, duplicate_rate: float = 0.006, partitions: int = 4,
             processes: int | None = None, data_dir: Path | None = None, timeout_s: float = 300.0,
             audit: Callable[[DemoResult], None] | None = None, console: Console | None = None) -> DemoResult:
    """Run the demo end to end; ``audit`` (if given) runs while the broker still serves the topics."""
    console = console or Console()
    processes = processes or os.cpu_count() or 1
    base = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="dedupe-demo-"))
    root = base / time.strftime("run-%Y%m%d-%H%M%S")  # a fresh broker and fresh volumes every run
    root.mkdir(parents=True, exist_ok=False)
    records, manifest = plan(LoadSpec(unique=unique, duplicate_rate=duplicate_rate, malformed_rate=0.0005,
                                      mean_gap_events=2000, seed=int(time.time())))
    broker = ads_broker_process(root / "broker", log_path=root / "broker.log")
    with broker:
        return _run(broker, root, records, manifest, partitions, processes, timeout_s, audit, console)


def _run(broker: BrokerProcess, root: Path, records: list[tuple[bytes | None, bytes | None]],
         manifest: LoadManifest, partitions: int, processes: int, timeout_s: float,
         audit: Callable[[DemoResult], None] | None, console: Console) -> DemoResult:
    suffix = time.strftime("%Y%m%d%H%M%S")
    create_topics(broker.bootstrap, {"events": partitions})
    create_topics(broker.bootstrap, {"events.deduped": partitions, "events.dlq": partitions}, durable=True)
    start_ms = int(time.time() * 1000)
    res = DemoResult(broker.bootstrap, "events", "events.deduped", "events.dlq", partitions, start_ms, 0,
                     str(root), manifest.sent, len(manifest.unique_ids), manifest.duplicates,
                     sum(manifest.malformed.values()))
    procs, ports = _start_workers(broker.bootstrap, root, partitions, processes, f"demo-{suffix}", root)
    started = time.monotonic()
    sender = threading.Thread(target=send, args=(broker.bootstrap, "events", records, manifest), daemon=True)
    sender.start()
    counts = _scrape(ports)

    def line(c: dict[str, float]) -> dict[str, Any]:
        done = sum(c.values())
        return {"consumed": int(done), "of": res.sent, "new": int(c["new"]), "duplicate": int(c["duplicate"]),
                "invalid": int(c["invalid"]), "msgs_per_s": round(done / max(time.monotonic() - started, 1e-3))}

    view = ProgressView(lambda: counts, lambda c: _table(res, c, time.monotonic() - started), line,
                        lambda f: print(logfmt("dedupe progress", f), flush=True), interval_s=PROGRESS_INTERVAL_S,
                        console=console, tty=console.is_terminal and stdout_is_tty())
    try:
        with view:
            while sum(counts.values()) < res.sent and time.monotonic() - started < timeout_s:
                if any(p.poll() is not None for p in procs):
                    raise SystemExit(f"a worker exited early; see {root}/worker-*.log")
                time.sleep(0.25)
                counts = _scrape(ports)
                view.update()
        res.seconds = time.monotonic() - started
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    sender.join(5)
    res.end_ms = int(time.time() * 1000)
    res.counts = counts
    _verify(res, manifest)
    _summary(res, console)
    if audit is not None:
        audit(res)
    return res


def _verify(res: DemoResult, manifest: LoadManifest) -> None:
    out = _read_topic(res.bootstrap, res.output_topic, res.partitions)
    seen: dict[str, int] = {}
    for m in out:
        mid = classify(m.key(), m.value()).message_id or ""
        seen[mid] = seen.get(mid, 0) + 1
    res.output = len(out)
    res.output_duplicates = sum(n - 1 for n in seen.values())
    res.missing = len(set(manifest.unique_ids) - set(seen))
    res.dead_lettered = len(_read_topic(res.bootstrap, res.dlq_topic, res.partitions))
    res.duplicates_dropped = int(res.counts.get("duplicate", 0))
    res.ok = (res.output == res.unique and res.output_duplicates == 0 and res.missing == 0
              and res.dead_lettered == res.malformed_sent)


def _summary(res: DemoResult, console: Console) -> None:
    t = Table(title="summary (verified by reading the output topic back)")
    t.add_column("what")
    t.add_column("count", justify="right")
    for name, value in (("messages in", res.sent), ("unique messageIds", res.unique),
                        ("duplicates sent", res.duplicates_sent), ("duplicates dropped", res.duplicates_dropped),
                        ("published (output)", res.output), ("dead-lettered", res.dead_lettered),
                        ("malformed sent", res.malformed_sent), ("duplicates in output", res.output_duplicates),
                        ("missing from output", res.missing)):
        t.add_row(name, f"{value:,}")
    t.add_row("time", f"{res.seconds:.1f} s")
    t.add_row("throughput", f"{res.msgs_per_s:,.0f} msg/s")
    console.print(t)
    console.print("[green]OK: output is exactly the unique input[/green]" if res.ok
                  else "[red]FAILED: output differs from the unique input[/red]")


def audit_demo(res: DemoResult, out_dir: Path | None = None) -> dict[str, Any]:
    """The nightly audit, run on the demo's own topics and time window (Spark ``local[2]``)."""
    import json
    from datetime import UTC, datetime

    from spark_audit.api import run_audit
    from spark_audit.progress import audit_progress

    out_dir = out_dir or Path("reports") / time.strftime("demo-%Y%m%d-%H%M%S")
    window = (datetime.fromtimestamp(res.start_ms / 1000 - 1, tz=UTC),
              datetime.fromtimestamp(res.end_ms / 1000 + 1, tz=UTC))
    if stdout_is_tty():  # off a terminal the periodic 'audit progress' lines say it
        print(f"audit: Spark local[2] reads {res.input_topic}, {res.output_topic} and {res.dlq_topic} and "
              "compares them (a minute or two)", flush=True)
    with audit_progress(PROGRESS_INTERVAL_S, emit=lambda f: print(logfmt("audit progress", f), flush=True)):
        report_path = run_audit(res.bootstrap, res.input_topic, res.output_topic, out_dir, window=window,
                                dlq_topic=res.dlq_topic, master="local[2]")
    report: dict[str, Any] = json.loads(report_path.read_text())
    print(f"audit: input {report['input_messages']:,} ({report['input_duplicates']:,} duplicates), "
          f"output {report['output_messages']:,}, leaked duplicates {report['output_duplicates']}, "
          f"missing {report['missing']}, dead-lettered {report['dead_lettered']}")
    print(f"audit report: {report_path.parent.resolve() / 'index.html'} (and report.json beside it)")
    return report


def main() -> None:
    reports: list[dict[str, Any]] = []
    res = run_demo(data_dir=Path(os.environ["DEDUPE_DEMO_DIR"]) if os.environ.get("DEDUPE_DEMO_DIR") else None,
                   audit=lambda r: reports.append(audit_demo(r)))
    audited_ok = bool(reports) and reports[0]["output_duplicates"] == 0 and reports[0]["missing"] == 0
    sys.exit(0 if res.ok and audited_ok else 1)


if __name__ == "__main__":
    main()
