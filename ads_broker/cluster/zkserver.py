"""Run a standalone ZooKeeper server from Debian's ``zookeeper`` package, as a child process.

Used by the cluster tests and ``ads-broker cluster up`` (:mod:`ads_broker.cluster.local`). No system
service is involved:
the server runs ``org.apache.zookeeper.server.ZooKeeperServerMain`` with a generated ``zoo.cfg``
in its own data directory on a loopback port, and is stopped by its PID. The data directory
outlives :meth:`ZooKeeperServer.kill`, so :meth:`ZooKeeperServer.start` again recovers the same
tree and the same sessions (a session resumes if its client reconnects before its timeout runs
out, counted again from the restart).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from ads_broker.cluster.exceptions import ZooKeeperUnavailableError
from ads_broker.embedded import free_port

# Debian's layout: the server jar's manifest lists its own dependencies (netty, jute, metrics ...);
# slf4j-simple is the logging binding (stderr), which goes to the server's log file.
ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
SLF4J_BINDING_JAR = Path("/usr/share/java/slf4j-simple.jar")
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"


def zookeeper_available() -> bool:
    """True when Debian's zookeeper package and a ``java`` are installed."""
    return ZOOKEEPER_JAR.exists() and shutil.which("java") is not None


def four_letter_word(host: str, port: int, word: str, timeout_s: float = 1.0) -> str:
    """Send one of ZooKeeper's four-letter commands (``srvr``, ``ruok``) and return the answer."""
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(word.encode())
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer:
    """One standalone ZooKeeper on ``127.0.0.1:port`` with its data in ``data_dir``.

    ``tick_ms`` sets ZooKeeper's ``tickTime``; sessions may ask for timeouts between 2 and 20
    ticks (ZooKeeper's defaults for ``minSessionTimeout``/``maxSessionTimeout``), so tests use a
    short tick to let a lost session expire in seconds.
    """

    def __init__(self, data_dir: Path, *, port: int | None = None, tick_ms: int = 250,
                 max_session_timeout_ms: int = 60000, start_timeout_s: float = 60.0) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        """The connect string without a chroot."""
        return f"127.0.0.1:{self.port}"

    def connect_string(self, chroot: str = "") -> str:
        """``127.0.0.1:PORT/chroot``, the form of ``zookeeper.connect``."""
        return self.hosts + (("/" + chroot.strip("/")) if chroot.strip("/") else "")

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ZooKeeperUnavailableError("ZooKeeper is not running")
        return self.proc.pid

    def _write_config(self) -> Path:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text(
            f"tickTime={self.tick_ms}\n"
            f"dataDir={self.data_dir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            f"minSessionTimeout={2 * self.tick_ms}\n"
            f"maxSessionTimeout={self.max_session_timeout_ms}\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=srvr,ruok,mntr,cons\n"
            # No periodic snapshot purge or fsync delay concerns here: test and dev clusters only.
            "maxClientCnxns=0\n"
        )
        return cfg

    def start(self) -> ZooKeeperServer:
        """Start the server (again, after :meth:`kill`/:meth:`stop`) and wait until it serves."""
        if not zookeeper_available():
            raise ZooKeeperUnavailableError(
                f"ZooKeeper is not installed ({ZOOKEEPER_JAR} or java missing): apt-get install zookeeper")
        if self.proc is not None and self.proc.poll() is None:
            return self
        cfg = self._write_config()
        classpath = f"{ZOOKEEPER_JAR}:{SLF4J_BINDING_JAR}"
        argv = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Dzookeeper.admin.enableServer=false", "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
                "-cp", classpath, MAIN_CLASS, str(cfg)]
        with (self.data_dir / "zookeeper.log").open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_serving()
        return self

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ZooKeeperUnavailableError(
                    f"ZooKeeper (pid {self.proc.pid}) exited with code {self.proc.returncode} on start; "
                    f"see {self.data_dir / 'zookeeper.log'}")
            with contextlib.suppress(OSError):
                if "Mode: standalone" in four_letter_word("127.0.0.1", self.port, "srvr"):
                    return
            time.sleep(0.05)
        self.kill()
        raise ZooKeeperUnavailableError(
            f"ZooKeeper on {self.hosts} not serving after {self.start_timeout_s:.0f}s; "
            f"see {self.data_dir / 'zookeeper.log'}")

    def kill(self) -> None:
        """SIGKILL by PID: no clean shutdown, sessions stay in the transaction log."""
        self._signal_and_wait(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL if it does not exit."""
        self._signal_and_wait(signal.SIGTERM)

    def _signal_and_wait(self, sig: signal.Signals) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)
        self.proc = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
