"""Run Debian's `kcat` (librdkafka's CLI client, another librdkafka than confluent-kafka's) as a
subprocess: one-shot runs, and long-running group members read line by line."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

RUN_TIMEOUT_S = 60


@dataclass(frozen=True)
class KcatRecord:
    """One record as kcat's `-J` consumer output shows it."""

    partition: int
    offset: int
    key: str | None
    value: str | None
    headers: tuple[tuple[str, str], ...]

    @classmethod
    def from_json(cls, line: str) -> KcatRecord:
        d = json.loads(line)
        flat = d.get("headers") or []
        headers = tuple(zip(flat[::2], flat[1::2], strict=True))
        return cls(d["partition"], d["offset"], d["key"], d["payload"], headers)


def run(kcat: str, bootstrap: str, args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run kcat to completion; fail the test with its stderr unless it exits 0 without an error line."""
    argv = [kcat, "-b", bootstrap, *args]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    # kcat's own "% ERROR: ..." and "Delivery failed" lines; librdkafka's transient connection logs pass.
    errors = [ln for ln in proc.stderr.splitlines() if "ERROR" in ln or "Delivery failed" in ln]
    assert proc.returncode == 0 and not errors, f"{argv} exited {proc.returncode}:\n{proc.stderr}"
    return proc


def consume_json(kcat: str, bootstrap: str, topic: str, *extra: str) -> list[KcatRecord]:
    """Every record of ``topic`` from the beginning to the end of each partition (`-C -o beginning -e -J`)."""
    proc = run(kcat, bootstrap, ["-C", "-t", topic, "-o", "beginning", "-e", "-J", *extra])
    return [KcatRecord.from_json(ln) for ln in proc.stdout.splitlines() if ln.strip()]


@dataclass
class KcatMember:
    """A `kcat -G` group member running in the background; its output is collected by two threads."""

    kcat: str
    bootstrap: str
    group: str
    topic: str
    extra: Sequence[str] = ()
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    _proc: subprocess.Popen[str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> KcatMember:
        # -u: unbuffered output, so each record is seen as soon as kcat consumes it.
        argv = [self.kcat, "-b", self.bootstrap, "-G", self.group, "-J", "-u",
                "-X", "auto.offset.reset=earliest", *self.extra, self.topic]
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None and self._proc.stderr is not None
        for stream, sink in ((self._proc.stdout, self.stdout), (self._proc.stderr, self.stderr)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()
        return self

    def _pump(self, stream: IO[str], sink: list[str]) -> None:
        for line in stream:
            with self._lock:
                sink.append(line.rstrip("\n"))

    def records(self) -> list[KcatRecord]:
        with self._lock:
            lines = list(self.stdout)
        return [KcatRecord.from_json(ln) for ln in lines if ln.startswith("{")]

    def assignments(self) -> list[set[int]]:
        """Every assignment this member was given, in order (kcat's "rebalanced ... assigned:" lines)."""
        with self._lock:
            lines = [ln for ln in self.stderr if "rebalanced" in ln and "assigned:" in ln]
        out = []
        for ln in lines:
            parts = ln.split("assigned:", 1)[1].split(",")
            out.append({int(p.split("[")[1].split("]")[0]) for p in parts if "[" in p})
        return out

    def describe(self) -> str:
        """kcat's stderr so far, for failure messages."""
        with self._lock:
            return "\n".join(self.stderr[-30:])

    def stop(self) -> None:
        """SIGINT: kcat closes its consumer (final commit, LeaveGroup) and exits."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)

    def __enter__(self) -> KcatMember:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = 45,
               context: Callable[[], str] = str) -> None:
    """Poll ``condition`` until it is true; fail naming ``what`` (and ``context()``) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{context()}")
        time.sleep(0.1)
