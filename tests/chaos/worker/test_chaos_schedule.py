"""The harness's plans: the fault schedule and the traffic plan are functions of the seed, and the
ci profile's plan covers what issue 16 asks for (without running anything); the generator's tail
traffic after the plan (against a real ads-broker)."""

from __future__ import annotations

import time
from collections import Counter
from itertools import pairwise

from ads_broker.embedded import BrokerProcess
from dedupe_worker.chaos.history import Generator, TrafficSpec, plan_traffic
from dedupe_worker.chaos.model import Outcome
from dedupe_worker.chaos.nemesis import SNAPSHOT, schedule
from dedupe_worker.chaos.profiles import CI, FAULT_KINDS, profile
from dedupe_worker.faults import POINTS
from dedupe_worker.kafka import create_topics


def test_ci_schedule_covers_every_kind_and_crash_point() -> None:
    specs = schedule(CI, CI.partitions, ["w0", "w1"], seed=1)
    kinds = Counter(s.kind for s in specs if s.kind != SNAPSHOT)
    assert set(kinds) == set(FAULT_KINDS)
    assert sum(kinds.values()) >= 30
    assert {s.params["point"] for s in specs if s.kind == "crash_point"} == set(POINTS)
    assert all(0 <= s.at_s < CI.duration_s for s in specs)


def test_schedule_is_a_function_of_the_seed() -> None:
    assert schedule(CI, 4, ["w0", "w1"], seed=3) == schedule(CI, 4, ["w0", "w1"], seed=3)
    assert schedule(CI, 4, ["w0", "w1"], seed=3) != schedule(CI, 4, ["w0", "w1"], seed=4)


def test_every_stale_restore_has_an_earlier_snapshot() -> None:
    for seed in range(5):
        specs = schedule(CI, 4, ["w0", "w1"], seed=seed)
        for s in specs:
            if s.kind == "stale_restore":
                assert any(x.kind == SNAPSHOT and x.target == s.target and x.at_s < s.at_s for x in specs)


def test_soak_rotates_every_kind_with_quiet_slots() -> None:
    soak = profile("soak", hours=1.0)
    specs = [s for s in schedule(soak, 4, ["w0", "w1"], seed=1) if s.kind != SNAPSHOT]
    assert set(s.kind for s in specs) == set(FAULT_KINDS)
    slots = soak.duration_s / soak.fault_interval_s
    assert 0.5 * slots < len(specs) < 0.95 * slots  # about a quarter left quiet


def test_traffic_plan_has_every_attempt_kind() -> None:
    spec = TrafficSpec(messages=20_000, duration_s=100, seed=5, malformed_rate=0.01)
    plan = plan_traffic(spec)
    kinds = Counter(p.kind for p in plan)
    assert set(kinds) == {"new", "retry_immediate", "retry_run", "retry_late", "malformed"}
    assert 19_000 <= len(plan) <= 21_000
    assert all(a.due_s <= b.due_s for a, b in pairwise(plan))
    assert all(p.skew_s is not None and p.skew_s < -3600 for p in plan if p.kind == "retry_late")
    assert plan == plan_traffic(spec)


def test_kinds_left_out_give_their_slots_to_worker_faults() -> None:
    left_out = {"append_delay", "marker_delay", "broker_power_cut"}
    kinds = tuple(k for k in FAULT_KINDS if k not in left_out)
    full = [s for s in schedule(CI, 4, ["w0", "w1"], seed=1) if s.kind != SNAPSHOT]
    some = [s for s in schedule(CI, 4, ["w0", "w1"], seed=1, kinds=kinds) if s.kind != SNAPSHOT]
    assert len(some) == len(full) >= 30
    assert not {s.kind for s in some} & left_out


def test_the_generator_keeps_sending_until_the_faults_are_over(ads_broker: BrokerProcess) -> None:
    """A fault the schedule runs after the plan's last send (late, on a loaded machine) still finds
    input of the same mix: after the plan the generator keeps sending at the plan's rate (new ids,
    malformed events, retries) until ``end_tail``, each recorded like a planned send (a CI run at
    load 10 once left the after_commit crash point unreached because the input had stopped)."""
    create_topics(ads_broker.bootstrap, {"chaos-tail-in": 2})
    spec = TrafficSpec(messages=100, duration_s=1.0, seed=5, malformed_rate=0.1, duplicate_rate=0.0,
                       late_retry_rate=0.0)
    generator = Generator(ads_broker.bootstrap, "chaos-tail-in", spec).start()
    deadline = time.time() + 60
    while generator.tail_sent < 300 and time.time() < deadline:
        time.sleep(0.05)
    assert generator.tail_sent >= 300 and not generator.done  # still sending: the faults are not over
    generator.end_tail()
    assert generator.join(60)
    attempts = list(generator.attempts.values())
    assert len(attempts) == len(generator.plan) + generator.tail_sent
    assert all(a.outcome is Outcome.OK for a in attempts)
    planned_ids = {a.message_id for a in attempts[:len(generator.plan)] if a.message_id}
    tail = attempts[len(generator.plan):]
    assert {"new", "malformed"} <= {a.kind for a in tail}
    new_ids = [a.message_id for a in tail if a.kind == "new"]
    assert len(set(new_ids)) == len(new_ids) and not planned_ids & set(new_ids)  # fresh ids, none planned
