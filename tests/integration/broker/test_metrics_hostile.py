"""The Prometheus endpoint (``metrics.port``) against hostile HTTP clients, through a real broker
process: it shares the broker's process, so whatever a connection to it holds (a thread, a file
descriptor, a log line) is taken from the broker. Connections that never send a request must not
pile up threads and descriptors, and connections that break off must not write a traceback each
to the broker's log."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port

pytestmark = pytest.mark.timeout(120)

#: docs/BROKER.md ("Metrics"): the endpoint serves at most this many connections at once.
METRICS_MAX_CONNECTIONS = 16
IDLE = 120  # connections a client opens and never sends on; far above the limit
SLACK = 8


@contextmanager
def metrics_broker(tmp_path: Path) -> Iterator[tuple[BrokerProcess, int]]:
    port = free_port()
    config = {"metrics.port": str(port), "offsets.topic.num.partitions": "1",
              "transaction.state.log.num.partitions": "1"}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker:
        yield broker, port


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as resp:
        return resp.read().decode()


def threads_and_fds(pid: int) -> tuple[int, int]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["Threads"]), len(os.listdir(f"/proc/{pid}/fd"))


def connections_held(pid: int, port: int) -> int:
    """TCP connections on local ``port`` (not the listening socket) whose socket the broker holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    held = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            state, inode = fields[3], fields[9]
            if int(fields[1].rsplit(":", 1)[1], 16) == port and state != "0A" and inode in inodes:  # 0A: LISTEN
                held += 1
    return held


def wait_until_released(pid: int, port: int) -> None:
    """Until the broker holds no connection on ``port``: every connection's handling is over."""
    deadline = time.monotonic() + 30
    while (held := connections_held(pid, port)) > 0:
        assert time.monotonic() < deadline, f"the broker still holds {held} connections on port {port}"
        time.sleep(0.05)


def closed_by_broker(sock: socket.socket) -> bool:
    """True once the broker closed ``sock`` (EOF or reset); False while it is held open."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_idle_connections_are_bounded_and_refused_beyond_the_limit(tmp_path: Path) -> None:
    """``IDLE`` connections that send nothing: the endpoint holds at most
    METRICS_MAX_CONNECTIONS of them (one thread and descriptor each) and closes the others at
    accept, so the broker's threads and descriptors stay bounded; once they go, a scrape works."""
    with metrics_broker(tmp_path) as (broker, port):
        assert "kafka_server_replicamanager_partitioncount" in scrape(port)
        base_threads, base_fds = threads_and_fds(broker.pid)
        conns = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(IDLE)]
        try:
            most_held, most_threads, most_fds = 0, base_threads, base_fds
            deadline = time.monotonic() + 30
            closed: set[int] = set()
            while len(closed) < IDLE - METRICS_MAX_CONNECTIONS:
                held = connections_held(broker.pid, port)
                threads, fds = threads_and_fds(broker.pid)
                most_held, most_threads, most_fds = max(most_held, held), max(most_threads, threads), max(most_fds, fds)
                assert time.monotonic() < deadline, (
                    f"the endpoint held {IDLE - len(closed)} idle connections open (broker threads "
                    f"{base_threads} -> {threads}, descriptors {base_fds} -> {fds})")
                closed |= {i for i, c in enumerate(conns) if i not in closed and closed_by_broker(c)}
            assert max(most_held, connections_held(broker.pid, port)) <= METRICS_MAX_CONNECTIONS
            # A thread and a descriptor per held connection, plus the broker's own (its writer
            # threads start on demand; a checkpoint opens a file): never one per connection sent.
            threads, fds = threads_and_fds(broker.pid)
            assert max(most_threads, threads) <= base_threads + METRICS_MAX_CONNECTIONS + SLACK
            assert max(most_fds, fds) <= base_fds + METRICS_MAX_CONNECTIONS + SLACK
        finally:
            for c in conns:
                c.close()
        deadline = time.monotonic() + 30
        while True:  # the held connections' threads see the close and free their slots
            try:
                text = scrape(port)
                break
            except OSError:
                assert time.monotonic() < deadline, "no scrape served after the idle connections closed"
        assert "kafka_server_replicamanager_partitioncount" in text
        assert broker.proc is not None and broker.proc.poll() is None


def test_broken_off_requests_do_not_write_a_traceback_each(tmp_path: Path) -> None:
    """Clients that send half a request line and reset the connection: the broker's log (its
    structured JSON on stderr) gets no traceback per connection, only aggregated rejection lines."""
    resets = 40
    with metrics_broker(tmp_path) as (broker, port):
        for _ in range(resets):
            sock = socket.create_connection(("127.0.0.1", port), timeout=20)
            sock.sendall(b"GET /metr")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            sock.close()
        wait_until_released(broker.pid, port)
        assert "kafka_server_replicamanager_partitioncount" in scrape(port)
        wait_until_released(broker.pid, port)
        deadline = time.monotonic() + 30
        while (counted := failures_logged(tmp_path / "broker.log")) < resets:  # the aggregated lines' counts
            assert time.monotonic() < deadline, f"{counted} of {resets} failed connections counted in the log"
            time.sleep(0.2)
    log = (tmp_path / "broker.log").read_text()
    assert log.count("Traceback") == 0, log[-3000:]
    assert "Exception occurred during processing of request" not in log
    assert failures_logged(tmp_path / "broker.log") == resets
    assert log.count('"metrics request failed"') < resets  # aggregated, not a line each


def failures_logged(log_path: Path) -> int:
    """The failed metrics connections the broker's JSON log accounts for (sum of ``count``)."""
    total = 0
    for line in log_path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("event") == "metrics request failed":
                total += int(entry.get("count", 0))
    return total


def test_a_metrics_address_that_cannot_be_served_is_named_at_start(tmp_path: Path) -> None:
    """A ``metrics.port`` another process holds, or a ``metrics.host`` that does not resolve: the
    broker stops at start with the setting and its value, not a bare OS error that could be the
    Kafka listener's."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for host, error in (("127.0.0.1", "Address already in use"), ("no-such-host.invalid", "")):
            argv = [sys.executable, "-m", "ads_broker", "serve", "--data-dir", str(tmp_path / "data"),
                    "--listen", f"127.0.0.1:{free_port()}", "--override", f"metrics.port={port}",
                    "--override", f"metrics.host={host}", "--override", "offsets.topic.num.partitions=1",
                    "--override", "transaction.state.log.num.partitions=1"]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            assert out.returncode == 1, out.stderr[-2000:]
            last = out.stderr.strip().splitlines()[-1]
            assert f"metrics.host={host}" in last and f"metrics.port={port}" in last and error in last, last


def test_an_oversized_request_head_is_cut_and_answered(tmp_path: Path) -> None:
    """METRICS_MAX_CONNECTIONS clients each send a request head of ~1 MiB (header lines of 60 KB,
    never the blank line that ends it): http.server would keep reading up to 100 such lines
    (6.5 MB per connection, all held in memory) and wait for the end; the endpoint reads at most
    16 KiB of a head (what the bytes a connection pins are bounded by), answers what it has, and
    closes."""
    pad = b"X-Pad: " + b"a" * 60_000 + b"\r\n"
    with metrics_broker(tmp_path) as (broker, port):
        scrape(port)
        conns = []
        for _ in range(METRICS_MAX_CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=20)
            sock.settimeout(5)
            with contextlib.suppress(TimeoutError):  # the broker stopped reading: the rest stays unread
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + pad * 16)
            conns.append(sock)
        for sock in conns:
            sock.settimeout(20)
            answer = bytearray()
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except TimeoutError:
                pytest.fail(f"no answer to an unfinished {len(pad) * 16}-byte request head: the endpoint "
                            "is still reading it")
            except ConnectionResetError:  # the broker closed with unread bytes; the answer came before
                pass
            finally:
                sock.close()
            # An answer, not a close when the connection's deadline passes while the head is unfinished.
            assert answer.startswith(b"HTTP/1.0 "), bytes(answer[:200])
        assert "kafka_server_replicamanager_partitioncount" in scrape(port)
        assert broker.proc is not None and broker.proc.poll() is None
