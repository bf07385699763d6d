"""Issue 16's holes, each reproduced through real processes (ads-broker + worker subprocesses).

Every test here failed on 2bf15d3 (the commit the issue was filed against) and states which
guarantee it proves:

* dead letters survive a crash between the output's ack and the DLQ's (hole 1);
* a second worker on a live partition cannot double its output (hole 4);
* acknowledged output lost under the worker (a broker restart that lost unsynced writes) is
  detected and repaired from the input, never silently dropped (hole 5);
* a produce the broker holds past the worker's delivery timeout never lands next to its
  republished copy (hole 2); a restart inside a decided-but-unmarked transaction (hole 3);
* client clocks cannot shorten or freeze the window (hole 6); a bad header on the output does
  not stop reconcile (hole 7).

ads-broker only: tansu's read_committed does not hide aborted batches (../shared/PEERS.md), and
these tests read the output as downstream consumers must, with read_committed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.embedded import BrokerProcess, ads_broker_process
from dedupe_worker.kafka import create_topics, producer_config
from dedupe_worker.records import H_DLQ_REASON, H_SOURCE_OFFSET
from tests.chaos.broker.faulthook import TXN_BROKER_CONFIG, faulty_broker, write_faults
from tests.integration.worker.helpers import (
    Topics,
    message_ids,
    read_all,
    start_worker,
    stop_worker,
    wait_started,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _topics(bootstrap: str, base: str, partitions: int = 1, durable: bool = True) -> Topics:
    t = Topics(f"{base}-in", f"{base}-out", f"{base}-dlq")
    create_topics(bootstrap, {t.input: partitions}, durable=False)
    create_topics(bootstrap, {t.output: partitions, t.dlq: partitions}, durable=durable)
    return t


def _send(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]], partition: int = 0) -> None:
    p = Producer(producer_config(bootstrap))
    for key, value in records:
        p.produce(topic, value=value, key=key, partition=partition)
    assert p.flush(30) == 0


def _event(mid: str) -> tuple[bytes, bytes]:
    return mid.encode(), json.dumps({"messageId": mid, "type": "track"}).encode()


def _wait_ids(bootstrap: str, topic: str, expected: int, procs: list[subprocess.Popen[bytes]],
              timeout_s: float = 90.0) -> list[object]:
    deadline = time.monotonic() + timeout_s
    while True:
        out = read_all(bootstrap, topic, 1, read_committed=True)
        if len(message_ids(out)) >= expected:
            return out
        if all(p.poll() is not None for p in procs):
            raise AssertionError(f"every worker exited; {topic} holds {len(out)} records")
        assert time.monotonic() < deadline, f"{topic} holds {len(out)} records after {timeout_s}s"
        time.sleep(0.3)


def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> int:
    return int(proc.wait(timeout_s))


def test_dead_letter_before_a_crash_is_not_lost(ads_broker: BrokerProcess, topic_name: str,
                                                tmp_path: Path) -> None:
    """Hole 1: input [invalid JSON, new, new, new]; the worker SIGKILLs itself after the first
    half of the batch's output was acknowledged. On 2bf15d3 reconcile moved the input position
    past the dead letter (from the output's source offset), so the DLQ stayed empty forever."""
    topics = _topics(ads_broker.bootstrap, topic_name)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    _send(ads_broker.bootstrap, topics.input, [(None, b"not json {"), *(_event(m) for m in ids)])
    log = tmp_path / "worker.log"
    proc = start_worker(ads_broker.bootstrap, topics, tmp_path / "data", log,
                        env={"DEDUPE_FAULT": "mid_produce:1:kill"})
    assert _wait_exit(proc) == -signal.SIGKILL, log.read_text()[-3000:]
    proc = start_worker(ads_broker.bootstrap, topics, tmp_path / "data", log)
    try:
        out = _wait_ids(ads_broker.bootstrap, topics.output, 3, [proc])
        deadline = time.monotonic() + 30
        while not (dlq := read_all(ads_broker.bootstrap, topics.dlq, 1, read_committed=True)):
            assert time.monotonic() < deadline, "the invalid record never reached the dead-letter topic"
            time.sleep(0.3)
    finally:
        assert stop_worker(proc) == 0, log.read_text()[-3000:]
    assert sorted(message_ids(out)) == sorted(ids) and len(out) == 3
    assert {dict(m.headers())[H_DLQ_REASON] for m in dlq} == {b"invalid_json"}
    assert {dict(m.headers())[H_SOURCE_OFFSET] for m in dlq} == {b"0"}


def test_second_worker_on_a_live_partition_does_not_double_it(ads_broker: BrokerProcess, topic_name: str,
                                                               tmp_path: Path) -> None:
    """Hole 4: two workers (own volumes, as after a restore onto another instance) serve partition
    0 at once. On 2bf15d3 200 ids became 400 output records. Now the second fences the first: the
    first stops that partition (exit 3) before it can publish again."""
    topics = _topics(ads_broker.bootstrap, topic_name)
    first = start_worker(ads_broker.bootstrap, topics, tmp_path / "a", tmp_path / "a.log")
    second = None
    try:
        wait_started(first, tmp_path / "a.log", 0, 1)
        second = start_worker(ads_broker.bootstrap, topics, tmp_path / "b", tmp_path / "b.log")
        wait_started(second, tmp_path / "b.log", 0, 1)
        ids = [str(uuid.uuid4()) for _ in range(200)]
        for i in range(0, 200, 20):  # in several batches, so both have the chance to publish
            _send(ads_broker.bootstrap, topics.input, [_event(m) for m in ids[i:i + 20]])
            time.sleep(0.1)
        out = _wait_ids(ads_broker.bootstrap, topics.output, 200, [first, second])
        time.sleep(2)  # anything a second writer would add lands now
        out = read_all(ads_broker.bootstrap, topics.output, 1, read_committed=True)
        assert _wait_exit(first) == 3, (tmp_path / "a.log").read_text()[-3000:]
        assert b'"event": "partition fenced"' in (tmp_path / "a.log").read_bytes()
    finally:
        stop_worker(first)
        if second is not None:
            assert stop_worker(second) == 0, (tmp_path / "b.log").read_text()[-3000:]
    counts = message_ids(out)
    assert set(counts) == set(ids)
    assert [m for m, n in counts.items() if n > 1] == []


def _output_segments(data_dir: Path, topic: str) -> list[Path]:
    return sorted((data_dir / f"{topic}-0").glob("*.log"))


def _publish_then_lose_output(tmp_path: Path, topic_name: str,
                              env: dict[str, str]) -> tuple[Path, int, Topics, list[str]]:
    """10 ids published by a worker (stopped cleanly), then the broker SIGKILLed and the output's
    segments cut to 0 bytes: acknowledged output lost under the worker. The output topic is created
    without flush.messages=1 (the unsafe setting the worker refuses by default), so ``env`` must
    turn require_durable_output off. Returns (broker data dir, its port, topics, ids)."""
    data = tmp_path / "broker-data"
    with ads_broker_process(data, log_path=tmp_path / "broker.log") as broker:
        port = broker.port
        topics = _topics(broker.bootstrap, topic_name, durable=False)
        ids = [str(uuid.uuid4()) for _ in range(10)]
        _send(broker.bootstrap, topics.input, [_event(m) for m in ids])
        proc = start_worker(broker.bootstrap, topics, tmp_path / "w", tmp_path / "w.log", env=env)
        try:
            _wait_ids(broker.bootstrap, topics.output, 10, [proc])
        finally:
            assert stop_worker(proc) == 0
        os.kill(broker.pid, signal.SIGKILL)
        broker.proc.wait(30)
    for seg in _output_segments(data, topics.output):
        os.truncate(seg, 0)  # nothing of the output had reached the disk
    return data, port, topics, ids


@pytest.mark.parametrize("interrupted", [False, True])
def test_output_lost_under_the_worker_is_repaired(tmp_path: Path, topic_name: str, interrupted: bool) -> None:
    """Hole 5: acknowledged output lost by the broker (its segment cut back to what was fsynced, 0
    bytes, before a restart) while the worker's store and committed input say it was published.
    On 2bf15d3 the output stayed empty for good and the worker logged committed=10. Now reconcile
    sees a recorded output position past the output's end, rolls the store back to what the output
    holds and re-reads the input. The output topic is created without flush.messages=1 (the unsafe
    setting the worker refuses by default), so the worker runs with require_durable_output off.
    ``interrupted``: the worker is SIGKILLed in the middle of the repair (store wiped, not yet
    rebuilt); the next start must finish it, not resume from the group's offset, which is past
    what the output holds (the repair's marker file says so)."""
    env = {"DEDUPE_REQUIRE_DURABLE_OUTPUT": "false"}
    data, port, topics, ids = _publish_then_lose_output(tmp_path, topic_name, env)
    with ads_broker_process(data, port=port, log_path=tmp_path / "broker.log") as broker:
        assert read_all(broker.bootstrap, topics.output, 1) == []
        if interrupted:
            proc = start_worker(broker.bootstrap, topics, tmp_path / "w", tmp_path / "w.log",
                                env={**env, "DEDUPE_FAULT": "mid_repair:1:kill"})
            assert _wait_exit(proc) == -signal.SIGKILL, (tmp_path / "w.log").read_text()[-3000:]
            assert (tmp_path / "w" / "partition-0" / "REPAIR-PENDING").read_bytes() == b"rebuilding\n"
        proc = start_worker(broker.bootstrap, topics, tmp_path / "w", tmp_path / "w.log", env=env)
        try:
            out = _wait_ids(broker.bootstrap, topics.output, 10, [proc])
        finally:
            assert stop_worker(proc) == 0
    counts = message_ids(out)
    assert set(counts) == set(ids) and max(counts.values()) == 1
    assert b"output partition is shorter than recorded" in (tmp_path / "w.log").read_bytes()
    assert not (tmp_path / "w" / "partition-0" / "REPAIR-PENDING").exists()


@pytest.mark.parametrize("mode", ["reconcile", "transactional"])
def test_output_lost_under_a_deleted_store_is_repaired(tmp_path: Path, topic_name: str, mode: str) -> None:
    """Found by review on 2026-11-27: acknowledged output lost by the broker (as above) AND the
    worker's volume lost before the restart (a new volume: the store is rebuilt from the output's
    last window). The store can no longer say how far the output went; the restart rebuilt an empty
    store and resumed from the group's committed offset, past all 10 inputs, so their output was
    lost for good with no error. Now the input commit's metadata carries the next output offset
    (``dedupe.output=<n>``), and a start finding the output shorter than that repairs: rebuild from
    what the output holds and re-read the input from there (both modes: in ``transactional`` the
    metadata rides in the transaction's offset commit)."""
    env = {"DEDUPE_REQUIRE_DURABLE_OUTPUT": "false", "DEDUPE_EXACTLY_ONCE": mode}
    data, port, topics, ids = _publish_then_lose_output(tmp_path, topic_name, env)
    shutil.rmtree(tmp_path / "w" / "partition-0")  # and the worker's volume is gone too
    with ads_broker_process(data, port=port, log_path=tmp_path / "broker.log") as broker:
        assert read_all(broker.bootstrap, topics.output, 1) == []
        proc = start_worker(broker.bootstrap, topics, tmp_path / "w", tmp_path / "w.log", env=env)
        try:
            out = _wait_ids(broker.bootstrap, topics.output, 10, [proc])
        finally:
            assert stop_worker(proc) == 0
    counts = message_ids(out)
    assert set(counts) == set(ids) and max(counts.values()) == 1
    assert b"output partition is shorter than recorded" in (tmp_path / "w.log").read_bytes()


def test_unsafe_output_settings_are_refused(ads_broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    """Hole 5: an output topic that can lose acknowledged writes (single replica, no flush per
    write) is refused at start with a clear error, unless require_durable_output is off."""
    topics = _topics(ads_broker.bootstrap, topic_name, durable=False)
    proc = start_worker(ads_broker.bootstrap, topics, tmp_path / "w", tmp_path / "w.log")
    try:
        assert _wait_exit(proc) != 0
    finally:
        stop_worker(proc)  # still running only if it was not refused
    text = (tmp_path / "w.log").read_text()
    assert "cannot keep acknowledged output" in text and topics.output in text


def _send_at(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], timestamp_ms: int) -> None:
    p = Producer(producer_config(bootstrap))
    for key, value in records:
        p.produce(topic, value=value, key=key, partition=0, timestamp=timestamp_ms)
    assert p.flush(30) == 0


def _store_keys(data: Path, topic: str) -> int:
    from dedupe_worker.config import load_config
    from dedupe_worker.store.rocksdb import RocksDBStore

    cfg = load_config(None, input_topic=topic, data_dir=data, aging={"max_keys": 400},
                      store={"generation_keys": 100})
    store = RocksDBStore(cfg.partition_dir(0), cfg.store.rocksdb(cfg.aging), topic=topic, partition=0)
    try:
        return store.meta().keys
    finally:
        store.close()


AGING = {"DEDUPE_AGING__MAX_KEYS": "400", "DEDUPE_STORE__GENERATION_KEYS": "100", "DEDUPE_BATCH_SIZE": "100"}


def test_old_client_timestamps_do_not_shorten_the_window(ads_broker: BrokerProcess, topic_name: str,
                                                         tmp_path: Path) -> None:
    """Hole 6: ids whose records carry a 1970 timestamp, under a 400-key bound and a one-hour
    minimum window. On 2bf15d3 their first-seen time was that timestamp, so aging dropped them at
    once and a retry minutes later was published again. Now first seen is the worker's clock: all
    1000 stay (over the bound, with a warning) and every retry is a duplicate. Their output
    records carry the worker's clock, the client's timestamp in dedupe.source.timestamp."""
    topics = _topics(ads_broker.bootstrap, topic_name)
    ids = [str(uuid.uuid4()) for _ in range(1000)]
    _send_at(ads_broker.bootstrap, topics.input, [_event(m) for m in ids], 1)
    log = tmp_path / "w.log"
    proc = start_worker(ads_broker.bootstrap, topics, tmp_path / "w", log,
                        env={**AGING, "DEDUPE_AGING__MIN_WINDOW_S": "3600"})
    try:
        _wait_ids(ads_broker.bootstrap, topics.output, 1000, [proc])
        _send_at(ads_broker.bootstrap, topics.input, [_event(m) for m in ids[:300]], 1)  # client retries
        _send(ads_broker.bootstrap, topics.input, [_event(str(uuid.uuid4()))])  # a marker: new, after them
        out = _wait_ids(ads_broker.bootstrap, topics.output, 1001, [proc])
        time.sleep(1)
        out = read_all(ads_broker.bootstrap, topics.output, 1, read_committed=True)
    finally:
        assert stop_worker(proc) == 0, log.read_text()[-3000:]
    counts = message_ids(out)
    assert len(counts) == 1001 and max(counts.values()) == 1
    skewed = [m for m in out if m.key().decode() in set(ids)]
    assert {dict(m.headers()).get("dedupe.source.timestamp") for m in skewed} == {b"1"}
    assert min(m.timestamp()[1] for m in skewed) > int(time.time() * 1000) - 600_000


def test_a_future_client_timestamp_does_not_stop_aging(ads_broker: BrokerProcess, topic_name: str,
                                                       tmp_path: Path) -> None:
    """Hole 6: one record stamped ten years ahead, then 3000 ordinary ids, under a 400-key bound.
    On 2bf15d3 that record pinned its generation (first seen in the future is never old enough)
    and aging stopped for good: 3000 keys held. Now aging keeps the store near its bound. The
    input topic takes records any distance ahead (``message.timestamp.after.max.ms`` at its
    maximum, as on Kafka before 4.0), or the broker itself would refuse the record (KIP-937)."""
    topics = Topics(f"{topic_name}-in", f"{topic_name}-out", f"{topic_name}-dlq")
    admin = AdminClient({"bootstrap.servers": ads_broker.bootstrap})
    anything_ahead = {"message.timestamp.after.max.ms": str(2**63 - 1)}
    for fut in admin.create_topics([NewTopic(topics.input, 1, 1, config=anything_ahead)]).values():
        fut.result(30)
    create_topics(ads_broker.bootstrap, {topics.output: 1, topics.dlq: 1}, durable=True)
    _send_at(ads_broker.bootstrap, topics.input, [_event(str(uuid.uuid4()))],
             int(time.time() * 1000) + 10 * 365 * 86_400_000)
    ids = [str(uuid.uuid4()) for _ in range(3000)]
    log = tmp_path / "w.log"
    proc = start_worker(ads_broker.bootstrap, topics, tmp_path / "w", log, env=AGING)
    try:
        for i in range(0, 3000, 300):
            _send(ads_broker.bootstrap, topics.input, [_event(m) for m in ids[i:i + 300]])
        _wait_ids(ads_broker.bootstrap, topics.output, 3001, [proc])
        time.sleep(1.5)  # aging runs after each batch
    finally:
        assert stop_worker(proc) == 0, log.read_text()[-3000:]
    assert _store_keys(tmp_path / "w", topics.input) <= 500


def test_bad_source_offset_header_on_the_output_is_skipped(ads_broker: BrokerProcess, topic_name: str,
                                                           tmp_path: Path) -> None:
    """Hole 7: an output record whose dedupe.source.offset header is not a number (another stage,
    an operator's hand) made reconcile raise and restart forever on 2bf15d3. Now it is logged,
    counted, its id still inserted, and the worker runs."""
    topics = _topics(ads_broker.bootstrap, topic_name)
    foreign = str(uuid.uuid4())
    p = Producer(producer_config(ads_broker.bootstrap))
    key, value = _event(foreign)
    p.produce(topics.output, value=value, key=key, partition=0, headers=[(H_SOURCE_OFFSET, b"not-a-number")])
    assert p.flush(30) == 0
    ids = [str(uuid.uuid4()) for _ in range(5)]
    _send(ads_broker.bootstrap, topics.input, [_event(m) for m in [*ids, foreign]])
    log = tmp_path / "w.log"
    proc = start_worker(ads_broker.bootstrap, topics, tmp_path / "w", log)
    try:
        out = _wait_ids(ads_broker.bootstrap, topics.output, 6, [proc], timeout_s=40)
    finally:
        assert stop_worker(proc) == 0, log.read_text()[-3000:]
    assert message_ids(out) == dict.fromkeys([foreign, *ids], 1)  # the foreign id is a duplicate
    assert b"bad source offset header" in log.read_bytes()


def _wait_log(path: Path, text: bytes, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_bytes():
        assert proc.poll() is None, f"worker exited with {proc.returncode}: {path.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"worker never logged {text!r}"
        time.sleep(0.1)


def test_a_produce_held_past_the_delivery_timeout_never_lands_twice(tmp_path: Path, topic_name: str) -> None:
    """Hole 2: the broker holds the batch's produce request 12 s (a stalled disk, a slow in-sync
    follower) while the worker gives up after its 3 s delivery timeout. On 2bf15d3 the worker
    dropped its producer, reconciled at once and republished under a new producer id; the held
    request then landed too: every id twice. Now the restart's init_transactions fences the old
    producer first: the held request is either aborted with its transaction or refused."""
    fault_file = tmp_path / "faults.json"
    with faulty_broker(tmp_path, fault_file, TXN_BROKER_CONFIG) as broker:
        topics = _topics(broker.bootstrap, topic_name)
        write_faults(fault_file, {"append_delay_ms": {topics.output: 12_000}})
        time.sleep(0.3)  # the broker re-reads the file within 100 ms
        ids = [str(uuid.uuid4()) for _ in range(50)]
        _send(broker.bootstrap, topics.input, [_event(m) for m in ids])
        log = tmp_path / "w.log"
        proc = start_worker(broker.bootstrap, topics, tmp_path / "w", log, env={"DEDUPE_DELIVERY_TIMEOUT_S": "3"})
        try:
            _wait_log(log, b"partition error; restarting from reconcile", proc)
            write_faults(fault_file, {})
            _wait_ids(broker.bootstrap, topics.output, 50, [proc])
            time.sleep(14)  # past the held request's release
            out = read_all(broker.bootstrap, topics.output, 1, read_committed=True)
        finally:
            assert stop_worker(proc) == 0, log.read_text()[-3000:]
    counts = message_ids(out)
    assert set(counts) == set(ids) and max(counts.values()) == 1, \
        f"{sum(n > 1 for n in counts.values())} ids published more than once"


def test_restart_inside_a_decided_but_unmarked_transaction(tmp_path: Path, topic_name: str) -> None:
    """Hole 3 (mode transactional): the worker is SIGKILLed right after commit_transaction returned,
    while the coordinator holds the commit markers (5 s). On 2bf15d3 the restart reconciled first
    (read_committed stops below the undecided batch), then init_transactions completed the commit,
    then committed() included the batch's input offsets: its ids never reached RocksDB and client
    retries of them were published again. Now the worker fences first, then reconciles."""
    fault_file = tmp_path / "faults.json"
    with faulty_broker(tmp_path, fault_file, TXN_BROKER_CONFIG) as broker:
        topics = _topics(broker.bootstrap, topic_name)
        ids = [str(uuid.uuid4()) for _ in range(40)]
        _send(broker.bootstrap, topics.input, [_event(m) for m in ids])
        write_faults(fault_file, {"marker_delay_ms": 5000})
        time.sleep(0.3)
        log = tmp_path / "w.log"
        env = {"DEDUPE_EXACTLY_ONCE": "transactional", "DEDUPE_FAULT": "after_produce:1:kill"}
        proc = start_worker(broker.bootstrap, topics, tmp_path / "w", log, env=env)
        assert _wait_exit(proc) == -signal.SIGKILL, log.read_text()[-3000:]
        write_faults(fault_file, {})  # the held markers stay scheduled; later transactions are not held
        proc = start_worker(broker.bootstrap, topics, tmp_path / "w", log, env={"DEDUPE_EXACTLY_ONCE": "transactional"})
        try:
            _wait_ids(broker.bootstrap, topics.output, 40, [proc])
            fresh = str(uuid.uuid4())
            _send(broker.bootstrap, topics.input, [*(_event(m) for m in ids), _event(fresh)])  # client retries
            out = _wait_ids(broker.bootstrap, topics.output, 41, [proc])
            time.sleep(1.5)
            out = read_all(broker.bootstrap, topics.output, 1, read_committed=True)
        finally:
            assert stop_worker(proc) == 0, log.read_text()[-3000:]
    counts = message_ids(out)
    assert set(counts) == {*ids, fresh} and max(counts.values()) == 1, \
        f"{sum(n > 1 for n in counts.values())} ids published more than once"


def _committed(bootstrap: str, topic: str, group: str = "dedupe") -> int:
    from confluent_kafka import Consumer, TopicPartition

    from dedupe_worker.kafka import consumer_config

    c = Consumer(consumer_config(bootstrap, group, None))
    try:
        return int(c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset)
    finally:
        c.close()


def test_a_hanging_transaction_on_the_output_is_not_taken_for_lost_output(ads_broker: BrokerProcess,
                                                                         topic_name: str, tmp_path: Path) -> None:
    """Found by dedupe-chaos on a9caa33: a transaction left open on the output (here another
    producer's, never ended; there a power cut that lost the coordinator's state) holds the last
    stable offset below what the worker published after it. The lost-output check read the
    read_committed end (the LSO) as the log end, "repaired" and republished the partition's input
    behind the open transaction: duplicates the moment it ends. Now the check compares with the
    high watermark: the worker waits and says the transaction is hanging, republishes nothing,
    and carries on once it ends."""
    topics = _topics(ads_broker.bootstrap, topic_name)
    ids = [str(uuid.uuid4()) for _ in range(40)]
    log = tmp_path / "w.log"
    proc = start_worker(ads_broker.bootstrap, topics, tmp_path / "w", log)
    intruder = Producer(producer_config(ads_broker.bootstrap, None, **{
        "transactional.id": f"intruder-{topic_name}", "transaction.timeout.ms": 600_000}))
    try:
        _send(ads_broker.bootstrap, topics.input, [_event(m) for m in ids[:20]])
        _wait_ids(ads_broker.bootstrap, topics.output, 20, [proc])
        intruder.init_transactions(30)
        intruder.begin_transaction()
        intruder.produce(topics.output, value=b"{}", key=b"not-an-event", partition=0)
        assert intruder.flush(30) == 0  # open, and it stays open: the LSO stops here
        _send(ads_broker.bootstrap, topics.input, [_event(m) for m in ids[20:]])
        deadline = time.monotonic() + 60
        while _committed(ads_broker.bootstrap, topics.input) < 40:  # published behind the open transaction
            assert time.monotonic() < deadline, "the worker did not consume the second half"
            time.sleep(0.2)
        assert stop_worker(proc) == 0
        proc = start_worker(ads_broker.bootstrap, topics, tmp_path / "w", log)
        _wait_log(log, b"a transaction on the output is hanging", proc, timeout_s=60)
        intruder.abort_transaction(30)
        deadline = time.monotonic() + 60
        while log.read_bytes().count(b'"event": "partition started"') < 2:  # this run's start, after the abort
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        time.sleep(2)
        out = read_all(ads_broker.bootstrap, topics.output, 1, read_committed=True)
    finally:
        assert stop_worker(proc) == 0, log.read_text()[-3000:]
    counts = message_ids(out)
    assert set(counts) == set(ids) and max(counts.values()) == 1, \
        f"{sum(n > 1 for n in counts.values())} ids published twice"
    assert b"output partition is shorter than recorded" not in log.read_bytes()


def test_a_partition_blocked_for_good_makes_the_worker_exit(ads_broker: BrokerProcess, topic_name: str,
                                                           tmp_path: Path) -> None:
    """Hole 7's kin, found by dedupe-chaos (transactional run): a partition thread blocked in a call
    that never returns logged nothing and served nothing while the process ran on. The fault hook's
    hang blocks the thread the same way; the watchdog dumps every thread's stack and exits with
    code 1 (a supervisor restarts the worker: as safe as a SIGKILL)."""
    topics = _topics(ads_broker.bootstrap, topic_name)
    _send(ads_broker.bootstrap, topics.input, [_event(str(uuid.uuid4())) for _ in range(5)])
    log = tmp_path / "w.log"
    proc = start_worker(ads_broker.bootstrap, topics, tmp_path / "w", log,
                        env={"DEDUPE_FAULT": "before_produce:1:hang", "DEDUPE_STALL_TIMEOUT_S": "3"})
    try:
        assert _wait_exit(proc, timeout_s=60) == 1, log.read_text()[-3000:]
    finally:
        stop_worker(proc)
    text = log.read_text()
    assert '"event": "partition stalled; dumping stacks and exiting for a restart"' in text
    assert "dedupe_worker/faults.py" in text  # the blocked thread's stack, where it waits


def test_a_transactional_call_past_its_timeout_ends_the_worker_before_the_stall_timeout(
        ads_broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    """Found by dedupe-chaos (transactional run, after broker restarts): librdkafka's
    ``send_offsets_to_transaction`` ignores its timeout while the group coordinator is down
    (librdkafka#5456), so the partition sat until the 300 s stall watchdog. That librdkafka bug
    cannot be triggered on demand, so the fault hook's hang stands in for the call that never
    returns, inside the same bounded call. With ``stall_timeout_s`` far away, the worker must end
    within delivery_timeout_s + CALL_GRACE_S (here ~17 s), naming the call."""
    topics = _topics(ads_broker.bootstrap, topic_name)
    _send(ads_broker.bootstrap, topics.input, [_event(str(uuid.uuid4())) for _ in range(5)])
    log = tmp_path / "w.log"
    proc = start_worker(ads_broker.bootstrap, topics, tmp_path / "w", log,
                        env={"DEDUPE_FAULT": "in_commit:1:hang", "DEDUPE_STALL_TIMEOUT_S": "3600",
                             "DEDUPE_DELIVERY_TIMEOUT_S": "2", "DEDUPE_EXACTLY_ONCE": "transactional"})
    try:
        assert _wait_exit(proc, timeout_s=90) == 1, log.read_text()[-3000:]
    finally:
        stop_worker(proc)
    text = log.read_text()
    assert '"event": "partition stalled; dumping stacks and exiting for a restart"' in text
    assert "commit_transaction outlived its timeout" in text
    assert "dedupe_worker/faults.py" in text
