"""The controller's decisions as a pure function of (assignment, live brokers, current states).

:func:`decide` is the one place that says who leads each partition and which replicas stay in its
ISR; :class:`~ads_broker.cluster.controller.Controller` only reads ZooKeeper, calls it, and writes
the result back with versioned writes. The rules are Kafka's ``PartitionLeaderElectionAlgorithms``
and the ZooKeeper controller's replica/partition state machines:

* A new partition (no state yet) gets the first live replica of its assignment as leader and the
  live replicas as ISR, leader epoch 0. With no live replica it stays without state until one
  registers.
* Leader lost (its broker left ``/brokers/ids``) or absent (-1): the first replica in assignment
  order that is live, in the ISR and not shutting down leads; the ISR keeps its live members.
  With none and ``unclean.leader.election.enable=false`` the partition goes offline: leader -1,
  the ISR unchanged (every member still holds the whole committed prefix, so whichever comes back
  first may lead cleanly; Kafka keeps only the last member). With unclean election enabled the
  first live replica leads with ISR = [itself]: messages it had not replicated are lost, and the old
  ISR members truncate to its log when they return.
* A follower lost or shutting down leaves the ISR (never the last member, and never the leader,
  which the leader rules above replace).
* Controlled shutdown of a leader: the first replica that is live, in the ISR and not shutting
  down takes over, and the shutting-down broker leaves the ISR; with no such replica the leader
  stays (the broker then shuts down uncleanly for that partition, as in Kafka).
* Preferred-leader election: the first replica of the assignment leads if it is live, in the ISR
  and not shutting down.
* Unclean election on request (ElectLeaders UNCLEAN, KIP-460; :attr:`ClusterView.unclean`): a
  partition named there is elected as if its topic had ``unclean.leader.election.enable=true``,
  whatever the topic and broker say. A partition whose leader is alive does not change; one with a
  live ISR member gets it (a clean election, as Kafka's ``OfflinePartitionLeaderElectionStrategy
  (allowUnclean=true)`` prefers the ISR).

Every change bumps the leader epoch (as the ZooKeeper controller did) and records the deciding
controller's epoch; ``partition_epoch`` of a decision is the version it replaces (-1: create).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ads_broker.cluster.zookeeper import NO_LEADER, LeaderAndIsr, TopicPartition


@dataclass(frozen=True)
class Reassignment:
    """A partition's reassignment in progress (KIP-455; the topic znode's ``adding_replicas`` and
    ``removing_replicas``): its replicas are target + original, ``adding`` = target - original,
    ``removing`` = original - target."""

    adding: tuple[int, ...]
    removing: tuple[int, ...]


@dataclass(frozen=True)
class ClusterView:
    """What the controller knows when it decides: read from ZooKeeper, never mutated."""

    assignment: Mapping[TopicPartition, Sequence[int]]
    states: Mapping[TopicPartition, LeaderAndIsr]
    live: frozenset[int]
    shutting_down: frozenset[int] = frozenset()
    preferred: frozenset[TopicPartition] = field(default_factory=frozenset)
    reassigning: Mapping[TopicPartition, Reassignment] = field(default_factory=dict)
    #: partitions an ElectLeaders UNCLEAN asked to elect out of the ISR if need be
    unclean: frozenset[TopicPartition] = field(default_factory=frozenset)

    def available(self, broker: int) -> bool:
        """Live and not on its way out: may lead, may stay in an ISR."""
        return broker in self.live and broker not in self.shutting_down


def _never_unclean(topic: str) -> bool:
    return False


def offline_election(replicas: Sequence[int], isr: Collection[int], view: ClusterView,
                     unclean: bool) -> tuple[int, tuple[int, ...]] | None:
    """Kafka's offlinePartitionLeaderElection: (leader, new ISR), or None when none may lead."""
    live_isr = tuple(b for b in isr if view.available(b))
    for b in replicas:
        if b in live_isr:
            return b, live_isr
    if unclean:
        for b in replicas:
            if view.available(b):
                return b, (b,)
    return None


def _keep_isr(isr: tuple[int, ...], leader: int, view: ClusterView,
              replicas: Sequence[int] | None = None) -> tuple[int, ...]:
    """The ISR without lost or shutting-down followers, nor brokers that are no longer replicas
    (a reassignment cancelled or replaced); never empty."""
    kept = tuple(b for b in isr if (b == leader or view.available(b)) and (replicas is None or b in replicas))
    return kept or isr


def decide_partition(tp: TopicPartition, replicas: Sequence[int], state: LeaderAndIsr | None,
                     view: ClusterView, controller_epoch: int, unclean: bool) -> LeaderAndIsr | None:
    """The new state of one partition, or None when it stays as it is."""
    if state is None:
        live = tuple(b for b in replicas if view.available(b))
        if not live:
            return None
        return LeaderAndIsr(live[0], 0, live, controller_epoch, -1)
    leader, isr = state.leader, state.isr
    if leader not in (NO_LEADER, *replicas):  # no longer a replica (a reassignment cancelled or replaced)
        isr = tuple(b for b in isr if b in replicas) or isr
        leader = NO_LEADER
    if leader == NO_LEADER or leader not in view.live:
        chosen = offline_election(replicas, isr, view, unclean)
        if chosen is None:
            leader, isr = NO_LEADER, _keep_isr(isr, NO_LEADER, view)
        else:
            leader, isr = chosen
    elif leader in view.shutting_down:
        successor = next((b for b in replicas if b in isr and view.available(b)), None)
        if successor is not None:
            leader, isr = successor, _keep_isr(isr, successor, view)
    else:
        isr = _keep_isr(isr, leader, view, replicas)
        preferred = replicas[0] if replicas else NO_LEADER
        if tp in view.preferred and preferred != leader and preferred in isr and view.available(preferred):
            leader = preferred
    if (leader, isr) == (state.leader, state.isr):
        return None
    return LeaderAndIsr(leader, state.leader_epoch + 1, isr, controller_epoch, state.partition_epoch)


def decide(view: ClusterView, controller_epoch: int,
           unclean_for: Callable[[str], bool] = _never_unclean) -> dict[TopicPartition, LeaderAndIsr]:
    """Every partition whose state must change, with its new state. Pure: same view, same answer.
    ``unclean_for(topic)``: the topic's ``unclean.leader.election.enable`` (its override, else the
    broker's); a partition in ``view.unclean`` is elected uncleanly whatever it says."""
    changes: dict[TopicPartition, LeaderAndIsr] = {}
    for tp in sorted(view.assignment):
        new = decide_partition(tp, view.assignment[tp], view.states.get(tp), view, controller_epoch,
                               tp in view.unclean or unclean_for(tp.topic))
        if new is not None:
            changes[tp] = new
    return changes


def reassignment_complete(replicas: Sequence[int], reassignment: Reassignment, state: LeaderAndIsr | None,
                          view: ClusterView, controller_epoch: int) -> tuple[LeaderAndIsr, tuple[int, ...]] | None:
    """KIP-455's phase B, once every target replica is in the ISR: the new state (the leader moved
    into the target replicas if it is not one, or is not available; the removed replicas out of the
    ISR; a new leader epoch) and the target replicas, to be written together. None while waiting."""
    target = tuple(b for b in replicas if b not in reassignment.removing)
    if state is None or not target or not set(target) <= set(state.isr):
        return None
    leader = state.leader
    if leader not in target or not view.available(leader):
        chosen = next((b for b in target if view.available(b)), None)
        if chosen is None:
            return None
        leader = chosen
    isr = tuple(b for b in state.isr if b in target)
    return LeaderAndIsr(leader, state.leader_epoch + 1, isr, controller_epoch, state.partition_epoch), target


def led_by(view: ClusterView, broker: int) -> list[TopicPartition]:
    """Partitions ``broker`` leads in ``view`` (what a controlled shutdown waits to empty)."""
    return sorted(tp for tp, s in view.states.items() if s.leader == broker)
