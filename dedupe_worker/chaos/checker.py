"""The checker: one pass over a run's recorded history and final state, counting each anomaly.

Inputs (:class:`~dedupe_worker.chaos.model.RunData`): every send attempt with its outcome, the
input topic, the output and dead-letter topics read with ``read_committed``, the consumer group's
committed input offsets, and each partition's RocksDB after the workers stopped. Each check
returns a count and up to :data:`EXAMPLES` examples (Jepsen's habit); docs/RELIABILITY.md
defines them. In short, with ``C_p`` the committed offset of input partition p, a *consumed*
record is one below ``C_p``, and a consumed record is

* *published* when an output record names it (``dedupe.source.partition``/``offset``),
* a *duplicate* when it is valid, not published, and its messageId is in output partition p,
* *dead-lettered* when a dead-letter record names it.

Safety checks (any non-zero count fails the run): ``lost``, ``duplicate_in_window``,
``unexpected``, ``order``, ``commit_ahead``, ``accounting``, ``dlq_lost``, ``dlq_reason``,
``index_consistency``, ``input_lost``. Liveness: ``unconsumed``. Information only:
``reemit_after_window``, ``recovered``, ``failed_but_written``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from dedupe_worker.chaos.model import Attempt, LogRecord, Outcome, RunData
from dedupe_worker.records import H_DLQ_REASON, H_SOURCE_OFFSET, H_SOURCE_PARTITION, classify

EXAMPLES = 10
PER_WHY = 3
TOO_LARGE = "message_too_large"
SAFETY = ("lost", "duplicate_in_window", "unexpected", "order", "commit_ahead", "accounting", "dlq_lost",
          "dlq_reason", "index_consistency", "input_lost")
LIVENESS = ("unconsumed",)
INFO = ("reemit_after_window", "recovered", "failed_but_written")

Src = tuple[int, int]


@dataclass
class Check:
    """One anomaly class: how many, and the first few examples."""

    name: str
    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)
    #: per violation: when its input was sent and its partition (None: unknown), to attribute
    #: counts to faults
    where: list[tuple[float | None, int | None]] = field(default_factory=list)

    def add(self, t: float | None = None, **example: Any) -> None:
        """Count one violation; keep the first :data:`EXAMPLES` examples, and up to
        :data:`PER_WHY` of every other ``why`` seen later, so that a rare cause is not hidden
        behind a frequent one."""
        self.count += 1
        self.where.append((t, _partition_of(example)))
        why = str(example.get("why", ""))
        seen = sum(1 for e in self.examples if str(e.get("why", "")) == why)
        if len(self.examples) < EXAMPLES or (seen < PER_WHY and len(self.examples) < 3 * EXAMPLES):
            self.examples.append(example)

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "examples": self.examples}


@dataclass
class CheckResult:
    checks: dict[str, Check]
    totals: dict[str, Any]

    @property
    def safety_violations(self) -> int:
        return sum(self.checks[n].count for n in SAFETY)

    @property
    def valid(self) -> bool:
        return self.safety_violations == 0 and all(self.checks[n].count == 0 for n in LIVENESS)

    def counts(self) -> dict[str, int]:
        return {name: c.count for name, c in self.checks.items()}

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "safety": list(SAFETY), "liveness": list(LIVENESS), "info": list(INFO),
                "counts": self.counts(), "checks": {n: c.to_json() for n, c in self.checks.items()},
                "totals": self.totals}


def _partition_of(example: dict[str, Any]) -> int | None:
    if isinstance(example.get("partition"), int):
        return int(example["partition"])
    for name in ("input", "output"):
        ref = example.get(name)
        ref = ref[0] if isinstance(ref, list) and ref else ref
        if isinstance(ref, str) and "@" in ref:
            return int(ref.split("@", 1)[0])
    return None


def _src(rec: LogRecord) -> Src | None:
    p, o = rec.int_header(H_SOURCE_PARTITION), rec.int_header(H_SOURCE_OFFSET)
    return None if p is None or o is None else (p, o)


def _ref(rec: LogRecord) -> str:
    return f"{rec.partition}@{rec.offset}"


class _Run:
    """Indexes over a run that several checks share."""

    def __init__(self, run: RunData) -> None:
        self.run = run
        run.output.sort(key=lambda x: (x.partition, x.offset))
        self.at: dict[Src, LogRecord] = {(r.partition, r.offset): r for r in run.input}
        self.committed = {p: max(c, 0) for p, c in run.committed.items()}
        # messageId (or None) and expected dead-letter reason (or None) of each input record
        self.mid: dict[Src, str | None] = {}
        self.reason: dict[Src, str | None] = {}
        for at, rec in self.at.items():
            c = classify(rec.key, rec.value)
            attempt = self.attempt(rec)
            oversized = attempt is not None and attempt.kind == "oversized"
            self.mid[at] = c.message_id
            self.reason[at] = TOO_LARGE if oversized else (str(c.reason) if c.reason is not None else None)
        self.published: dict[Src, list[LogRecord]] = defaultdict(list)
        self.out_ids: dict[int, dict[str, list[LogRecord]]] = defaultdict(lambda: defaultdict(list))
        self.all_out_ids: set[str] = set()
        for rec in run.output:
            out_src = _src(rec)
            if out_src is not None:
                self.published[out_src].append(rec)
            mid = classify(rec.key, rec.value).message_id
            if mid is not None:
                self.out_ids[rec.partition][mid].append(rec)
                self.all_out_ids.add(mid)
        self.dead: dict[Src, list[LogRecord]] = defaultdict(list)
        for rec in run.dlq:
            dead_src = _src(rec)
            if dead_src is not None:
                self.dead[dead_src].append(rec)

    def attempt(self, rec: LogRecord) -> Attempt | None:
        aid = rec.attempt
        return None if aid is None else self.run.attempts.get(aid)

    def consumed(self, src: Src) -> bool:
        return src[1] < self.committed.get(src[0], 0)

    def sent_at(self, rec: LogRecord) -> float | None:
        a = self.attempt(rec)
        return None if a is None else a.t_invoke


def check(run: RunData) -> CheckResult:
    """Run every check over ``run``."""
    r = _Run(run)
    checks = {name: Check(name) for name in (*SAFETY, *LIVENESS, *INFO)}
    _check_input(r, checks)
    _check_lost(r, checks)
    _check_duplicates(r, checks)
    _check_unexpected(r, checks)
    _check_order(r, checks)
    totals = _check_accounting(r, checks)
    _check_dlq(r, checks)
    _check_index(r, checks)
    totals.update(attempts=len(run.attempts), input_records=len(run.input), output_records=len(run.output),
                  dlq_records=len(run.dlq), output_ids=len(r.all_out_ids))
    return CheckResult(checks, totals)


def _check_input(r: _Run, checks: dict[str, Check]) -> None:
    """``input_lost``: an acknowledged send missing from the input (the broker lost it).
    ``recovered``/``failed_but_written``: sends without an ok that are in the input anyway."""
    in_input = {rec.attempt for rec in r.run.input}
    for a in r.run.attempts.values():
        if a.outcome is Outcome.OK:
            rec = r.at.get((a.partition, a.offset)) if a.partition is not None and a.offset is not None else None
            if rec is None or rec.attempt != a.id:
                checks["input_lost"].add(a.t_invoke, attempt=a.id, message_id=a.message_id, partition=a.partition,
                                         offset=a.offset, found_attempt=rec.attempt if rec else None)
        elif a.id in in_input:
            checks["recovered" if a.outcome is not Outcome.FAILED else "failed_but_written"].add(
                attempt=a.id, message_id=a.message_id, outcome=str(a.outcome), error=a.error)


def _check_lost(r: _Run, checks: dict[str, Check]) -> None:
    """``lost``: a valid messageId with a consumed input record that is nowhere in the output.
    ``unconsumed``: input records at or above the committed offset after the final drain."""
    copies: dict[str, list[Src]] = defaultdict(list)
    for src, mid in r.mid.items():
        if mid is not None and r.reason[src] is None:
            copies[mid].append(src)
    for src in sorted(r.at):
        if not r.consumed(src):
            checks["unconsumed"].add(r.sent_at(r.at[src]), partition=src[0], offset=src[1], message_id=r.mid[src],
                                     committed=r.committed.get(src[0], 0))
    for mid, srcs in copies.items():
        if mid in r.all_out_ids or not any(r.consumed(s) for s in srcs):
            continue
        first = r.sent_at(r.at[min(srcs)])
        checks["lost"].add(first, message_id=mid, input=[f"{p}@{o}" for p, o in sorted(srcs)],
                           attempts=[_attempt_brief(r.attempt(r.at[s])) for s in sorted(srcs)],
                           dead_lettered=any(s in r.dead for s in srcs))


def _attempt_brief(a: Attempt | None) -> dict[str, Any] | None:
    if a is None:
        return None
    return {"id": a.id, "kind": a.kind, "outcome": str(a.outcome), "t_invoke": round(a.t_invoke, 3),
            "client_ts_ms": a.client_ts_ms}


def _check_duplicates(r: _Run, checks: dict[str, Check]) -> None:
    """``duplicate_in_window``: two output copies of one messageId whose input records were sent
    less than ``window_s - slack_s`` apart (or the same input record published twice, or copies
    whose send time is unknown). Copies further apart: ``reemit_after_window`` (allowed)."""
    limit = r.run.window_s - r.run.slack_s
    for partition, ids in r.out_ids.items():
        for mid, recs in ids.items():
            for prev, cur in pairwise(recs):
                t0, t1 = r.sent_at(prev), r.sent_at(cur)
                same = _src(prev) == _src(cur)
                gap = None if t0 is None or t1 is None else abs(t1 - t0)
                example = {"message_id": mid, "output": [_ref(prev), _ref(cur)],
                           "sources": [_src(prev), _src(cur)], "send_gap_s": None if gap is None else round(gap, 3),
                           "attempts": [prev.attempt, cur.attempt], "partition": partition}
                if same:
                    checks["duplicate_in_window"].add(t1, why="one input record published twice", **example)
                elif gap is None or gap < limit:
                    checks["duplicate_in_window"].add(t1, why="inside the window", **example)
                else:
                    checks["reemit_after_window"].add(t1, **example)


def _check_unexpected(r: _Run, checks: dict[str, Check]) -> None:
    """``unexpected``: an output record that was never sent, or whose key, value or client headers
    differ from the attempt it names, or from the input record at its source offset, or whose value
    differs from the first input copy of its messageId."""
    first_value: dict[tuple[int, str], bytes | None] = {}
    for src in sorted(r.at):
        mid = r.mid[src]
        if mid is not None:
            first_value.setdefault((src[0], mid), r.at[src].value)
    for rec in r.run.output:
        why = _unexpected_why(r, rec, first_value)
        if why is not None:
            checks["unexpected"].add(r.sent_at(rec), output=_ref(rec), why=why, attempt=rec.attempt,
                                     source=_src(rec),
                                     key=rec.key.decode(errors="replace") if rec.key else None)


def _unexpected_why(r: _Run, rec: LogRecord, first_value: dict[tuple[int, str], bytes | None]) -> str | None:
    attempt = r.attempt(rec)
    if attempt is None:
        return "never sent (no known chaos.attempt header)"
    if rec.digest != attempt.digest:
        return "key, value or headers differ from the attempt"
    src = _src(rec)
    source = r.at.get(src) if src is not None else None
    if source is None:
        return f"source {src} is not an input record"
    if source.attempt != attempt.id:
        return f"source {src} holds attempt {source.attempt}, not {attempt.id}"
    mid = classify(rec.key, rec.value).message_id
    if mid is None:
        return "a record without a messageId was published"
    if first_value.get((source.partition, mid), rec.value) != rec.value:
        return "value differs from the first input copy of its messageId"
    return None


def _check_order(r: _Run, checks: dict[str, Check]) -> None:
    """``order``: along each output partition, source partition = output partition and source
    offsets strictly increase."""
    last: dict[int, int] = {}
    for rec in sorted(r.run.output, key=lambda x: (x.partition, x.offset)):
        src = _src(rec)
        if src is None:
            checks["order"].add(output=_ref(rec), why="no source partition/offset headers")
            continue
        if src[0] != rec.partition:
            checks["order"].add(output=_ref(rec), why=f"source partition {src[0]} in output partition {rec.partition}")
        prev = last.get(rec.partition)
        if prev is not None and src[1] <= prev:
            checks["order"].add(r.sent_at(rec), output=_ref(rec), why="source offset did not increase",
                                previous_source_offset=prev,
                                source_offset=src[1])
        last[rec.partition] = src[1] if prev is None else max(prev, src[1])


def _classes(r: _Run, src: Src) -> list[str]:
    out = []
    if src in r.published:
        out.append("published")
    mid = r.mid[src]
    if src not in r.published and mid is not None and r.reason[src] is None and mid in r.out_ids.get(src[0], {}):
        out.append("duplicate")
    if src in r.dead:
        out.append("dead_lettered")
    return out


def _check_accounting(r: _Run, checks: dict[str, Check]) -> dict[str, Any]:
    """``commit_ahead``: a committed offset past a record that was neither published, a duplicate
    nor dead-lettered (or past the input's end). ``accounting``: consumed = published + duplicates
    + dead-lettered fails record by record: a record in two classes, a malformed record published, a
    valid record dead-lettered, a dead letter of no input record."""
    per: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for p, c in r.committed.items():
        end = r.run.input_end.get(p, 0)
        if c > end:
            checks["commit_ahead"].add(partition=p, committed=c, input_end=end, why="committed past the input's end")
    for src in sorted(r.at):
        if not r.consumed(src):
            continue
        counts = per[src[0]]
        counts["consumed"] += 1
        classes = _classes(r, src)
        for cls in classes:
            counts[cls] += 1
        example = {"input": f"{src[0]}@{src[1]}", "message_id": r.mid[src], "reason": r.reason[src],
                   "classes": classes, "attempt": r.at[src].attempt}
        t = r.sent_at(r.at[src])
        if not classes:
            checks["commit_ahead"].add(t, why="committed, but neither published, duplicate nor dead-lettered",
                                       committed=r.committed.get(src[0]), **example)
        elif len(classes) > 1:
            checks["accounting"].add(t, why="in more than one class", **example)
        elif classes == ["published"] and r.reason[src] is not None:
            checks["accounting"].add(t, why="a malformed record was published", **example)
        elif classes == ["dead_lettered"] and r.reason[src] is None:
            checks["accounting"].add(t, why="a valid record was dead-lettered", **example)
    for src, recs in r.dead.items():
        if src not in r.at:
            checks["accounting"].add(why="dead letter of no input record", input=f"{src[0]}@{src[1]}",
                                     dlq=[_ref(x) for x in recs[:3]])
    totals: dict[str, Any] = {k: sum(c.get(k, 0) for c in per.values())
                              for k in ("consumed", "published", "duplicate", "dead_lettered")}
    totals["per_partition"] = {p: dict(c) for p, c in sorted(per.items())}
    return totals


def _check_dlq(r: _Run, checks: dict[str, Check]) -> None:
    """``dlq_lost``: a consumed malformed record with no dead letter. ``dlq_reason``: a dead letter
    whose ``dedupe.dlq.reason`` is not the record's reason."""
    for src in sorted(r.at):
        expected = r.reason[src]
        if expected is None or not r.consumed(src):
            continue
        dead = r.dead.get(src)
        if not dead:
            checks["dlq_lost"].add(r.sent_at(r.at[src]), input=f"{src[0]}@{src[1]}", reason=expected,
                                   attempt=r.at[src].attempt,
                                   published=src in r.published)
            continue
        reasons = {(d.header(H_DLQ_REASON) or b"").decode(errors="replace") for d in dead}
        if reasons != {expected}:
            checks["dlq_reason"].add(r.sent_at(r.at[src]), input=f"{src[0]}@{src[1]}", expected=expected,
                                     found=sorted(reasons))


def _check_index(r: _Run, checks: dict[str, Check]) -> None:
    """``index_consistency``: per partition, every messageId in RocksDB is in the output partition
    (an extra one would drop a real event), every output messageId whose latest copy was sent
    within the window before the stop is in RocksDB (a missing one lets a retry through), and the
    store's recorded output offset is not past the output's end."""
    since = r.run.t_stop - r.run.window_s
    for p in sorted(set(r.run.stores) | set(r.out_ids)):
        store = r.run.stores.get(p)
        ids = r.out_ids.get(p, {})
        if store is None or store.error is not None:
            why = f"store not readable: {store.error if store else 'missing'}"
            checks["index_consistency"].add(partition=p, why=why)
            continue
        end = r.run.output_end.get(p, 0)
        if store.output_offset > end:
            checks["index_consistency"].add(partition=p, why="RocksDB ahead of the output",
                                            store_output_offset=store.output_offset, output_end=end)
        for mid in sorted(store.message_ids - ids.keys()):
            checks["index_consistency"].add(None, partition=p, message_id=mid, why="in RocksDB, not in the output")
        for mid, recs in ids.items():
            if mid in store.message_ids:
                continue
            sent = r.sent_at(recs[-1])
            if sent is None or sent > since:
                age = None if sent is None else round(r.run.t_stop - sent, 1)
                checks["index_consistency"].add(sent, partition=p, message_id=mid, output=_ref(recs[-1]),
                                                why="in the output within the window, not in RocksDB",
                                                sent_s_before_stop=age)



def attribute(check: Check, faults: list[tuple[str, float, float, set[int] | None]], before_s: float = 10.0,
              after_s: float = 30.0) -> dict[str, int]:
    """Approximate cause of each violation: among the faults (kind, start, end, partitions touched
    or None for all) that touch its partition and whose span, widened by ``before_s`` before the
    start and ``after_s`` after the end, holds its input's send time, the nearest one (distance 0
    inside the span, else to its start or end); ``none`` when no fault is near, ``unknown``
    without a send time. A loss caused later than the send (a power cut losing what was sent a
    minute before) is attributed to the fault near the send, so read losses with their examples."""
    out: dict[str, int] = defaultdict(int)
    for t, p in check.where:
        if t is None:
            out["unknown"] += 1
            continue
        near = [(0.0 if start <= t <= end else min(abs(t - start), abs(t - end)), kind)
                for kind, start, end, parts in faults
                if start - before_s <= t <= end + after_s and (parts is None or p is None or p in parts)]
        out[min(near)[1] if near else "none"] += 1
    return dict(sorted(out.items()))
