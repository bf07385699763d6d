"""A child process whose stdout and stderr are a real pseudo-terminal (what a user's shell gives it),
for tests of what commands draw on a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from types import TracebackType

#: CSI and OSC escape sequences (colours, cursor moves, erase line)
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]")


class PtyProcess:
    """``argv`` on a pseudo-terminal of ``columns`` x ``rows``; stopped (by PID) on exit."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, columns: int = 160,
                 rows: int = 50) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        environ = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(rows),
                   **(env or {})}
        for var in ("NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
            environ.pop(var, None)
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=environ, close_fds=True)
        os.close(slave)
        self.master = master
        self.raw = ""

    def _pump(self, timeout_s: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout_s)
        if not ready:
            return
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the child closed the terminal
            data = b""
        self.raw += data.decode("utf-8", errors="replace")

    @property
    def screen(self) -> str:
        """Everything written so far, escape sequences removed (successive redraws one after another)."""
        return ANSI.sub("", self.raw).replace("\r", "")

    def read_until(self, done: Callable[[str], object], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while not done(self.screen):
            if self.proc.poll() is not None:
                self._pump(0.1)
                if done(self.screen):
                    break
                raise AssertionError(f"exited with {self.proc.returncode}:\n{self.screen[-3000:]}")
            assert time.monotonic() < deadline, f"not there after {timeout_s}s:\n{self.screen[-3000:]}"
            self._pump(0.2)
        return self.screen

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, f"still running after {timeout_s}s:\n{self.screen[-3000:]}"
            self._pump(0.2)
        self._pump(0)
        return int(self.proc.returncode)

    def __enter__(self) -> PtyProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        os.close(self.master)
