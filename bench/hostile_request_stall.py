"""How long another client waits while ads-broker answers requests built to be expensive (issue 12,
"no client can stall it"; review s13 H1-H4), this tree against an older one, side by side.

    .venv/bin/python bench/hostile_request_stall.py [--before REV] [--scale 1.0] [--rounds 1]

Per scenario and broker: one fresh ads-broker (a temp data dir, 127.0.0.1), a probe connection
sending ApiVersions back to back while ONE hostile request is answered; printed: the probe's
longest wait, the hostile request's answer time and size, the broker's RSS growth (peak) and its
bytes written (``/proc/PID/io`` wchar). ``--before REV``: the same scenarios against ``git archive
REV`` (run from that tree: its ``ads_broker`` first on ``sys.path``), then the ratio of the probe's
longest waits (before / this tree). A measurement on a shared machine, not a pass/fail check.

Scenarios (sizes times ``--scale``):

* ``scram-delete``: AlterUserScramCredentials deleting 20,000 users that do not exist
* ``scram-describe``: DescribeUserScramCredentials naming 20,000 users
* ``scram-upsert``: AlterUserScramCredentials upserting 1,000 users (valid credentials)
* ``describe-configs``: DescribeConfigs naming the broker resource 2,000 times, synonyms and docs
* ``describe-groups``: DescribeGroups naming 30,000 unknown groups, 3,000 groups holding offsets
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import (
    AlterUserScramCredentialsRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeUserScramCredentialsRequest,
)
from kafka.protocol.consumer import OffsetCommitRequest
from kafka.protocol.metadata import ApiVersionsRequest

from ads_broker.embedded import BrokerProcess, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.integration.broker.rawclient import RawClient

Scenario = Callable[[RawClient, RawClient, float], tuple[Any, int]]  # (setup conn, hostile conn, scale)


def _n(base: int, scale: float) -> int:
    return max(1, int(base * scale))


def scram_delete(_setup: RawClient, hostile: RawClient, scale: float) -> tuple[Any, int]:
    a = AlterUserScramCredentialsRequest
    return a(deletions=[a.ScramCredentialDeletion(name=f"nobody-{i}", mechanism=1)
                        for i in range(_n(20000, scale))], upsertions=[]), 0


def scram_describe(_setup: RawClient, hostile: RawClient, scale: float) -> tuple[Any, int]:
    d = DescribeUserScramCredentialsRequest
    return d(users=[d.UserName(name=f"nobody-{i}") for i in range(_n(20000, scale))]), 0


def scram_upsert(_setup: RawClient, hostile: RawClient, scale: float) -> tuple[Any, int]:
    a = AlterUserScramCredentialsRequest
    return a(deletions=[], upsertions=[a.ScramCredentialUpsertion(
        name=f"user-{i}", mechanism=1, iterations=4096, salt=b"s" * 16, salted_password=b"p" * 32)
        for i in range(_n(1000, scale))]), 0


def describe_configs(_setup: RawClient, hostile: RawClient, scale: float) -> tuple[Any, int]:
    r = DescribeConfigsRequest.DescribeConfigsResource
    return DescribeConfigsRequest(resources=[r(resource_type=4, resource_name="0", configuration_keys=None)
                                             for _ in range(_n(2000, scale))],
                                  include_synonyms=True, include_documentation=True), 4


def describe_groups(setup: RawClient, hostile: RawClient, scale: float) -> tuple[Any, int]:
    oc = OffsetCommitRequest
    groups = _n(3000, scale)
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{setup.sock.getpeername()[1]}"})
    admin.create_topics([NewTopic("events", 1, 1)])["events"].result(60)
    for i in range(groups):  # simple commits (generation -1): any client may make them by default
        setup.send(oc(group_id=f"committed-{i}", generation_id_or_member_epoch=-1, member_id="",
                      group_instance_id=None, retention_time_ms=-1, topics=[oc.OffsetCommitRequestTopic(
                          name="events", partitions=[oc.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                              partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                              commit_timestamp=-1, committed_metadata="")])]), 2)
    for _ in range(groups):
        setup.recv_frame()
    assert setup.request(DescribeGroupsRequest(groups=["committed-0"], include_authorized_operations=False),
                         4).groups[0].group_state == "Empty", "the committed groups must hold offsets"
    return DescribeGroupsRequest(groups=[f"unknown-{i}" for i in range(_n(30000, scale))],
                                 include_authorized_operations=False), 4


SCENARIOS: dict[str, Scenario] = {"scram-delete": scram_delete, "scram-describe": scram_describe,
                                  "scram-upsert": scram_upsert, "describe-configs": describe_configs,
                                  "describe-groups": describe_groups}


def _proc_value(pid: int, path: str, key: str) -> int:
    for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def broker(tree: Path | None, data_dir: Path, log_path: Path) -> BrokerProcess:
    """A broker of this tree, or of ``tree`` (its ``ads_broker`` first on ``sys.path``)."""
    port = free_port()
    args = ["serve", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}",
            "--override", "num.partitions=1"]
    if tree is None:
        argv = [sys.executable, "-m", "ads_broker", *args]
    else:
        argv = [sys.executable, "-c", f"import sys, runpy; sys.path.insert(0, {str(tree)!r}); "
                "sys.argv[0] = 'ads_broker'; runpy.run_module('ads_broker', run_name='__main__')", *args]
    return BrokerProcess(argv, port, log_path=log_path)


def run(name: str, tree: Path | None, root: Path, scale: float) -> dict[str, float]:
    proc = broker(tree, root / "data", root / "broker.log")
    proc.start()
    try:
        bootstrap = f"127.0.0.1:{proc.port}"
        setup, hostile, probe = RawClient(bootstrap), RawClient(bootstrap), RawClient(bootstrap)
        for c in (setup, hostile, probe):
            c.sock.settimeout(1800)
        request, version = SCENARIOS[name](setup, hostile, scale)
        pid = proc.pid
        rss0, wchar0 = _proc_value(pid, "status", "VmRSS"), _proc_value(pid, "io", "wchar")
        peak = [rss0]
        done = threading.Event()
        answer: list[tuple[float, int]] = []

        def send() -> None:
            started = time.monotonic()
            hostile.send(request, version)
            frame = hostile.recv_frame()
            answer.append((time.monotonic() - started, len(frame)))
            done.set()

        sender = threading.Thread(target=send)
        sender.start()
        longest = 0.0
        while not done.is_set():
            started = time.monotonic()
            probe.request(ApiVersionsRequest(), 0)
            longest = max(longest, time.monotonic() - started)
            peak[0] = max(peak[0], _proc_value(pid, "status", "VmRSS"))
        sender.join()
        wrote = _proc_value(pid, "io", "wchar") - wchar0
        return {"probe_max_s": longest, "answer_s": answer[0][0], "answer_mb": answer[0][1] / 1e6,
                "rss_growth_mib": (peak[0] - rss0) / 1024, "written_mb": wrote / 1e6}
    finally:
        proc.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="a git revision to compare with (run from `git archive` of it)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every scenario's size")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="hostile-stall-") as tmp:
        trees: dict[str, Path | None] = {"this": None}
        if args.before:
            before = Path(tmp) / "before"
            before.mkdir()
            archive = subprocess.run(["git", "-C", str(repo), "archive", args.before], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
            for built in (repo / "ads_broker" / "log").glob("_walk.*.so"):  # the C walk, same ABI
                (before / "ads_broker" / "log" / built.name).write_bytes(built.read_bytes())
            trees = {f"before ({args.before})": before, "this": None}
        for name in args.scenarios.split(","):
            rows = {}
            for label, tree in trees.items():
                root = Path(tmp) / f"{name}-{label.split()[0]}"
                root.mkdir()
                rows[label] = run(name, tree, root, args.scale)
                print(f"{name:17s} {label:22s} " + "  ".join(f"{k}={v:.2f}" for k, v in rows[label].items()),
                      flush=True)
            if len(rows) == 2:
                first, this = rows[next(iter(rows))], rows["this"]
                ratio = first["probe_max_s"] / max(this["probe_max_s"], 1e-3)
                print(f"{name:17s} ratio probe_max_s before/this = {ratio:.1f}", flush=True)


if __name__ == "__main__":
    main()
