"""Kafka's ``transactions_test`` pattern on ads-broker: seeded input, two transactional copier
processes SIGKILLed and restarted repeatedly, a concurrent read_committed reader.

Asserts: the committed output is exactly the input (same multiset of values per partition: no
loss, no duplicate), and every record the concurrent read_committed reader saw is a committed
record at the same (partition, offset) — it never saw aborted or not-yet-decided data.
Size: see SEED_MESSAGES (chosen to fit the 5-minute budget on 2 shared cores)."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from ads_broker.embedded import ads_broker_process
from tests.kafka_helpers import create_topic, produce_all

SEED_MESSAGES = 100_000
PARTITIONS = 4
KILLS = 10
pytestmark = pytest.mark.timeout(420)


def read_committed_all(bootstrap: str, topic: str, stop: threading.Event | None,
                       out: dict[tuple[int, int], bytes], deadline_s: float,
                       isolation: str = "read_committed") -> None:
    """Read ``topic`` into out[(partition, offset)] until stop (or, without one, every EOF)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"v-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "isolation.level": isolation})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    eof: set[int] = set()
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if stop is not None and stop.is_set():
            break
        if stop is None and len(eof) == PARTITIONS:
            break
        for m in c.consume(1000, 0.2):
            err = m.error()
            p = m.partition()
            assert p is not None
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof.add(p)
                    continue
                raise AssertionError(f"reader error: {err}")
            eof.discard(p)
            off = m.offset()
            value = m.value()
            assert off is not None and value is not None
            assert (p, off) not in out, f"offset {p}/{off} delivered twice"
            out[(p, off)] = value
    c.close()


def test_copiers_sigkilled_repeatedly_copy_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(1234)
    config = {"transaction.state.log.num.partitions": "4", "offsets.topic.num.partitions": "4",
              "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker:
        bs = broker.bootstrap
        create_topic(bs, "input", PARTITIONS)
        create_topic(bs, "output", PARTITIONS)
        inputs = [(f"k{i}".encode(), f"msg-{i:08d}".encode(), i % PARTITIONS) for i in range(SEED_MESSAGES)]
        produce_all(bs, "input", inputs, **{"linger.ms": 20, "batch.num.messages": 2000})
        ends = [SEED_MESSAGES // PARTITIONS + (1 if p < SEED_MESSAGES % PARTITIONS else 0)
                for p in range(PARTITIONS)]

        def copier_argv(i: int, seed: int) -> list[str]:
            mine = [p for p in range(PARTITIONS) if p % 2 == i]
            return [sys.executable, "-m", "tests.chaos.txn.copier", "--bootstrap", bs, "--input", "input",
                    "--output", "output", "--group", "copy-group", "--transactional-id", f"copier-{i}",
                    "--partitions", ",".join(map(str, mine)), "--end", ",".join(str(ends[p]) for p in mine),
                    "--seed", str(seed)]

        logs = [open(tmp_path / f"copier-{i}.log", "ab") for i in range(2)]  # noqa: SIM115
        procs = [subprocess.Popen(copier_argv(i, i), stdout=logs[i], stderr=subprocess.STDOUT) for i in range(2)]
        seen: dict[tuple[int, int], bytes] = {}
        stop = threading.Event()
        reader = threading.Thread(target=read_committed_all, args=(bs, "output", stop, seen, 400), daemon=True)
        reader.start()
        kills = 0
        try:
            for k in range(KILLS):
                time.sleep(rng.uniform(0.3, 1.5))
                i = k % 2
                if procs[i].poll() is not None:
                    break  # this copier already finished its partitions
                procs[i].kill()  # SIGKILL, by PID, a process this test started
                procs[i].wait(30)
                kills += 1
                procs[i] = subprocess.Popen(copier_argv(i, 100 + k), stdout=logs[i], stderr=subprocess.STDOUT)
            codes = [p.wait(300) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(30)
            for f in logs:
                f.close()
        assert codes == [0, 0], f"copier exit codes {codes}; see {tmp_path}/copier-*.log"
        stop.set()
        reader.join(60)

        final: dict[tuple[int, int], bytes] = {}
        read_committed_all(bs, "output", None, final, 120)
        by_partition: dict[int, list[bytes]] = {}
        for (p, _off), value in final.items():
            by_partition.setdefault(p, []).append(value)
        for p in range(PARTITIONS):
            expected = sorted(v for _k, v, part in inputs if part == p)
            got = sorted(by_partition.get(p, []))
            assert len(got) == len(set(got)), f"partition {p}: duplicates in the committed output"
            assert got == expected, f"partition {p}: {len(got)} committed records, expected {len(expected)}"
        not_committed = {k: v for k, v in seen.items() if final.get(k) != v}
        assert not not_committed, f"read_committed reader saw {len(not_committed)} aborted records"
        # Kills mid-copy and deliberate aborts must have left aborted data in the log, or the
        # reader check above proves nothing.
        assert kills >= 4, f"only {kills} copier kills happened before the copy finished"
        everything: dict[tuple[int, int], bytes] = {}
        read_committed_all(bs, "output", None, everything, 120, isolation="read_uncommitted")
        assert len(everything) > len(final) == SEED_MESSAGES


GROUP_MESSAGES = 20_000
GROUP_KILLS = 4


def test_group_subscribed_copiers_sigkilled_copy_exactly_once(tmp_path: Path) -> None:
    """The same check with both copiers in one consumer group (subscribe + KIP-447 group metadata):
    partitions move between them on every kill, offsets are fetched with require_stable."""
    rng = random.Random(99)
    config = {"transaction.state.log.num.partitions": "4", "offsets.topic.num.partitions": "4",
              "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
              "group.min.session.timeout.ms": "1000"}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker:
        bs = broker.bootstrap
        create_topic(bs, "input", PARTITIONS)
        create_topic(bs, "output", PARTITIONS)
        inputs = [(f"k{i}".encode(), f"msg-{i:08d}".encode(), i % PARTITIONS) for i in range(GROUP_MESSAGES)]
        produce_all(bs, "input", inputs, **{"linger.ms": 20, "batch.num.messages": 500})
        ends = [GROUP_MESSAGES // PARTITIONS] * PARTITIONS

        def argv(i: int, seed: int) -> list[str]:
            return [sys.executable, "-m", "tests.chaos.txn.group_copier", "--bootstrap", bs, "--input", "input",
                    "--output", "output", "--group", "copy-group", "--transactional-id", f"gcopier-{i}",
                    "--end", ",".join(map(str, ends)), "--seed", str(seed)]

        logs = [open(tmp_path / f"copier-{i}.log", "ab") for i in range(2)]  # noqa: SIM115
        procs = [subprocess.Popen(argv(i, i), stdout=logs[i], stderr=subprocess.STDOUT) for i in range(2)]
        seen: dict[tuple[int, int], bytes] = {}
        stop = threading.Event()
        reader = threading.Thread(target=read_committed_all, args=(bs, "output", stop, seen, 280), daemon=True)
        reader.start()
        kills = 0
        try:
            for k in range(GROUP_KILLS):
                time.sleep(rng.uniform(1.0, 3.0))
                i = k % 2
                if procs[i].poll() is not None:
                    break
                procs[i].kill()  # SIGKILL, by PID, a process this test started
                procs[i].wait(30)
                kills += 1
                procs[i] = subprocess.Popen(argv(i, 100 + k), stdout=logs[i], stderr=subprocess.STDOUT)
            codes = [p.wait(240) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(30)
            for f in logs:
                f.close()
        assert codes == [0, 0], f"copier exit codes {codes}; see {tmp_path}/copier-*.log"
        stop.set()
        reader.join(60)
        final: dict[tuple[int, int], bytes] = {}
        read_committed_all(bs, "output", None, final, 120)
        for p in range(PARTITIONS):
            got = sorted(v for (part, _o), v in final.items() if part == p)
            expected = sorted(v for _k, v, part in inputs if part == p)
            assert got == expected, f"partition {p}: {len(got)} committed records, expected {len(expected)}"
        not_committed = {k: v for k, v in seen.items() if final.get(k) != v}
        assert not not_committed, f"read_committed reader saw {len(not_committed)} aborted records"
        assert kills >= 2, f"only {kills} copier kills happened before the copy finished"
