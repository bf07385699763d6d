"""The replication simulator: the classic counterexamples as fixed scenarios, a seeded scheduler
run, and a Hypothesis state machine over every action, all driving the real
``ads_broker.replication`` rules and checking the invariants after every step.

Profiles: CI keeps this to a few seconds; ``REPLICATION_SIM_EXAMPLES`` (Hypothesis examples,
default 100), ``REPLICATION_SIM_STEPS`` (steps per example, default 60) and
``REPLICATION_SIM_SEEDS`` (seeded-scheduler runs of 400 steps, default 12) make it longer
(docs/REPLICATION.md gives the soak command).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ads_broker.replication.state import Errors, partition_leader_error
from tests.unit.replication.sim import ACKS_ALL, Simulator, TruncationRule

EXAMPLES = int(os.environ.get("REPLICATION_SIM_EXAMPLES", "100"))
STEPS = int(os.environ.get("REPLICATION_SIM_STEPS", "60"))
SEEDS = int(os.environ.get("REPLICATION_SIM_SEEDS", "12"))
#: Only to show the checker bites: run the machine with an old rule (it must then fail).
RULE = TruncationRule(os.environ.get("REPLICATION_SIM_RULE", TruncationRule.KIP279.value))
BROKERS = st.sampled_from([0, 1, 2])


def run(sim: Simulator, steps: list[Callable[[Simulator], object]]) -> list[str]:
    """Apply ``steps`` in order, checking after each; every violation seen (or [])."""
    seen: list[str] = []
    for step in steps:
        sim.act(lambda s=step: s(sim))  # type: ignore[misc]
        seen += [b for b in sim.check() if b not in seen]
    return seen


def start(sim: Simulator) -> None:
    """Both followers see the empty log and start fetching."""
    assert run(sim, [lambda s: s.fetch(1), lambda s: s.fetch(2)]) == []


# -- (a) KIP-101: truncating to the high watermark loses an acknowledged write -------------------

KIP101_HW_STEPS: list[Callable[[Simulator], object]] = [
    lambda s: s.produce(ACKS_ALL),  # v0 at offset 0 on leader 0, epoch 0
    lambda s: s.fetch(1), lambda s: s.fetch(2),  # both replicate v0 (HW still 0 in their answers)
    lambda s: s.fetch(1), lambda s: s.fetch(2),  # both at LEO 1: leader HW 1, v0 acknowledged
    lambda s: s.crash(0),  # controller elects 1 in epoch 1, ISR {1, 2}
    lambda s: s.deliver_leader_and_isr(2),  # 2 follows 1 in epoch 1 before 1 took over
    lambda s: s.fetch(2),  # 2 asks 1 for its epoch: 1 does not know epoch 1 yet
    lambda s: s.crash(1),  # 1 dies before taking over: controller elects 2 in epoch 2
    lambda s: s.deliver_leader_and_isr(2),  # 2 leads
]


def test_kip101_scenario_keeps_the_acknowledged_write() -> None:
    sim = Simulator()
    start(sim)
    assert run(sim, KIP101_HW_STEPS) == []
    assert sim.acked_all == {"v0": 0}
    leader = sim.current_leader()
    assert leader is not None and leader.id == 2 and [r.value for r in leader.log] == ["v0"]


def test_kip101_scenario_with_high_watermark_truncation_loses_it() -> None:
    """Pre-KIP-101 Kafka cut a new follower's log at its own (lagging) high watermark."""
    sim = Simulator(rule=TruncationRule.HIGH_WATERMARK)
    start(sim)
    broken = run(sim, KIP101_HW_STEPS)
    assert sim.acked_all == {"v0": 0}
    assert any(b.startswith("leader_completeness: leader 2 lacks acked v0@0") for b in broken), broken
    assert any(b.startswith("no_acked_loss") for b in broken), broken


# -- (b) KIP-279: divergence under fast consecutive leader changes -------------------------------

KIP279_STEPS: list[Callable[[Simulator], object]] = [
    lambda s: s.produce(1),  # v0@0, epoch 0
    lambda s: s.fetch(1), lambda s: s.fetch(2),
    lambda s: s.produce(1),  # v1@1, epoch 0, on leader 0 only
    lambda s: s.move_leader(1),  # epoch 1: leader 1 (clean: 1 is in the ISR)
    lambda s: s.deliver_leader_and_isr(1),  # 1 leads epoch 1 from offset 1
    lambda s: s.produce(1, 1),  # v2@1, epoch 1, on 1 only
    lambda s: s.move_leader(0),  # epoch 2 at once: leader 0 again
    lambda s: s.deliver_leader_and_isr(0),  # 0 hears of epoch 1 (follower, not yet truncated) ...
    lambda s: s.deliver_leader_and_isr(0),  # ... and of epoch 2: leads from offset 2, v1 kept
    lambda s: s.produce(1, 0),  # v3@2, epoch 2
    lambda s: s.deliver_leader_and_isr(1),  # 1 follows 0 in epoch 2: truncating
    lambda s: s.fetch(1),  # OffsetForLeaderEpoch(1)
    lambda s: s.fetch(1), lambda s: s.fetch(1),
]


def test_kip279_scenario_truncates_the_divergent_record() -> None:
    sim = Simulator()
    start(sim)
    assert run(sim, KIP279_STEPS) == []
    assert [r.value for r in sim.brokers[1].log] == ["v0", "v1", "v3"]
    assert sim.brokers[1].log == sim.brokers[0].log


def test_kip279_scenario_with_the_first_kip101_answer_diverges() -> None:
    """The first epoch protocol answered only "the next epoch starts at 2": 1 kept v2 at offset 1."""
    sim = Simulator(rule=TruncationRule.KIP101)
    start(sim)
    broken = run(sim, KIP279_STEPS)
    assert any(b.startswith("log_matching: brokers 0 and 1") for b in broken), broken
    assert [r.value for r in sim.brokers[1].log] == ["v0", "v2", "v3"]


# -- (c) found by the simulator: an ISR expansion from a replica's previous life ------------------

STALE_EXPANSION_STEPS: list[Callable[[Simulator], object]] = [
    lambda s: s.produce(1),  # v0@0
    lambda s: s.fetch(1), lambda s: s.fetch(2),  # both hold v0
    lambda s: s.tick(11_000),
    lambda s: s.fetch(1),  # 1 is caught up, 2 has lagged for 11 s
    lambda s: s.shrink_isr(0), lambda s: s.deliver_alter_partition(), lambda s: s.deliver_alter_reply(0),
    lambda s: s.fetch(2),  # 2 is at the HW again: leader 0 proposes ISR {0, 1, 2} ...
    lambda s: s.crash(2, True),  # ... 2 dies losing its unflushed log ...
    lambda s: s.restart(2),  # ... and registers again, empty
    lambda s: s.deliver_alter_partition(),  # the controller answers the old proposal
    lambda s: s.deliver_alter_reply(0),
]


def test_isr_expansion_from_a_replicas_previous_life_is_refused() -> None:
    sim = Simulator()
    start(sim)
    assert run(sim, STALE_EXPANSION_STEPS) == []
    assert sim.controller.isr == (0, 1)
    assert "AlterPartition (0, 1, 2) from 0: INELIGIBLE_REPLICA" in sim.trace


def test_isr_expansion_without_broker_epochs_admits_an_empty_replica() -> None:
    """ZooKeeper-mode Kafka sent no broker epoch (-1): the stale expansion went through."""
    sim = Simulator(broker_epochs=False)
    start(sim)
    broken = run(sim, STALE_EXPANSION_STEPS)
    assert sim.controller.isr == (0, 1, 2)
    assert any(b.startswith("strong_isr: ISR member 2 differs from leader 0") for b in broken), broken


# -- a lossy restart never leads before it re-synced ----------------------------------------------


def test_a_replica_restarted_without_its_tail_waits_offline_rather_than_lead() -> None:
    sim = Simulator()
    start(sim)
    steps: list[Callable[[Simulator], object]] = [
        lambda s: s.produce(ACKS_ALL), lambda s: s.fetch(1), lambda s: s.fetch(2),
        lambda s: s.fetch(1), lambda s: s.fetch(2),  # v0 acknowledged, flushed nowhere
        lambda s: s.crash(0, True),  # the leader loses it: 1 leads epoch 1
        lambda s: s.restart(0), lambda s: s.deliver_leader_and_isr(0),  # 0 follows, outside the ISR
        lambda s: s.deliver_leader_and_isr(1), lambda s: s.deliver_leader_and_isr(2),
        lambda s: s.crash(1), lambda s: s.crash(2),  # the ISR's last member (2) is down
    ]
    assert run(sim, steps) == []
    assert sim.acked_all == {"v0": 0} and sim.brokers[0].log == []
    assert sim.controller.leader == -1 and sim.controller.isr == (2,)
    assert partition_leader_error(sim.controller) is Errors.LEADER_NOT_AVAILABLE
    assert run(sim, [lambda s: s.restart(2), lambda s: s.deliver_leader_and_isr(2)]) == []
    leader = sim.current_leader()
    assert leader is not None and leader.id == 2 and leader.log[0].value == "v0"


# -- seeded scheduler ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(SEEDS))
def test_seeded_scheduler_keeps_every_invariant(seed: int) -> None:
    sim = Simulator(seed=seed)
    for i in range(400):
        sim.step()
        broken = sim.check()
        assert not broken, f"seed {seed} step {i}: {broken}\n" + "\n".join(sim.trace[-20:]) + "\n" + sim.describe()


def test_seeded_scheduler_catches_the_old_rules() -> None:
    """The checker is not blind: the same scheduler finds each old protocol's failures."""
    variants = {"high_watermark": dict(rule=TruncationRule.HIGH_WATERMARK), "kip101": dict(rule=TruncationRule.KIP101),
                "no_broker_epochs": dict(broker_epochs=False)}
    found = {}
    for name, kwargs in variants.items():
        for seed in range(40):
            sim = Simulator(seed=seed, **kwargs)  # type: ignore[arg-type]
            broken = next((b for _ in range(400) if (sim.step(), b := sim.check())[1]), None)
            if broken:
                found[name] = broken
                break
    assert set(found) == set(variants), found


# -- Hypothesis state machine --------------------------------------------------------------------


class ReplicationMachine(RuleBasedStateMachine):
    """Every action of the simulator, in any order Hypothesis picks; the checker after each."""

    def __init__(self) -> None:
        super().__init__()
        self.sim = Simulator(rule=RULE)

    def _do(self, action: Callable[[], object]) -> None:
        self.sim.act(action)  # type: ignore[arg-type]

    @rule(acks=st.sampled_from([1, ACKS_ALL]), broker=st.none() | BROKERS)
    def produce(self, acks: int, broker: int | None) -> None:
        self._do(lambda: self.sim.produce(acks, broker))

    @rule(broker=BROKERS, n=st.integers(1, 3), deliver=st.booleans())
    def fetch(self, broker: int, n: int, deliver: bool) -> None:
        self._do(lambda: self.sim.fetch(broker, n, deliver=deliver))

    @rule(broker=BROKERS)
    def deliver_fetch_response(self, broker: int) -> None:
        self._do(lambda: self.sim.deliver_fetch_response(broker))

    @rule(broker=BROKERS, index=st.sampled_from([0, 0, 1, 2]))
    def deliver_leader_and_isr(self, broker: int, index: int) -> None:
        self._do(lambda: self.sim.deliver_leader_and_isr(broker, index))

    @rule()
    def deliver_alter_partition(self) -> None:
        self._do(self.sim.deliver_alter_partition)

    @rule(broker=BROKERS)
    def deliver_alter_reply(self, broker: int) -> None:
        self._do(lambda: self.sim.deliver_alter_reply(broker))

    @rule(broker=BROKERS)
    def shrink_isr(self, broker: int) -> None:
        self._do(lambda: self.sim.shrink_isr(broker))

    @rule(ms=st.sampled_from([100, 1_000, 6_000, 11_000]))
    def tick(self, ms: int) -> None:
        self._do(lambda: self.sim.tick(ms))

    @rule(broker=BROKERS)
    def flush(self, broker: int) -> None:
        self._do(lambda: self.sim.flush(broker))

    @rule(broker=BROKERS, lossy=st.booleans())
    def crash(self, broker: int, lossy: bool) -> None:
        self._do(lambda: self.sim.crash(broker, lossy))

    @rule(broker=BROKERS)
    def restart(self, broker: int) -> None:
        self._do(lambda: self.sim.restart(broker))

    @rule(broker=BROKERS)
    def expire_session(self, broker: int) -> None:
        self._do(lambda: self.sim.expire_session(broker))

    @rule(broker=BROKERS)
    def reregister(self, broker: int) -> None:
        self._do(lambda: self.sim.reregister(broker))

    @rule(broker=BROKERS)
    def move_leader(self, broker: int) -> None:
        self._do(lambda: self.sim.move_leader(broker))

    @rule(first=BROKERS, second=BROKERS)
    def fast_leader_changes(self, first: int, second: int) -> None:
        """Two clean elections back to back, before anyone hears of the first."""
        self._do(lambda: self.sim.move_leader(first))
        self._do(lambda: self.sim.move_leader(second))

    @rule(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 15))
    def scheduler_burst(self, seed: int, steps: int) -> None:
        """A burst of actions from the seeded scheduler, checked after each."""
        self.sim.rng.seed(seed)
        for _ in range(steps):
            self.sim.step()
            self.check()

    @invariant()
    def check(self) -> None:
        broken = self.sim.check()
        assert not broken, "\n".join([*broken, *self.sim.trace[-25:], self.sim.describe()])


ReplicationMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=EXAMPLES <= 100,
    suppress_health_check=[HealthCheck.too_slow])
TestReplicationMachine = ReplicationMachine.TestCase
