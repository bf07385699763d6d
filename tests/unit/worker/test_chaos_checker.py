"""The chaos checker on hand-built runs: a clean run counts nothing, and each violation is counted
by its check (a checker that cannot fail proves nothing)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dedupe_worker.chaos.checker import INFO, LIVENESS, SAFETY, attribute, check
from dedupe_worker.chaos.model import H_ATTEMPT, Attempt, LogRecord, Outcome, RunData, StoreDump, digest
from dedupe_worker.records import H_DLQ_REASON, H_SOURCE_OFFSET, H_SOURCE_PARTITION

A = "3f0c8a52-1111-4d2e-9a5b-2c9f0e7d6a01"
B = "3f0c8a52-2222-4d2e-9a5b-2c9f0e7d6a02"
C = "3f0c8a52-3333-4d2e-9a5b-2c9f0e7d6a03"
T0 = 1_800_000_000.0


def value(mid: str) -> bytes:
    return b'{"messageId":"%s","type":"track"}' % mid.encode()


def sent(aid: int, key: bytes | None, val: bytes | None, *, at: float, kind: str = "new",
         mid: str | None = None, partition: int = 0, offset: int | None = None,
         outcome: Outcome = Outcome.OK) -> tuple[Attempt, LogRecord]:
    headers = ((H_ATTEMPT, str(aid).encode()),)
    attempt = Attempt(id=aid, kind=kind, message_id=mid, digest=digest(key, val, headers), client_ts_ms=None,
                      t_invoke=at, t_complete=at + 0.01, outcome=outcome, partition=partition,
                      offset=aid if offset is None else offset)
    return attempt, LogRecord(partition, aid if offset is None else offset, key, val, headers, int(at * 1000))


def derived(src: LogRecord, offset: int, *extra: tuple[str, bytes | None]) -> LogRecord:
    """An output or dead-letter record of ``src``: its headers plus the source coordinates."""
    headers = (*src.headers, (H_SOURCE_PARTITION, str(src.partition).encode()),
               (H_SOURCE_OFFSET, str(src.offset).encode()), *extra)
    return LogRecord(src.partition, offset, src.key, src.value, headers, src.timestamp_ms)


def clean_run() -> tuple[RunData, list[LogRecord]]:
    """Partition 0: A, B, a malformed record, a retry of A 10 s later. Output A, B; DLQ the malformed."""
    a0, r0 = sent(0, A.encode(), value(A), at=T0, mid=A)
    a1, r1 = sent(1, B.encode(), value(B), at=T0 + 1, mid=B)
    a2, r2 = sent(2, None, b"not json {", at=T0 + 2, kind="malformed")
    a3, r3 = sent(3, A.encode(), value(A), at=T0 + 10, kind="retry_run", mid=A)
    run = RunData(
        attempts={a.id: a for a in (a0, a1, a2, a3)}, input=[r0, r1, r2, r3],
        output=[derived(r0, 0), derived(r1, 1)],
        dlq=[derived(r2, 0, (H_DLQ_REASON, b"invalid_json"))],
        committed={0: 4}, input_end={0: 4}, output_end={0: 2},
        stores={0: StoreDump(0, {A, B}, input_offset=4, output_offset=2)},
        window_s=3600, slack_s=60, t_stop=T0 + 100, partitions=1)
    return run, [r0, r1, r2, r3]


def violations(run: RunData) -> dict[str, int]:
    return {k: v for k, v in check(run).counts().items() if v and k not in INFO}


def test_clean_run_counts_nothing() -> None:
    run, _ = clean_run()
    result = check(run)
    assert result.valid
    assert all(n == 0 for n in result.counts().values()), result.counts()
    assert result.totals["consumed"] == 4
    assert (result.totals["published"], result.totals["duplicate"], result.totals["dead_lettered"]) == (2, 1, 1)
    assert set(result.counts()) == {*SAFETY, *LIVENESS, *INFO}


def test_lost_message() -> None:
    run, inp = clean_run()
    run.output = [derived(inp[0], 0)]
    run.stores[0].message_ids = {A}
    result = check(run)
    assert result.checks["lost"].count == 1
    assert result.checks["lost"].examples[0]["message_id"] == B
    assert result.checks["commit_ahead"].count == 1  # committed past record 1, which went nowhere
    assert not result.valid


def test_not_lost_while_unconsumed() -> None:
    """A record at or above the committed offset is unconsumed (liveness), not lost."""
    run, inp = clean_run()
    run.output = [derived(inp[0], 0)]
    run.stores[0].message_ids = {A}
    run.committed = {0: 1}
    got = violations(run)
    assert got == {"unconsumed": 3}
    assert not check(run).valid


def test_duplicate_in_window() -> None:
    run, inp = clean_run()
    run.output.append(derived(inp[3], 2))  # the retry of A, sent 10 s after A, published again
    run.output_end = {0: 3}
    result = check(run)
    assert violations(run) == {"duplicate_in_window": 1}
    assert result.checks["duplicate_in_window"].examples[0]["message_id"] == A
    assert result.checks["duplicate_in_window"].examples[0]["why"] == "inside the window"


def test_reemit_after_the_window_is_allowed() -> None:
    run, inp = clean_run()
    late = replace(run.attempts[3], t_invoke=T0 + 3600)  # beyond window_s - slack_s
    run.attempts[3] = late
    run.output.append(derived(inp[3], 2))
    run.output_end = {0: 3}
    run.t_stop = T0 + 3700
    assert violations(run) == {}
    assert check(run).checks["reemit_after_window"].count == 1


def test_one_input_record_published_twice() -> None:
    run, inp = clean_run()
    run.output.append(derived(inp[1], 2))
    run.output_end = {0: 3}
    result = check(run)
    assert result.checks["duplicate_in_window"].examples[0]["why"] == "one input record published twice"
    assert result.checks["order"].count == 1  # source offset 1 again after 1


def test_unexpected_payload_and_phantom() -> None:
    run, inp = clean_run()
    changed = LogRecord(0, 1, inp[1].key, value(B).replace(b"track", b"page"), derived(inp[1], 1).headers)
    phantom = derived(LogRecord(0, 9, C.encode(), value(C), ((H_ATTEMPT, b"99"),)), 2)
    run.output = [derived(inp[0], 0), changed, phantom]
    run.output_end = {0: 3}
    run.stores[0].message_ids = {A, B, C}
    result = check(run)
    whys = sorted(e["why"] for e in result.checks["unexpected"].examples)
    assert result.checks["unexpected"].count == 2
    assert whys[0].startswith("key, value or headers differ")
    assert whys[1].startswith("never sent")


def test_unexpected_value_differs_from_first_copy() -> None:
    """A retry carrying another payload under the same messageId must not replace the first."""
    run, inp = clean_run()
    a3, r3 = sent(3, A.encode(), value(A) + b" ", at=T0 + 10, kind="retry_run", mid=A)
    run.attempts[3], run.input[3] = a3, r3
    run.output = [derived(r3, 0), derived(inp[1], 1)]  # the retry published instead of the first copy
    result = check(run)
    assert result.checks["unexpected"].count == 1
    assert result.checks["unexpected"].examples[0]["why"] == "value differs from the first input copy of its messageId"


def test_order_source_offsets_go_back() -> None:
    run, inp = clean_run()
    run.output = [derived(inp[1], 0), derived(inp[0], 1)]
    assert violations(run) == {"order": 1}


def test_output_in_another_partition() -> None:
    run, inp = clean_run()
    moved = derived(inp[1], 0)
    run.output = [derived(inp[0], 0), replace(moved, partition=1)]
    run.stores[1] = StoreDump(1, {B}, 0, 0)
    run.output_end = {0: 1, 1: 1}
    got = check(run)
    assert got.checks["order"].count == 1
    assert got.checks["order"].examples[0]["why"].startswith("source partition 0 in output partition 1")


def test_commit_ahead_of_the_input() -> None:
    run, _ = clean_run()
    run.committed = {0: 7}
    result = check(run)
    assert violations(run) == {"commit_ahead": 1}
    assert result.checks["commit_ahead"].examples[0]["why"] == "committed past the input's end"


def test_commit_ahead_of_the_dead_letters() -> None:
    """Hole 1 of issue 16: the input committed past a malformed record that never reached the DLQ."""
    run, _ = clean_run()
    run.dlq = []
    got = violations(run)
    assert got == {"dlq_lost": 1, "commit_ahead": 1}


def test_accounting_valid_record_dead_lettered() -> None:
    run, inp = clean_run()
    run.dlq.append(derived(inp[1], 1, (H_DLQ_REASON, b"invalid_json")))
    result = check(run)
    assert violations(run) == {"accounting": 1}
    assert result.checks["accounting"].examples[0]["classes"] == ["published", "dead_lettered"]


def test_accounting_dead_letter_of_nothing() -> None:
    run, _ = clean_run()
    ghost = LogRecord(0, 42, None, b"x", ())
    run.dlq.append(derived(ghost, 1, (H_DLQ_REASON, b"invalid_json")))
    assert violations(run) == {"accounting": 1}


def test_accounting_malformed_record_published() -> None:
    run, inp = clean_run()
    run.output.append(derived(inp[2], 2))
    run.output_end = {0: 3}
    got = check(run)
    assert got.checks["accounting"].count == 1
    assert got.checks["unexpected"].examples[0]["why"] == "a record without a messageId was published"


def test_dlq_reason_wrong() -> None:
    run, inp = clean_run()
    run.dlq = [derived(inp[2], 0, (H_DLQ_REASON, b"missing_message_id"))]
    assert violations(run) == {"dlq_reason": 1}


@pytest.mark.parametrize(("ids", "output_offset", "why"), [
    ({A, B, C}, 2, "in RocksDB, not in the output"),
    ({A}, 2, "in the output within the window, not in RocksDB"),
    ({A, B}, 5, "RocksDB ahead of the output"),
])
def test_index_consistency(ids: set[str], output_offset: int, why: str) -> None:
    run, _ = clean_run()
    run.stores[0] = StoreDump(0, ids, 4, output_offset)
    result = check(run)
    assert violations(run) == {"index_consistency": 1}
    assert result.checks["index_consistency"].examples[0]["why"] == why


def test_index_may_lack_ids_older_than_the_window() -> None:
    run, _ = clean_run()
    run.stores[0] = StoreDump(0, {B}, 4, 2)
    run.t_stop = T0 + 3600.5  # A's latest copy (sent at T0) is out of the window, B's (T0 + 1) is not
    assert violations(run) == {}


def test_unreadable_store() -> None:
    run, _ = clean_run()
    run.stores[0] = StoreDump(0, set(), 0, 0, error="LOCK held")
    assert violations(run) == {"index_consistency": 1}


def test_acknowledged_input_lost_by_the_broker() -> None:
    run, _ = clean_run()
    a9, _ = sent(9, C.encode(), value(C), at=T0 + 20, mid=C, offset=4)
    run.attempts[9] = a9
    assert violations(run) == {"input_lost": 1}


def test_unknown_outcome_that_landed_is_recovered() -> None:
    run, _ = clean_run()
    run.attempts[1] = replace(run.attempts[1], outcome=Outcome.UNKNOWN, partition=None, offset=None)
    result = check(run)
    assert violations(run) == {}
    assert result.checks["recovered"].count == 1


def test_examples_are_capped() -> None:
    run, inp = clean_run()
    run.output = [derived(inp[0], i) for i in range(30)]  # A published 30 times from one record
    run.output_end = {0: 30}
    run.stores[0].message_ids = {A}
    result = check(run)
    assert result.checks["duplicate_in_window"].count == 29
    assert len(result.checks["duplicate_in_window"].examples) == 10


def test_attribution_to_the_nearest_fault_on_the_partition() -> None:
    run, inp = clean_run()
    run.output.append(derived(inp[3], 2))  # a duplicate of A whose retry was sent at T0 + 10
    run.output_end = {0: 3}
    dup = check(run).checks["duplicate_in_window"]
    faults = [("worker_kill", T0 + 5, T0 + 6, {0}), ("second_worker", T0 + 9, T0 + 15, {1}),
              ("broker_kill", T0 + 200, T0 + 201, None)]
    assert attribute(dup, faults) == {"worker_kill": 1}  # second_worker is nearer but on partition 1
    assert attribute(dup, faults[1:]) == {"none": 1}


def test_attribution_prefers_the_fault_in_progress() -> None:
    run, inp = clean_run()
    run.output.append(derived(inp[3], 2))  # sent at T0 + 10
    run.output_end = {0: 3}
    dup = check(run).checks["duplicate_in_window"]
    faults = [("second_worker", T0, T0 + 12, {0}), ("marker_delay", T0 + 11, T0 + 20, None)]
    assert attribute(dup, faults) == {"second_worker": 1}  # marker_delay starts nearer, but later


def test_a_rare_cause_keeps_examples() -> None:
    from dedupe_worker.chaos.checker import Check

    c = Check("x")
    for i in range(50):
        c.add(why="frequent", n=i)
    c.add(why="rare", n=99)
    assert c.count == 51
    assert [e["n"] for e in c.examples if e["why"] == "rare"] == [99]
    assert sum(e["why"] == "frequent" for e in c.examples) == 10
