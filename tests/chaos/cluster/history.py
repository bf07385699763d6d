"""A Jepsen-style client history of a replicated topic, and its checker (issue 13's cluster test).

The history is what clients saw while faults ran: every write sent (its value and partition, in
send order), how each ended (acknowledged at an offset, or an error: indeterminate, the write may
or may not be in the log), and every record a concurrent reader consumed. The checker compares it
with what the cluster holds at the end, read back through the leaders and from every replica's
files, and counts each kind of anomaly Kafka's guarantees rule out with ``acks=all``,
``min.insync.replicas=2`` and an idempotent producer:

* ``lost``: an acknowledged write missing from the final log;
* ``duplicated``: a value at more than one offset;
* ``moved``: an acknowledged write found at another offset than the one acknowledged, or another
  value at that offset (one offset, two values);
* ``reordered``: two writes of one partition in the log in the opposite order of their sends (the
  idempotent producer keeps send order per partition);
* ``dirty_reads``: a record a reader consumed during the run that is not at that offset at the end
  (read above the high watermark and later truncated);
* ``unknown``: a value in the log that was never sent;
* ``diverged``: a replica whose files hold another sequence of (offset, value) than the leader's.

Pure functions, so ``tests/unit/cluster/test_history_checker.py`` builds each anomaly by hand.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

#: (partition, offset, value)
Read = tuple[int, int, bytes]


@dataclass
class History:
    """Written by the writer's delivery callbacks and the reader thread; read after both stop."""

    sent: dict[int, list[bytes]] = field(default_factory=lambda: defaultdict(list))  # partition -> values in send order
    #: value -> (partition, offset); the offset is None when the client acknowledged the write
    #: without one (librdkafka's idempotent producer does so for a retry it infers was persisted)
    acked: dict[bytes, tuple[int, int | None]] = field(default_factory=dict)
    failed: dict[bytes, str] = field(default_factory=dict)  # value -> error (indeterminate)
    reads: list[Read] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def send(self, partition: int, value: bytes) -> None:
        with self.lock:
            self.sent[partition].append(value)

    def ack(self, value: bytes, partition: int, offset: int | None) -> None:
        with self.lock:
            self.acked[value] = (partition, offset)

    def fail(self, value: bytes, error: str) -> None:
        with self.lock:
            self.failed[value] = error

    def read(self, partition: int, offset: int, value: bytes) -> None:
        with self.lock:
            self.reads.append((partition, offset, value))


@dataclass
class Verdict:
    """Each anomaly with up to 10 examples; ``counts`` has every kind, 0 when clean."""

    counts: dict[str, int]
    examples: dict[str, list[str]]
    acked: int
    acked_without_offset: int
    failed: int
    reads: int
    final_records: int

    @property
    def valid(self) -> bool:
        return not any(self.counts.values())

    def summary(self) -> str:
        bad = {k: v for k, v in self.counts.items() if v}
        head = (f"{self.acked} acknowledged ({self.acked_without_offset} without an offset), "
                f"{self.failed} indeterminate, {self.reads} reads during the run, "
                f"{self.final_records} records at the end")
        if not bad:
            return f"valid: {head}"
        lines = [f"INVALID {bad}: {head}"]
        for kind in bad:
            lines.extend(f"  {kind}: {example}" for example in self.examples[kind])
        return "\n".join(lines)


KINDS = ("lost", "duplicated", "moved", "reordered", "dirty_reads", "unknown", "diverged")


def check(history: History, final: dict[int, list[tuple[int, bytes]]],
          replicas: dict[int, dict[int, list[tuple[int, bytes]]]] | None = None) -> Verdict:
    """``final``: partition -> (offset, value) read through the leaders at the end, in offset
    order; ``replicas``: broker id -> the same per partition, read from each broker's files."""
    counts = dict.fromkeys(KINDS, 0)
    examples: dict[str, list[str]] = {k: [] for k in KINDS}

    def found(kind: str, example: str) -> None:
        counts[kind] += 1
        if len(examples[kind]) < 10:
            examples[kind].append(example)

    send_index = {v: (p, i) for p, values in history.sent.items() for i, v in enumerate(values)}
    at: dict[tuple[int, int], bytes] = {}
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for partition, records in final.items():
        last_index = -1
        last_value = b""
        for offset, value in records:
            at[(partition, offset)] = value
            where[value].append((partition, offset))
            sent = send_index.get(value)
            if sent is None or sent[0] != partition:
                found("unknown", f"{value!r} at {partition}/{offset} was never sent to partition {partition}")
                continue
            if sent[1] < last_index:
                found("reordered", f"{value!r} (send #{sent[1]}) at {partition}/{offset} after {last_value!r} "
                                   f"(send #{last_index})")
            elif sent[1] > last_index:
                last_index, last_value = sent[1], value
    for value, places in where.items():
        if len(places) > 1:
            found("duplicated", f"{value!r} at {places}")
    for value, (partition, offset) in history.acked.items():
        places = where.get(value, [])
        if not places:
            found("lost", f"{value!r} acknowledged at {partition}/{offset}, not in the final log")
        elif offset is None:
            continue  # acknowledged without an offset: present exactly once is all that can be checked
        elif (partition, offset) not in places:
            found("moved", f"{value!r} acknowledged at {partition}/{offset}, found at {places}")
        held = at.get((partition, offset))
        if held is not None and held != value:
            found("moved", f"{partition}/{offset} acknowledged for {value!r} holds {held!r}")
    for partition, offset, value in history.reads:
        held = at.get((partition, offset))
        if held != value:
            found("dirty_reads", f"{value!r} read at {partition}/{offset}, which holds {held!r} at the end")
    for broker, partitions in (replicas or {}).items():
        for partition, records in final.items():
            mine = partitions.get(partition, [])
            if mine != records:
                first = next((i for i, (a, b) in enumerate(zip(mine, records, strict=False)) if a != b),
                             min(len(mine), len(records)))
                found("diverged", f"broker {broker} partition {partition}: {len(mine)} records vs the leaders' "
                                  f"{len(records)}, first difference at position {first}")
    return Verdict(counts, examples, len(history.acked), sum(o is None for _, o in history.acked.values()),
                   len(history.failed), len(history.reads),
                   sum(len(r) for r in final.values()))
