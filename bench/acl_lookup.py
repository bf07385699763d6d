"""What an ACL check costs, before and after the ACL index, side by side.

    .venv/bin/python bench/acl_lookup.py --topics 1000 --prefixed 100 --rounds 5

Builds one ACL set (per topic a literal READ and WRITE for its own user, every tenth topic a
DENY; ``--prefixed`` PREFIXED ACLs on tenant prefixes; a wildcard DESCRIBE for an ops user) and
answers, with each authorizer, what a Metadata v8+ request with
``include_topic_authorized_operations`` asks for every topic: the 8 topic operations of one
principal (plus the DESCRIBE that filters the topic list: 9 checks a topic). "before" is
``ads_broker/security/acl.py`` of ``--baseline`` (a git revision: the scan per resource type),
"after" is the working tree's (the index, one lookup of the matching ACLs per topic). Both run
interleaved on one thread and are timed in thread CPU time, so a busy machine inflates them
less; the decisions of both are compared and must be equal. Prints µs per topic and the ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ads_broker.security import acl as after  # noqa: E402

#: The last commit before the index (acl.py scanned every ACL of the resource type per check).
DEFAULT_BASELINE = "35ab66b"
HOST = "10.0.0.5"
OPS = (after.READ, after.WRITE, after.CREATE, after.DESCRIBE, after.DELETE, after.ALTER,
       after.DESCRIBE_CONFIGS, after.ALTER_CONFIGS)


def load_baseline(rev: str) -> ModuleType:
    """``ads_broker/security/acl.py`` as it was at ``rev``, imported as its own module."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:ads_broker/security/acl.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "acl_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("acl_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def acl_set(topics: int, prefixed: int) -> list[after.Acl]:
    acls = []
    for i in range(topics):
        name, user = f"tenant{i % 50}.topic{i}", f"User:u{i}"
        acls.append(after.Acl(after.TOPIC, name, after.LITERAL, user, "*", after.READ, after.ALLOW))
        acls.append(after.Acl(after.TOPIC, name, after.LITERAL, user, "*", after.WRITE, after.ALLOW))
        if i % 10 == 0:
            acls.append(after.Acl(after.TOPIC, name, after.LITERAL, "User:*", HOST, after.DELETE, after.DENY))
    for j in range(prefixed):
        acls.append(after.Acl(after.TOPIC, f"tenant{j % 50}.", after.PREFIXED, f"User:p{j}", "*",
                              after.DESCRIBE_CONFIGS, after.ALLOW))
    acls.append(after.Acl(after.TOPIC, "*", after.LITERAL, "User:ops", "*", after.DESCRIBE, after.ALLOW))
    return acls


def baseline_ops(authz: Any, principal: str, name: str) -> set[int]:
    """What metadata.py did before: one full check per operation."""
    return {op for op in OPS if authz.authorize(principal, HOST, op, after.TOPIC, name)}


def after_ops(authz: after.Authorizer, principal: str, name: str) -> set[int]:
    return authz.authorized_operations(principal, HOST, OPS, after.TOPIC, name)


def metadata_pass(authz: Any, ops: Callable[[Any, str, str], set[int]], names: list[str],
                  principal: str) -> list[set[int]]:
    """One Metadata v8+ answer: the DESCRIBE that filters the topic, then its operations."""
    return [ops(authz, principal, n) for n in names if authz.authorize(principal, HOST, after.DESCRIBE, after.TOPIC, n)]


def timed_us(fn: Callable[[], object], per: int) -> float:
    started = time.thread_time()
    fn()
    return (time.thread_time() - started) / per * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--prefixed", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of the 'before' acl.py")
    args = ap.parse_args()
    before = load_baseline(args.baseline)
    acls = acl_set(args.topics, args.prefixed)
    names = sorted({a.resource_name for a in acls if a.pattern_type == after.LITERAL and a.resource_name != "*"})
    with tempfile.TemporaryDirectory() as tmp:
        store = after.AclStore(Path(tmp))
        store.save(acls)
        old = before.Authorizer(before.AclStore(Path(tmp)), frozenset(), False)
        new = after.Authorizer(store, frozenset(), False)
        principal = "User:ops"  # sees every topic (the wildcard DESCRIBE): the most checks per request
        assert metadata_pass(old, baseline_ops, names, principal) == metadata_pass(new, after_ops, names, principal)
        for user in ("User:u7", "User:p3", "User:nobody"):
            assert [baseline_ops(old, user, n) for n in names] == [after_ops(new, user, n) for n in names], user
        t_old, t_new = [], []
        for _ in range(args.rounds):
            t_old.append(timed_us(lambda: metadata_pass(old, baseline_ops, names, principal), len(names)))
            t_new.append(timed_us(lambda: metadata_pass(new, after_ops, names, principal), len(names)))
    m_old, m_new = statistics.median(t_old), statistics.median(t_new)
    print(f"{len(acls)} ACLs ({args.topics} topics, {args.prefixed} prefixed), Metadata v8+ with topic "
          f"authorized operations for {len(names)} topics, medians of {args.rounds} interleaved rounds")
    print(f"before ({args.baseline}, scan per resource type): {m_old:10.1f} µs/topic "
          f"({m_old * len(names) / 1000:.1f} ms a request)")
    print(f"after  (index):                    {m_new:10.1f} µs/topic ({m_new * len(names) / 1000:.1f} ms a request)")
    print(f"ratio before/after: {m_old / m_new:.1f}x")


if __name__ == "__main__":
    main()
