"""The cluster history checker (tests/chaos/cluster/history.py) counts each anomaly it exists for,
built by hand, and nothing in a clean history."""

from __future__ import annotations

from tests.chaos.cluster.history import KINDS, History, check


def clean() -> tuple[History, dict[int, list[tuple[int, bytes]]]]:
    h = History()
    for i in range(4):
        h.send(0, b"a%d" % i)
        h.send(1, b"b%d" % i)
    for i in range(3):
        h.ack(b"a%d" % i, 0, i)
        h.ack(b"b%d" % i, 1, i)
    h.fail(b"a3", "_MSG_TIMED_OUT")  # indeterminate: may be in the log or not
    h.fail(b"b3", "_MSG_TIMED_OUT")
    h.read(0, 1, b"a1")
    final = {0: [(0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"a3")], 1: [(0, b"b0"), (1, b"b1"), (2, b"b2")]}
    return h, final


def only(verdict_counts: dict[str, int], kind: str) -> None:
    assert verdict_counts[kind] >= 1, verdict_counts
    assert all(n == 0 for k, n in verdict_counts.items() if k != kind), verdict_counts


def test_a_clean_history_is_valid_with_its_replicas() -> None:
    h, final = clean()
    verdict = check(h, final, {1: final, 2: {p: list(r) for p, r in final.items()}})
    assert verdict.valid, verdict.summary()
    assert set(verdict.counts) == set(KINDS)
    assert (verdict.acked, verdict.failed, verdict.reads, verdict.final_records) == (6, 2, 1, 7)


def test_a_lost_acknowledged_write() -> None:
    h, final = clean()
    final[1] = final[1][:2]
    only(check(h, final).counts, "lost")


def test_a_duplicate() -> None:
    h, final = clean()
    final[1].append((3, b"b2"))
    only(check(h, final).counts, "duplicated")


def test_an_acknowledged_offset_holding_another_value() -> None:
    h, final = clean()
    final[0] = [(0, b"a0"), (1, b"a1"), (3, b"a2"), (4, b"a3")]  # a2 acknowledged at 2
    only(check(h, final).counts, "moved")


def test_reordering_within_a_partition() -> None:
    h, final = clean()
    h.acked.pop(b"a1")
    h.acked.pop(b"a2")
    h.reads.clear()
    final[0] = [(0, b"a0"), (1, b"a2"), (2, b"a1"), (3, b"a3")]
    only(check(h, final).counts, "reordered")


def test_a_dirty_read_later_truncated() -> None:
    h, final = clean()
    h.read(1, 3, b"b3")  # read at 1/3 during the run; the final log ends at 2
    only(check(h, final).counts, "dirty_reads")


def test_a_value_never_sent() -> None:
    h, final = clean()
    final[1].append((3, b"zz"))
    only(check(h, final).counts, "unknown")


def test_a_diverged_replica() -> None:
    h, final = clean()
    replica = {0: final[0], 1: [(0, b"b0"), (1, b"b1")]}
    verdict = check(h, final, {1: final, 3: replica})
    only(verdict.counts, "diverged")
    assert "broker 3 partition 1" in verdict.summary()


def test_a_write_acknowledged_without_an_offset_is_checked_for_presence_only() -> None:
    h, final = clean()
    h.ack(b"a3", 0, None)
    h.failed.pop(b"a3")
    verdict = check(h, final)
    assert verdict.valid, verdict.summary()
    assert verdict.acked_without_offset == 1
    final[0] = final[0][:3]
    only(check(h, final).counts, "lost")
