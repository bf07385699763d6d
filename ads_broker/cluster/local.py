"""``ads-broker cluster up/down/status``: a development cluster on this machine.

One standalone ZooKeeper (Debian's ``zookeeper`` package, :mod:`ads_broker.cluster.zkserver`) and
``--brokers`` ``ads-broker serve`` processes in cluster mode, each with its own data directory and
log under one root directory, all on 127.0.0.1. The processes run in their own sessions, so they
outlive the command that started them (and a closed terminal); their PIDs, ports and directories
are kept in ``<root>/cluster.json``. ``down`` stops them by those PIDs, brokers first (SIGTERM: a
controlled shutdown moves each broker's leaderships away before it leaves), then ZooKeeper, and
never signals a PID whose command line no longer names its directory (the process is gone and its
PID was reused). The data stays: ``up`` on the same root starts the same cluster again.

Each broker always has a PLAINTEXT listener (``port``: inter-broker traffic and ``up``'s own
checks go there); ``--listener SASL_SSL`` (repeatable) adds a listener of that name to every broker
on a port of its own, kept in ``cluster.json`` as the broker's ``endpoints`` next to the PLAINTEXT
one. The security settings those listeners need (``ssl.*``, ``sasl.enabled.mechanisms``, ...) come
with ``--override`` or a ``--config`` properties file, both given to every broker.

For a cluster across hosts, run ``ads-broker serve`` with ``zookeeper.connect`` on each host
(docs/CLUSTER.md); this is the one-machine shape the tests and ``make compat`` use.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ads_broker.cluster.exceptions import ClusterError
from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.embedded import free_port, wait_for_port

STATE_FILE = "cluster.json"
#: The ZooKeeper chroot of the cluster (Kafka's habit: one chroot per cluster).
CHROOT = "ads"


@dataclass
class Member:
    """One process of the cluster: what to signal, and how to tell it is still ours."""

    name: str
    pid: int
    port: int
    directory: str  # named on its command line (the broker's --data-dir, ZooKeeper's zoo.cfg path)
    log: str
    #: a broker's listeners: name -> HOST:PORT, PLAINTEXT (= ``port``) first; empty for ZooKeeper
    endpoints: dict[str, str] = field(default_factory=dict)

    def alive(self) -> bool:
        """The PID runs and its command line still names our directory (not a reused PID)."""
        try:
            argv = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return False
        zombie = any(line.startswith("State:") and "Z" in line.split()[1] for line in status.splitlines())
        return not zombie and self.directory.encode() in argv  # a whole argument: not broker-1 in broker-10

    def stop(self, timeout_s: float) -> bool:
        """SIGTERM, then SIGKILL after ``timeout_s``; True when it exited on SIGTERM."""
        if not self.alive():
            return True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        if _wait_gone(self, timeout_s):
            return True
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            _wait_gone(self, 10.0)
        return False


def _wait_gone(member: Member, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # Our own child (up and down in one process, as the tests do): reap it, or it stays a zombie.
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(member.pid, os.WNOHANG)
        if not member.alive():
            return True
        time.sleep(0.05)
    return False


@dataclass
class ClusterState:
    cluster_id: str
    zookeeper_connect: str
    zookeeper: Member | None  # None: an external ZooKeeper (--zookeeper), not ours to stop
    brokers: list[Member] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers)

    @property
    def listener_names(self) -> list[str]:
        """The listeners every broker has, PLAINTEXT first."""
        return list(self.brokers[0].endpoints) if self.brokers and self.brokers[0].endpoints else ["PLAINTEXT"]

    def bootstrap_for(self, listener: str) -> str:
        """``bootstrap.servers`` for the clients of ``listener`` (every broker's endpoint of it)."""
        if listener.upper() == "PLAINTEXT":
            return self.bootstrap
        missing = [b.name for b in self.brokers if listener.upper() not in b.endpoints]
        if missing or not self.brokers:
            raise ClusterError(f"no {listener.upper()} listener on {', '.join(missing) or 'any broker'}; "
                               f"the cluster's listeners: {', '.join(self.listener_names)}")
        return ",".join(b.endpoints[listener.upper()] for b in self.brokers)

    def save(self, root: Path) -> None:
        tmp = root / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(root / STATE_FILE)

    @classmethod
    def load(cls, root: Path) -> ClusterState | None:
        path = root / STATE_FILE
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text())
            zk = Member(**raw["zookeeper"]) if raw.get("zookeeper") else None
            return cls(raw["cluster_id"], raw["zookeeper_connect"], zk, [Member(**b) for b in raw["brokers"]])
        except (ValueError, KeyError, TypeError) as e:
            raise ClusterError(f"{path} is not a cluster state file ({e}); remove it if no cluster runs "
                               "from this directory") from e


#: A listener name as Kafka takes it (``ListenerName``: letters, digits, underscores).
_LISTENER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def check_listeners(names: list[str] | tuple[str, ...]) -> list[str]:
    """The extra listener names, upper case, in order; a clear ClusterError for a bad or repeated one.
    PLAINTEXT is every broker's own and cannot be added again."""
    out: list[str] = []
    for raw in names:
        name = raw.strip().upper()
        if not _LISTENER_NAME.fullmatch(name):
            raise ClusterError(f"--listener {raw!r}: a listener name is letters, digits and underscores "
                               "(SSL, SASL_SSL, SASL_PLAINTEXT, or a name in listener.security.protocol.map)")
        if name == "PLAINTEXT":
            raise ClusterError("--listener PLAINTEXT: every broker already has its PLAINTEXT listener")
        if name in out:
            raise ClusterError(f"--listener {name} given twice")
        out.append(name)
    return out


def _listener_ports(listeners: list[str], brokers: int, base_port: int | None, old: ClusterState | None,
                    broker_index: int) -> dict[str, int]:
    """Ports of one broker's extra listeners: BASE_PORT + (j * brokers) + i for the j-th listener
    (after the PLAINTEXT block), else the port it had in the last ``up``, else a free one."""
    name = f"broker-{broker_index + 1}"
    previous = next((b.endpoints for b in old.brokers if b.name == name), {}) if old is not None else {}
    ports: dict[str, int] = {}
    for j, listener in enumerate(listeners, start=1):
        if base_port is not None:
            ports[listener] = base_port + j * brokers + broker_index
        elif listener in previous:
            ports[listener] = int(previous[listener].rsplit(":", 1)[1])
        else:
            ports[listener] = free_port()
    return ports


def up(root: Path, *, brokers: int = 3, base_port: int | None = None, zookeeper: str | None = None,
       overrides: dict[str, str] | None = None, listeners: list[str] | tuple[str, ...] = (),
       config_file: Path | None = None, start_timeout_s: float = 60.0) -> ClusterState:
    """Start ZooKeeper (unless ``zookeeper`` names one) and ``brokers`` brokers under ``root``;
    returns once every broker is registered and answers Metadata with all of them.

    ``listeners``: names of listeners each broker gets besides PLAINTEXT, each on a port of its own
    (``cluster.json`` lists them); ``overrides`` and ``config_file`` go to every broker."""
    if brokers < 1:
        raise ClusterError(f"--brokers must be at least 1, got {brokers}")
    extra = check_listeners(listeners)
    if "listeners" in (overrides or {}):
        raise ClusterError("--override listeners=...: the cluster chooses each broker's ports; name the "
                           "listeners besides PLAINTEXT with --listener (repeatable) instead")
    if config_file is not None and not config_file.is_file():
        raise ClusterError(f"--config {config_file}: no such file")
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    old = ClusterState.load(root)
    if old is not None:
        running = [m for m in [old.zookeeper, *old.brokers] if m is not None and m.alive()]
        if running:
            raise ClusterError(
                f"a cluster already runs from {root} ({', '.join(f'{m.name} pid {m.pid}' for m in running)}); "
                f"stop it with `ads-broker cluster down --dir {root}` first")
    cluster_id = old.cluster_id if old is not None else f"ads-{uuid.uuid4().hex[:12]}"
    zk_member: Member | None = None
    if zookeeper is None:
        zk_dir = root / "zookeeper"
        server = ZooKeeperServer(zk_dir, port=old.zookeeper.port if old and old.zookeeper else None,
                                 tick_ms=2000 // 4, max_session_timeout_ms=60000).start()
        zk_member = Member("zookeeper", server.pid, server.port, str(zk_dir / "zoo.cfg"),
                           str(zk_dir / "zookeeper.log"))
        zk_connect = server.connect_string(CHROOT)
    else:
        zk_connect = zookeeper
    state = ClusterState(cluster_id, zk_connect, zk_member)
    state.save(root)
    try:
        old_ports = {b.name: b.port for b in old.brokers} if old is not None else {}
        for i in range(brokers):
            broker_id = i + 1
            name = f"broker-{broker_id}"
            port = base_port + i if base_port is not None else old_ports.get(name) or free_port()
            endpoints = {"PLAINTEXT": port, **_listener_ports(extra, brokers, base_port, old, i)}
            _start_broker(root, broker_id, endpoints, state, overrides or {}, config_file, start_timeout_s)
        _wait_registered(state, brokers, start_timeout_s)
    except BaseException:
        down(root)
        raise
    return state


def _start_broker(root: Path, broker_id: int, ports: dict[str, int], state: ClusterState,
                  overrides: dict[str, str], config_file: Path | None, start_timeout_s: float) -> None:
    """Start one broker and record it in the state file before waiting for it, so an interrupted
    ``up`` (Ctrl-C, a failure) leaves nothing that ``down`` does not know of. ``ports``: listener
    name -> port, PLAINTEXT first."""
    data_dir = root / f"broker-{broker_id}"
    log_path = root / f"broker-{broker_id}.log"
    endpoints = {name: f"127.0.0.1:{p}" for name, p in ports.items()}
    argv = [sys.executable, "-m", "ads_broker", "serve", "--data-dir", str(data_dir)]
    if config_file is not None:
        argv += ["--config", str(config_file.resolve())]
    settings = {"broker.id": str(broker_id), "cluster.id": state.cluster_id,
                "zookeeper.connect": state.zookeeper_connect, **overrides,
                # Given as an override, not --listen, so that a listeners= line in --config cannot win.
                "listeners": ",".join(f"{name}://{addr}" for name, addr in endpoints.items())}
    for key, value in settings.items():
        argv += ["--override", f"{key}={value}"]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    state.brokers.append(Member(f"broker-{broker_id}", proc.pid, ports["PLAINTEXT"], str(data_dir), str(log_path),
                                endpoints))
    state.save(root)
    for addr in endpoints.values():
        try:
            wait_for_port("127.0.0.1", int(addr.rsplit(":", 1)[1]), start_timeout_s, proc)
        except Exception as e:
            raise ClusterError(f"broker {broker_id} did not start on {addr}: {e}; see {log_path}") from e


def _wait_registered(state: ClusterState, count: int, timeout_s: float) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": state.bootstrap})
    deadline = time.monotonic() + timeout_s
    seen: list[int] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            seen = sorted(admin.list_topics(timeout=5).brokers)
            if len(seen) == count:
                return
        for b in state.brokers:
            if not b.alive():
                raise ClusterError(f"{b.name} (pid {b.pid}) exited while the cluster started; see {b.log}")
        time.sleep(0.2)
    raise ClusterError(f"only brokers {seen} of {count} registered within {timeout_s:.0f}s; "
                       f"see the logs under {Path(state.brokers[0].log).parent}")


def down(root: Path, timeout_s: float = 60.0) -> list[str]:
    """Stop the cluster started from ``root``: brokers (controlled shutdown), then ZooKeeper.
    Returns one line per process saying how it ended."""
    root = root.resolve()
    state = ClusterState.load(root)
    if state is None:
        raise ClusterError(f"no cluster was started from {root} (no {STATE_FILE})")
    lines = []
    # Brokers one at a time: each controlled shutdown moves its leaderships to brokers still up.
    for b in reversed(state.brokers):
        if not b.alive():
            lines.append(f"{b.name}: not running")
            continue
        clean = b.stop(timeout_s)
        lines.append(f"{b.name} (pid {b.pid}): " + ("stopped" if clean else f"killed after {timeout_s:.0f}s"))
    if state.zookeeper is not None:
        zk = state.zookeeper
        if zk.alive():
            clean = zk.stop(15.0)
            lines.append(f"zookeeper (pid {zk.pid}): " + ("stopped" if clean else "killed after 15s"))
        else:
            lines.append("zookeeper: not running")
    # Kept with no PIDs: `up` on this root starts the same cluster (id, ports) again.
    for m in [state.zookeeper, *state.brokers]:
        if m is not None:
            m.pid = 0
    state.save(root)
    return lines


def status(root: Path) -> tuple[ClusterState, list[str]]:
    """The cluster started from ``root`` and one line per process (running or not)."""
    root = root.resolve()
    state = ClusterState.load(root)
    if state is None:
        raise ClusterError(f"no cluster was started from {root} (no {STATE_FILE})")
    lines = []
    for m in [state.zookeeper, *state.brokers]:
        if m is None:
            lines.append(f"zookeeper: external, {state.zookeeper_connect}")
        elif m.alive():
            lines.append(f"{m.name}: running, pid {m.pid}, {_addresses(m)}, log {m.log}")
        else:
            lines.append(f"{m.name}: not running ({_addresses(m)}, log {m.log})")
    return state, lines


def _addresses(member: Member) -> str:
    """``127.0.0.1:9092`` (ZooKeeper, a broker with PLAINTEXT only) or ``PLAINTEXT://...,SSL://...``."""
    if len(member.endpoints) <= 1:
        return f"127.0.0.1:{member.port}"
    return ",".join(f"{name}://{addr}" for name, addr in member.endpoints.items())
