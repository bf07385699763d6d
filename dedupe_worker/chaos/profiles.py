"""Run profiles: how much traffic, which faults, how the workers are configured.

``ci`` runs in ``make test`` (at least 100 000 messages and 30 faults covering every kind, in
under 10 minutes on a 2-core machine); ``soak`` runs for ``--hours`` with a fault about every
``fault_interval_s`` (Jepsen-style rotation with quiet periods).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dedupe_worker.faults import POINTS

FAULT_KINDS = ("worker_kill", "worker_pause", "crash_point", "broker_kill", "broker_power_cut", "append_delay",
               "marker_delay", "store_deleted", "stale_restore", "second_worker", "clock_skew")


@dataclass(frozen=True)
class Profile:
    name: str
    messages: int
    duration_s: float  # the generator's send period; faults run inside it
    partitions: int = 4
    workers: int = 2
    batch_size: int = 500
    delivery_timeout_s: float = 5.0  # DEDUPE_DELIVERY_TIMEOUT_S: append delays exceed it
    #: The promised window, on the worker's clock ([aging] min_window_s): an id first seen less
    #: than this long ago is never published again.
    window_s: float = 3600.0
    max_keys: int = 10_000  # [aging] max_keys per partition: aging runs during the run
    generation_keys: int = 500  # small generations, so aging drops some while the run goes on
    #: The longest a record may wait between its send and its processing (lag); duplicates sent
    #: further apart than window_s - slack_s may legitimately be published again.
    slack_s: float = 300.0
    #: Exact fault counts per kind (spread evenly over the run), or None: rotate kinds every
    #: ``fault_interval_s`` with ``quiet_fraction`` of the slots left quiet.
    fault_counts: dict[str, int] | None = None
    fault_interval_s: float = 30.0
    quiet_fraction: float = 0.25
    drain_timeout_s: float = 180.0
    recovery_timeout_s: float = 120.0
    #: Longer than delivery_timeout_s plus the 5 s flush of the producer the worker then drops
    #: (with 8 s the held append landed inside that flush, before reconcile read the output).
    append_delay_ms: int = 15_000
    marker_delay_ms: int = 8_000
    delay_hold_s: float = 10.0
    skew_hours: float = 6.0
    skew_hold_s: float = 10.0
    run_retry_gap_s: tuple[float, float] = (60.0, 180.0)
    #: Malformed events among the planned sends. 1 %: a batch that a crash cuts short then holds a
    #: malformed record often enough to test that dead letters survive crashes.
    malformed_rate: float = 0.01
    #: Start one clock-skew fault (clients hours in the past) with the run, so that a partition's
    #: first generation holds only skewed first-seen times (aging must not trust them).
    skew_at_start: bool = True
    extra_worker_env: dict[str, str] = field(default_factory=dict)

    def worker_env(self) -> dict[str, str]:
        return {"DEDUPE_BATCH_SIZE": str(self.batch_size), "DEDUPE_DELIVERY_TIMEOUT_S": str(self.delivery_timeout_s),
                "DEDUPE_AGING__MAX_KEYS": str(self.max_keys), "DEDUPE_AGING__MIN_WINDOW_S": str(self.window_s),
                "DEDUPE_STORE__GENERATION_KEYS": str(self.generation_keys), **self.extra_worker_env}


CI = Profile(
    name="ci", messages=110_000, duration_s=210.0, drain_timeout_s=90.0, recovery_timeout_s=60.0,
    fault_counts={"worker_kill": 6, "worker_pause": 4, "crash_point": len(POINTS), "broker_kill": 2,
                  "broker_power_cut": 2, "append_delay": 2, "marker_delay": 2, "store_deleted": 2,
                  "stale_restore": 2, "second_worker": 2, "clock_skew": 2},
)

SOAK = Profile(name="soak", messages=0, duration_s=3600.0, max_keys=400_000, generation_keys=50_000,
               malformed_rate=0.002, skew_at_start=False,
               window_s=1800.0, slack_s=300.0, fault_interval_s=30.0, run_retry_gap_s=(60.0, 900.0))

#: Soak traffic rate (messages per second of run time).
SOAK_RATE = 250.0


def profile(name: str, hours: float | None = None) -> Profile:
    if name == "ci":
        return CI if hours is None else replace(CI, duration_s=hours * 3600, messages=int(hours * 3600 * 333))
    if name == "soak":
        duration = (hours or 1.0) * 3600
        return replace(SOAK, duration_s=duration, messages=int(duration * SOAK_RATE))
    raise ValueError(f"unknown profile {name!r}: use ci or soak")
