"""Run librdkafka's own integration suite against a fresh ads-broker (`make compat`).

librdkafka's source comes from the npm package @confluentinc/kafka-javascript, fetched and built by
compat/fetch_build.sh into a git-ignored cache. The test list is read from the fetched tests/test.c,
so a newer librdkafka brings its new tests without a change here; compat/exclusions names every test
number not run, with the reason.

Each test number runs in its own ``test-runner`` process (``TESTS=0nnn ./test-runner -p1 -E -L``)
under a wall-clock timeout, so a hang costs one test, not the run. ``-L`` leaves out the local
variants (librdkafka's mock cluster) of numbers that also have broker variants. Quick mode (``-Q``, --quick) is
not the default: besides using less data it skips every subtest not marked SUB_TEST_QUICK, which
leaves tests such as 0018 passing without having run anything. Tests of the ``noautocreate``
scenario run in a second pass against a second broker with ``auto.create.topics.enable=false``, as
librdkafka's own CI does with its trivup scenarios. A broker that dies is restarted and the test
that was running is failed with that reason.

Prints one line per test and a closing ``N passed, N failed`` line; exits 1 if any test that is not
excluded failed. Uses only the standard library; the broker runs under this interpreter
(``sys.executable -m ads_broker``), so run it with the project's virtualenv.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ads_broker.embedded import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from secure_listeners import OAUTHBEARER_PASSES, SECURITY_TESTS, SecurityFixture  # compat/ is no package

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent

# The Kafka release whose ApiVersions ads-broker's SUPPORTED_APIS table matches: JoinGroup v9
# (KIP-814) and Metadata v12 came with Kafka 3.2; nothing advertised needs a later release. The
# suite uses it to skip tests for newer brokers and to pick version-dependent expectations.
DEFAULT_KAFKA_VERSION = "3.2.0"

# Tests whose only version-dependent branch is Kafka 4.0's removal of Produce v0-v2 and message
# formats v0/v1 (KIP-896, KIP-724), which ads-broker follows (docs/COMPATIBILITY.md, "Produce
# v0-v2"): they run with TEST_KAFKA_VERSION=4.0.0, so the suite expects what Kafka 4.0 does (0052
# leaves out its `api.version.request=false` cases, 0092 skips itself) instead of Kafka 3.x's
# up-conversion. A --kafka-version of 4.0.0 or later is used as it is.
KIP_896_VERSION = "4.0.0"
KIP_896_TESTS = frozenset({"0052", "0092"})


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def kafka_version_for(number: str, default: str) -> str:
    """The TEST_KAFKA_VERSION test ``number`` runs with (see KIP_896_TESTS)."""
    if number in KIP_896_TESTS and version_tuple(default) < version_tuple(KIP_896_VERSION):
        return KIP_896_VERSION
    return default

# Settings of librdkafka's trivup scenarios (tests/scenarios/default.json): auto-created topics
# with 4 partitions. Replication factor 3 needs three brokers; a single node uses 1. Everything
# else stays at Kafka's defaults, as on trivup's clusters: group.initial.rebalance.delay.ms is
# Kafka's 3000 (ads-broker's own default is 100), or the first consumer of a group forms a
# generation alone and 0118's "closing consumer" callback runs in an ordinary rebalance instead.
#
# An authorizer that allows what no ACL restricts: 0081's ACL subtests (CreateAcls, DescribeAcls,
# DeleteAcls) expect NO_ERROR, which a Kafka broker without authorizer.class.name never answers
# (SECURITY_DISABLED, "No Authorizer is configured on the broker"), so the suite's brokers have
# one; with allow.everyone.if.no.acl.found=true every other test is allowed everything, as without.
BROKER_OVERRIDES = (
    "num.partitions=4",
    "default.replication.factor=1",
    "group.initial.rebalance.delay.ms=3000",
    "authorizer.class.name=kafka.security.authorizer.AclAuthorizer",
    "allow.everyone.if.no.acl.found=true",
)

# Numbers run once per SUBTESTS filter (the runner takes one substring of the subtest name), leaving
# out their subtests that need a broker feature ads-broker does not have: 0135's and 0142's share
# consumer cases (KIP-932 share groups, Kafka 4.2, like the [kip-932] exclusions; they also create
# their topics with replication factor 3), 0142's consumer case (replication factor 3: three
# brokers) and its OAUTHBEARER cases (which skip themselves with SCRAM). docs/COMPATIBILITY.md
# lists what each leaves out. COMPAT_SUBTESTS or --no-exclusions run the whole number.
SUBTEST_PASSES: dict[str, tuple[str, ...]] = {
    # 0126: what a single broker serves: every OIDC login that must fail (invalid and expired token
    # endpoints, a missing sub claim, Azure IMDS without its parameters) and the aws_iam cases; its
    # produce/consume cases create their topic with replication factor 3 (COMPAT_CLUSTER=3 adds
    # them), its share-consumer cases are KIP-932 and its JWT-bearer cases need a client private key.
    "0126": ("do_test_produce_consumer_with_OIDC_should_fail_invalid_token_endpoint:",
             "do_test_produce_consumer_with_OIDC_expired_token_should_fail:",
             "do_test_produce_consumer_with_OIDC_should_fail:", "do_test_OIDC_aws_iam_"),
    "0135": ("do_test:",),
    "0142": ("do_test_producer:", "do_test_txn_producer:", "do_test_reauth_failure:"),
}
#: Against ``--cluster 3`` (three brokers, SASL_SSL on each): the subtests that need replication factor 3 too.
CLUSTER_SUBTEST_PASSES: dict[str, tuple[str, ...]] = {
    "0126": (*SUBTEST_PASSES["0126"], "do_test_produce_consumer_with_OIDC:"),
    "0142": (*SUBTEST_PASSES["0142"], "do_test_consumer:"),
}

TEST_F_LOCAL = "TEST_F_LOCAL"
TEST_F_SOCKEM = "TEST_F_SOCKEM"
TEST_F_MANUAL = "TEST_F_MANUAL"


@dataclass(frozen=True, slots=True)
class SuiteTest:
    """One ``_TEST(...)`` entry of librdkafka's tests/test.c."""

    name: str  # e.g. 0045_subscribe_update_mock
    number: str  # e.g. 0045
    flags: frozenset[str]
    scenario: str  # "default" unless the entry names one (comma-separated list allowed)

    @property
    def local(self) -> bool:
        return TEST_F_LOCAL in self.flags

    def in_scenario(self, scenario: str) -> bool:
        return scenario in self.scenario.split(",")


@dataclass(slots=True)
class Result:
    """The outcome of one test number in one scenario."""

    key: str  # "0045" or "0045/noautocreate"
    status: str  # PASS, FAIL, SKIP (the runner skipped every variant), TIMEOUT, EXCLUDED
    seconds: float = 0.0
    reason: str = ""
    variants: dict[str, str] = field(default_factory=dict)  # test name -> PASSED/FAILED/SKIPPED
    log: str = ""


def parse_tests(test_c: Path) -> list[SuiteTest]:
    """The ``tests[]`` table of tests/test.c, in order (manual tests and <MAIN> left out)."""
    text = test_c.read_text(errors="replace")
    start = text.index("struct test tests[] = {")
    end = text.index("{NULL}};", start)
    table = re.sub(r"/\*.*?\*/", "", text[start:end], flags=re.S)
    out: list[SuiteTest] = []
    for m in re.finditer(r"_TEST\(\s*(\w+)\s*,(.*?)\)\s*,\s*(?=_TEST\(|#|$)", table + "\n", re.S):
        name, rest = m.group(1), m.group(2)
        flags = frozenset(re.findall(r"TEST_F_\w+", rest))
        sc = re.search(r'\.scenario\s*=\s*"([^"]*)"', rest)
        if TEST_F_MANUAL in flags:
            continue
        out.append(SuiteTest(name, name[:4], flags, sc.group(1) if sc else "default"))
    return out


def load_exclusions(path: Path) -> dict[str, str]:
    """``{key: reason}`` from compat/exclusions: ``NNNN[/scenario]  reason`` per line, # comments."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip() if raw.lstrip().startswith("#") else raw.strip()
        if not line:
            continue
        key, _, reason = line.partition(" ")
        if not re.fullmatch(r"\d{4}(/\w+)?", key) or not reason.strip():
            raise SystemExit(f"{path}: bad line (want 'NNNN[/scenario] reason'): {raw!r}")
        out[key] = reason.strip()
    return out


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Broker:
    """A fresh ads-broker subprocess on a free port with its own data dir, restartable. With
    ``security``, it also has an SSL and a SASL_SSL listener (on ports of their own) and the SASL
    user of :mod:`secure_listeners` in each data dir."""

    def __init__(self, workdir: Path, name: str, overrides: tuple[str, ...],
                 security: SecurityFixture | None = None) -> None:
        self.workdir = workdir / name
        self.overrides = overrides
        self.security = security
        self.ports = {"PLAINTEXT": free_port()}
        if security is not None:
            self.ports.update(SSL=free_port(), SASL_SSL=free_port(), SASL_PLAINTEXT=free_port())
        self.port = self.ports["PLAINTEXT"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def address(self, protocol: str) -> str:
        """The bootstrap address of the listener with this security protocol."""
        if protocol not in self.ports:
            raise SystemExit(f"compat: broker {self.workdir.name} has no {protocol} listener")
        return f"127.0.0.1:{self.ports[protocol]}"

    def start(self) -> None:
        self.starts += 1
        data = self.workdir / f"data{self.starts}"  # a restart after a crash starts empty too
        data.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "ads_broker", "serve", "--data-dir", str(data), "--log-level", "warning"]
        overrides = self.overrides
        if self.security is None:
            cmd += ["--listen", self.bootstrap]
        else:
            self.security.add_user(data)
            overrides = (*overrides, *self.security.broker_overrides(self.ports))
        for o in overrides:
            cmd += ["--override", o]
        log = open(self.workdir / f"broker{self.starts}.log", "wb")  # noqa: SIM115 (lives with proc)
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                     start_new_session=True)
        deadline = time.monotonic() + 120  # a loaded 2-core machine imports slowly
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"compat: broker exited with {self.proc.returncode} at start; "
                                 f"see {log.name}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"compat: broker did not listen on {self.bootstrap} within 120 s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Cluster:
    """``ads-broker cluster up`` (a ZooKeeper and ``size`` brokers) in place of one broker
    (``--cluster N``): for the suite's tests that need replication factor 3 (0103, 0107, 0111, and
    0142's consumer subtest). The same interface as :class:`Broker`; ``bootstrap`` names every
    broker. With ``security``, every broker also has an SSL and a SASL_SSL listener (``cluster up
    --listener``, ports from cluster.json) and the SASL user is added in the cluster's ZooKeeper."""

    def __init__(self, workdir: Path, name: str, overrides: tuple[str, ...], size: int,
                 security: SecurityFixture | None = None) -> None:
        self.workdir = workdir / name
        self.overrides = overrides
        self.size = size
        self.security = security
        self._bootstrap = ""

    @property
    def bootstrap(self) -> str:
        return self._bootstrap

    def address(self, protocol: str) -> str:
        """The bootstrap addresses (every broker's) of the listener with this security protocol."""
        state = json.loads((self.workdir / "cluster.json").read_text())
        try:
            return ",".join(b["endpoints"][protocol] for b in state["brokers"])
        except KeyError:
            raise SystemExit(f"compat: cluster {self.workdir.name} has no {protocol} listener") from None

    def _cli(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ads_broker", "cluster", *args, "--dir", str(self.workdir)],
                              cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> None:
        settings = (*self.overrides, *(self.security.listener_settings() if self.security else ()))
        args = [a for o in settings for a in ("--override", o)]
        if self.security is not None:
            args += ["--listener", "SSL", "--listener", "SASL_SSL"]
        up = self._cli("up", "--brokers", str(self.size), *args, timeout=300)
        found = re.search(r"^bootstrap\.servers=(\S+)", up.stdout, re.M)
        if up.returncode != 0 or found is None:
            raise SystemExit(f"compat: cluster up failed (exit {up.returncode}): {(up.stderr or up.stdout)[-2000:]}")
        self._bootstrap = found.group(1)
        if self.security is not None:
            zk = json.loads((self.workdir / "cluster.json").read_text())["zookeeper_connect"]
            self.security.add_cluster_user(zk)

    def alive(self) -> bool:
        return bool(self._bootstrap) and self._cli("status", timeout=60).returncode == 0

    def stop(self) -> None:
        if self._bootstrap:
            self._cli("down", timeout=600)


@contextmanager
def running(broker: Broker) -> Iterator[Broker]:
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _variants_from_report(report: Path) -> dict[str, tuple[str, float]]:
    """``{test name: (state, seconds)}`` from the runner's TEST_REPORT JSON (empty if unreadable)."""
    try:
        doc = json.loads(report.read_text(errors="replace"))
    except (OSError, ValueError):
        return {}
    return {name: (str(t.get("state", "")), float(t.get("duration", 0.0)))
            for name, t in doc.get("tests", {}).items() if name != "<MAIN>"}


def _failure_reason(output: str) -> str:
    """The first assertion/failure line of a test-runner log, shortened."""
    pats = (r"### Test \"[^\"]*\" failed at [^\n]*\n([^\n]*)", r"TEST FAILURE[^\n]*\n[^\n]*\n([^\n]*)",
            r"(Test assertion failed[^\n]*)", r"(\bFAIL[^\n]*)")
    for p in pats:
        m = re.search(p, output)
        if m:
            line = re.sub(r"\x1b\[[0-9;]*m", "", m.group(1)).strip()
            return line[:300]
    return ""


def runner_argv(*, quick: bool, local_only: bool, sockem: bool) -> list[str]:
    """The test-runner's command line for one number (see run_one)."""
    return (["./test-runner", "-p1"] + ([] if sockem else ["-E"]) + ([] if local_only else ["-L"])
            + (["-Q"] if quick else []))


def run_one(runner_dir: Path, key: str, number: str, scenario: str, env: dict[str, str],
            timeout: float, logdir: Path, quick: bool, local_only: bool, sockem: bool = False,
            log_suffix: str = "") -> Result:
    report = logdir / f"{key.replace('/', '_')}{log_suffix}.json"
    logfile = logdir / f"{key.replace('/', '_')}{log_suffix}.log"
    report.unlink(missing_ok=True)
    env = dict(env, TESTS=number, TEST_SCENARIO=scenario, TEST_REPORT=str(report))
    start = time.monotonic()
    with open(logfile, "wb") as out:
        # -L leaves out the number's local variants (mock cluster, no broker) unless it has nothing
        # else; -E the sockem ones, except for the numbers whose broker variant is a sockem test
        # (librdkafka's in-process socket emulation in front of a real broker: 0049, 0068, ...).
        argv = runner_argv(quick=quick, local_only=local_only, sockem=sockem)
        proc = subprocess.Popen(argv, cwd=runner_dir, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc, timed_out = -9, True
        except BaseException:  # interrupted: take the runner (its own session) down with us
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    seconds = time.monotonic() - start
    output = logfile.read_text(errors="replace")
    # The report lists every test of the suite; keep this number's variants.
    states = {name: st for name, (st, _) in _variants_from_report(report).items()
              if name.startswith(number + "_")}
    res = Result(key, "PASS", seconds, variants=states, log=str(logfile))
    if timed_out:
        res.status, res.reason = "TIMEOUT", f"killed after {timeout:.0f} s"
    elif rc != 0 or any(st == "FAILED" for st in states.values()):
        res.status = "FAIL"
        failed = [n for n, st in states.items() if st == "FAILED"]
        res.reason = (", ".join(failed) + ": " if failed else f"exit {rc}: ") + _failure_reason(output)
    elif states and all(st == "SKIPPED" for st in states.values()):
        res.status = "SKIP"
        # The reasons of this number's own skips, not the -L/-E filter of its other variants.
        why = {re.sub(r"\x1b\[[0-9;]*m", "", w).strip() for w in re.findall(r"SKIPPING TEST: ([^\n]*)", output)}
        res.reason = "; ".join(sorted(why - {"Filtered due to negative test flags"}) or why)
    return res


def merge_passes(key: str, runs: list[Result], passes: tuple[str, ...]) -> Result:
    """One result for a number run once per SUBTEST_PASSES filter: failed if any pass failed."""
    order = ("TIMEOUT", "FAIL", "PASS", "SKIP")
    status = min((r.status for r in runs), key=order.index)
    reasons = [f"[SUBTESTS={sub}] {r.reason}" for sub, r in zip(passes, runs, strict=True)
               if r.status == status and r.reason]
    variants: dict[str, str] = {}
    for r in runs:
        for name, st in r.variants.items():
            if variants.get(name) != "FAILED":
                variants[name] = st
    return Result(key, status, sum(r.seconds for r in runs), "; ".join(reasons), variants,
                  ", ".join(r.log for r in runs))


def plan(tests: list[SuiteTest]) -> list[tuple[str, str, str]]:
    """``(key, number, scenario)`` for every test number, in suite order: the default scenario's,
    then the noautocreate scenario's (keyed ``NNNN/noautocreate``)."""
    out: list[tuple[str, str, str]] = []
    for scenario in ("default", "noautocreate"):
        seen: set[str] = set()
        for t in tests:
            if t.number in seen or not t.in_scenario(scenario):
                continue
            seen.add(t.number)
            key = t.number if scenario == "default" else f"{t.number}/{scenario}"
            out.append((key, t.number, scenario))
    return out


def env_or(name: str, default: str) -> str:
    """``$name``, or ``default`` when it is unset or empty: compat/compat.mk exports every COMPAT_*
    knob, and make exports one that was never set as an empty string."""
    return os.environ.get(name) or default


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", default=os.environ.get("COMPAT_TESTS", ""),
                    help="comma-separated test numbers (or NNNN/scenario) to run, excluded or not;"
                         " default: every test not in compat/exclusions")
    ap.add_argument("--subset", default=os.environ.get("COMPAT_SUBSET", ""),
                    help="a file of test keys, one per line (e.g. compat/ci-subset)")
    ap.add_argument("--timeout", type=float, default=float(env_or("COMPAT_TIMEOUT", "1200")),
                    help="wall-clock seconds per test number (default 1200: 0113 runs over 10 min on 2 loaded cores)")
    ap.add_argument("--multiplier", default=env_or("COMPAT_MULTIPLIER", "2"),
                    help="the suite's test.timeout.multiplier (slow or loaded machines)")
    ap.add_argument("--kafka-version", default=env_or("COMPAT_KAFKA_VERSION", DEFAULT_KAFKA_VERSION))
    ap.add_argument("--quick", action="store_true",
                    default=os.environ.get("COMPAT_QUICK", "") not in ("", "0"),
                    help="the runner's -Q: less data, but it also skips every subtest not marked"
                         " SUB_TEST_QUICK (0018, 0019, 0026, 0045, 0089, 0113, ... then test little)")
    ap.add_argument("--subtests", default=os.environ.get("COMPAT_SUBTESTS", ""),
                    help="the runner's SUBTESTS: run only subtests whose name contains this")
    ap.add_argument("--no-exclusions", action="store_true", help="run excluded tests too")
    ap.add_argument("--cluster", type=int, default=int(env_or("COMPAT_CLUSTER", "0")),
                    help="run against `ads-broker cluster up` with this many brokers (and a ZooKeeper)"
                         " instead of one broker, replication factor 3 by default: for 0103/0107/0111")
    ap.add_argument("--results", type=Path, default=None,
                    help="directory for logs and results.json (default: <cache>/runs/<time>)")
    args = ap.parse_args(argv)
    # SIGTERM (and SIGINT, which a shell's background job ignores) end the run through the
    # finally blocks below, so neither a broker nor a test-runner outlives it.
    signal.signal(signal.SIGTERM, _interrupted)

    cache = Path(os.environ.get("COMPAT_CACHE", REPO / ".compat-cache"))
    build = subprocess.run([str(HERE / "fetch_build.sh")], check=False, stdout=subprocess.PIPE, text=True)
    if build.returncode != 0:
        print("compat: fetching/building librdkafka failed", file=sys.stderr)
        return 2
    src = Path(build.stdout.strip().splitlines()[-1])
    runner_dir = src / "tests"
    tests = parse_tests(runner_dir / "test.c")
    exclusions = {} if args.no_exclusions else load_exclusions(HERE / "exclusions")

    todo = plan(tests)
    wanted: set[str] = set()
    if args.tests:
        wanted |= {k.strip() for k in args.tests.split(",") if k.strip()}
    if args.subset:
        wanted |= {ln.split("#", 1)[0].split()[0] for ln in Path(args.subset).read_text().splitlines()
                   if ln.split("#", 1)[0].strip()}
    if wanted:
        todo = [p for p in todo if p[0] in wanted or p[1] in wanted]

    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    logdir = (args.results or cache / "runs" / stamp).resolve()  # the runner runs in tests/
    logdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="compat-broker-"))
    security = SecurityFixture.create(work / "pki")
    version = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, check=False).stdout.strip()
    print(f"compat: librdkafka's suite from {src}, ads-broker at {version or '?'}, "
          f"TEST_KAFKA_VERSION={args.kafka_version}, logs in {logdir}", flush=True)

    brokers: dict[str, Broker | Cluster]
    if args.cluster:
        # trivup's three-broker clusters: auto-created topics and the internal ones replicated 3 ways.
        rf = str(min(3, args.cluster))
        cluster_overrides = tuple(o for o in BROKER_OVERRIDES if not o.startswith("default.replication.factor="))
        brokers = {scenario: Cluster(work, scenario, (*cluster_overrides, f"default.replication.factor={rf}",
                                                      f"auto.create.topics.enable={auto}"), args.cluster,
                                     security if scenario == "default" else None)
                   for scenario, auto in (("default", "true"), ("noautocreate", "false"))}
    else:
        brokers = {
            "default": Broker(work, "default", (*BROKER_OVERRIDES, "auto.create.topics.enable=true"), security),
            "noautocreate": Broker(work, "noautocreate", (*BROKER_OVERRIDES, "auto.create.topics.enable=false")),
        }
    results: list[Result] = []
    run_start = time.monotonic()
    try:
        for key, number, scenario in todo:
            named = bool(args.tests) and (key in wanted or number in wanted)
            if not named and (key in exclusions or (number in exclusions and scenario == "default")):
                r = Result(key, "EXCLUDED", reason=exclusions.get(key) or exclusions[number])
                results.append(r)
                print(f"{key} EXCLUDED  {r.reason}", flush=True)
                continue
            broker = brokers[scenario]
            if not broker.alive():
                broker.start()
            bootstrap, client_security = broker.bootstrap, ""
            protocol = SECURITY_TESTS.get(number)
            if protocol and broker.security is not None:
                bootstrap, client_security = broker.address(protocol), security.client_conf(protocol, number)
            conf = logdir / f"test-{key.replace('/', '_')}.conf"
            conf.write_text(f"bootstrap.servers={bootstrap}\n"
                            f"test.timeout.multiplier={args.multiplier}\n" + client_security)
            env = {k: v for k, v in os.environ.items() if k not in ("CI", "TESTS", "SUBTESTS")}
            if client_security:
                env.update(security.env())
            if args.subtests:
                env["SUBTESTS"] = args.subtests
            # KAFKA_PATH/BROKERS: the suite's kafka-topics.sh calls go to compat/kafka/bin's
            # stand-in (the Admin API without a JVM); its other Kafka tools are not there.
            env.update(RDKAFKA_TEST_CONF=str(conf), TEST_KAFKA_VERSION=kafka_version_for(number, args.kafka_version),
                       TEST_LEVEL=os.environ.get("TEST_LEVEL", "2"), KAFKA_PATH=str(HERE / "kafka"),
                       BROKERS=bootstrap, COMPAT_PYTHON=sys.executable,
                       LD_LIBRARY_PATH=f"{src / 'src'}:{src / 'src-cpp'}")
            variants = [t for t in tests if t.number == number and t.in_scenario(scenario)]
            local_only = all(t.local for t in variants)
            sockem = any(TEST_F_SOCKEM in t.flags for t in variants)
            table = CLUSTER_SUBTEST_PASSES if args.cluster >= 3 and number in CLUSTER_SUBTEST_PASSES else SUBTEST_PASSES
            passes = table.get(number, ()) if not args.subtests and not args.no_exclusions else ()
            unsecured_listener = "SASL_PLAINTEXT" in getattr(broker, "ports", {})  # single broker only
            oauth_passes = OAUTHBEARER_PASSES.get(number, ()) if passes and unsecured_listener else ()
            if passes:
                runs = [run_one(runner_dir, key, number, scenario, dict(env, SUBTESTS=sub), args.timeout, logdir,
                                args.quick, local_only, sockem, log_suffix=f"-{i}")
                        for i, sub in enumerate(passes)]
                if oauth_passes:  # the same number with an OAUTHBEARER client (secure_listeners.OAUTHBEARER_PASSES)
                    oauth_conf = logdir / f"test-{key.replace('/', '_')}-oauthbearer.conf"
                    oauth_conf.write_text(f"bootstrap.servers={broker.address('SASL_PLAINTEXT')}\n"
                                          f"test.timeout.multiplier={args.multiplier}\n"
                                          + security.client_conf("SASL_PLAINTEXT", number))
                    runs += [run_one(runner_dir, key, number, scenario,
                                     dict(env, SUBTESTS=sub, RDKAFKA_TEST_CONF=str(oauth_conf)), args.timeout,
                                     logdir, args.quick, local_only, sockem, log_suffix=f"-oauthbearer-{i}")
                             for i, sub in enumerate(oauth_passes)]
                r = merge_passes(key, runs, (*passes, *oauth_passes))
            else:
                r = run_one(runner_dir, key, number, scenario, env, args.timeout, logdir, args.quick, local_only,
                            sockem)
            if not broker.alive():
                r.status = "FAIL"
                exit_code = broker.proc.returncode if isinstance(broker, Broker) and broker.proc else "?"
                r.reason = f"ads-broker died (exit {exit_code}); " + r.reason
            results.append(r)
            print(f"{key} {r.status} {r.seconds:.1f}s" + (f"  {r.reason}" if r.reason and r.status != "PASS" else ""),
                  flush=True)
    finally:
        for b in brokers.values():
            b.stop()
            if b.workdir.exists():
                for f in b.workdir.glob("broker*.log"):
                    shutil.copy(f, logdir / f"{b.workdir.name}-{f.name}")
        security.close()
        shutil.rmtree(work, ignore_errors=True)

    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "TIMEOUT", "SKIP", "EXCLUDED")}
    failed = counts["FAIL"] + counts["TIMEOUT"]
    (logdir / "results.json").write_text(json.dumps({
        "commit": version, "librdkafka": src.parent.parent.parent.name, "kafka_version": args.kafka_version,
        "kafka_version_per_test": {n: kafka_version_for(n, args.kafka_version) for n in sorted(KIP_896_TESTS)},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": args.quick,
        "seconds": round(time.monotonic() - run_start, 1),
        "results": [asdict(r) for r in results]}, indent=1))
    print(f"{counts['PASS']} passed, {failed} failed"
          f" ({counts['TIMEOUT']} of them timed out), {counts['SKIP']} skipped by the suite,"
          f" {counts['EXCLUDED']} excluded; {time.monotonic() - run_start:.0f} s; results in {logdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
