"""Issue 15: a day on ads-broker holding what a hostile reviewer injects, audited by the CLI.

Keyless records whose JSON carries the messageId and an empty key (the worker dedupes both: the
audit must count their duplicates, losses and leaks), a record stamped ten years ahead early in the
day (once cut the planned range short), a record and a dead letter stamped in microseconds (once
crashed every nightly run), a malformed record whose dead letter was lost. Exact counts and exit
codes; the expected numbers come from the day's description below, not from running the audit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from typer.testing import CliRunner

from ads_broker.embedded import BrokerProcess
from spark_audit.cli import EXIT_THRESHOLD, app
from tests.unit.audit import scenario as sc

PARTITIONS = 2
START_MS = int(sc.START.timestamp() * 1000)
HOUR_MS = 3_600_000
TEN_YEARS_MS = 10 * 365 * 24 * HOUR_MS


@dataclass
class Rec:
    key: bytes | None
    value: bytes | None
    ts_ms: int
    partition: int
    headers: dict[str, bytes] = field(default_factory=dict)


#: Accept any timestamp, as Kafka before 4.0 did by default: the records this test injects are the
#: ones a topic with that setting (or an older broker) holds.
ANY_TIMESTAMP = {"message.timestamp.after.max.ms": str(2**63 - 1)}


def create_topics(bootstrap: str, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for t in topics:
        try:
            admin.create_topics([NewTopic(t, PARTITIONS, 1, config=ANY_TIMESTAMP)])[t].result(30)
        except KafkaException as exc:
            # A broker without the setting checks no timestamp: it takes the records as they are.
            assert exc.args[0].code() == KafkaError.INVALID_CONFIG, exc
            admin.create_topics([NewTopic(t, PARTITIONS, 1)])[t].result(30)


def produce(bootstrap: str, topic: str, records: list[Rec]) -> list[tuple[int, int]]:
    """Produce in list order to each record's partition; (partition, offset) of each record."""
    placed: dict[int, tuple[int, int]] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for i, rec in enumerate(records):
        def on_delivery(err: Any, msg: Any, i: int = i) -> None:
            assert err is None, err
            placed[i] = (msg.partition(), msg.offset())

        producer.produce(topic, key=rec.key, value=rec.value, partition=rec.partition,
                         timestamp=rec.ts_ms, headers=list(rec.headers.items()), on_delivery=on_delivery)
        producer.flush(30)  # one at a time: offsets follow the list order in each partition
    return [placed[i] for i in range(len(records))]


def ev(mid: str | None, i: int) -> bytes:
    body = json.loads(sc.event(mid or "", i))
    if mid is None:
        del body["messageId"]
    return json.dumps(body).encode()


def at(minutes: float) -> int:
    return START_MS + HOUR_MS + int(minutes * 60_000)


def day() -> tuple[list[Rec], list[Rec], dict[str, int]]:
    """Input and output of the day, and the input index of each named record."""
    inp: list[Rec] = []
    named: dict[str, int] = {}

    def add(name: str, key: bytes | None, value: bytes | None, ts_ms: int) -> None:
        named[name] = len(inp)
        inp.append(Rec(key, value, ts_ms, len(inp) % PARTITIONS))

    for i in range(20):
        add(f"k-{i}", f"k-{i}".encode(), ev(f"k-{i}", i), at(i))
        if i == 3:  # early in the day, between k-2 and k-4 (same partition): ten years ahead
            add("future", b"future", ev("future", 50), at(i) + TEN_YEARS_MS)
        if i == 6:  # stamped in microseconds, between k-5 and k-7 (year ~57,000)
            add("micro", b"micro", ev("micro", 51), at(i) * 1000)
    add("j-1", None, ev("j-1", 1), at(60))  # keyless, JSON messageId: an id to the worker
    add("j-1 retry", None, ev("j-1", 1), at(65))
    add("e-1", b"", ev("e-1", 2), at(70))  # an empty key is no key: the JSON id counts
    add("e-1 keyed retry", b"e-1", ev("e-1", 2), at(75))  # the same id as a key: a duplicate
    add("j-lost", None, ev("j-lost", 3), at(80))  # never published: missing
    add("j-leak", None, ev("j-leak", 4), at(90))
    add("j-leak retry", None, ev("j-leak", 4), at(95))  # published twice: a leaked duplicate
    add("bad-1", None, ev(None, 5), at(120))  # keyless without messageId: dead-lettered
    add("bad-2", None, ev(None, 6), at(125))  # ... but its dead letter is lost
    add("bad-utf8", b"\xff\xfe", ev("x", 7), at(130))  # not UTF-8: dead-lettered
    for h in (1, 2):  # the next day: read (the plan runs to the log end), not audited
        add(f"next-{h}", f"next-{h}".encode(), ev(f"next-{h}", h), START_MS + 24 * HOUR_MS + h * HOUR_MS)
    published = [*(f"k-{i}" for i in range(20)), "j-1", "e-1", "j-leak", "j-leak retry", "next-1", "next-2"]
    out = [Rec(inp[named[n]].key, inp[named[n]].value, inp[named[n]].ts_ms, named[n] % PARTITIONS)
           for n in published]
    return inp, out, named


def dead_letters(inp: list[Rec], placed: list[tuple[int, int]], named: dict[str, int]) -> list[Rec]:
    def dead(name: str, reason: bytes) -> Rec:
        rec = inp[named[name]]
        partition, offset = placed[named[name]]
        return Rec(rec.key, rec.value, rec.ts_ms, 0, {
            "dedupe.dlq.reason": reason, "dedupe.source.partition": str(partition).encode(),
            "dedupe.source.offset": str(offset).encode()})

    micro = Rec(b"dl-micro", b"{", at(3) * 1000, 1, {"dedupe.dlq.reason": b"invalid_json"})
    return [dead("bad-1", b"missing_message_id"), dead("bad-utf8", b"invalid_utf8_key"), micro]


def test_hostile_day_exact_counts_and_exit_code(spark: Any, ads_broker: BrokerProcess, topic_name: str,
                                                tmp_path: Path) -> None:
    topics = {"input": topic_name, "output": f"{topic_name}.deduped", "dlq": f"{topic_name}.dlq"}
    create_topics(ads_broker.bootstrap, *topics.values())
    inp, out, named = day()
    placed = produce(ads_broker.bootstrap, topics["input"], inp)
    produce(ads_broker.bootstrap, topics["output"], out)
    produce(ads_broker.bootstrap, topics["dlq"], dead_letters(inp, placed, named))
    result = CliRunner().invoke(app, [
        "run", "--bootstrap", ads_broker.bootstrap, "--input", topics["input"], "--output", topics["output"],
        "--dlq", topics["dlq"], "--date", sc.DAY, "--lookback-hours", "24", "--master", "local[2]",
        "--out", str(tmp_path / "r")])
    assert result.exit_code == EXIT_THRESHOLD, result.output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    # In the window: k-0..19, j-1 x2, e-1 x2, j-lost, j-leak x2, bad-1, bad-2, bad-utf8 (future and
    # micro are not stamped in it; next-* are the next day).
    want = {
        "input_messages": 30, "input_unique": 24, "input_duplicates": 3, "input_first_seen_before_window": 0,
        "output_messages": 24, "output_duplicates": 1, "missing": 1,
        "dead_lettered": 2, "dead_letter_reasons": {"invalid_utf8_key": 1, "missing_message_id": 1},
        "dead_letters_missing": 1, "timestamp_outliers": 1,
        "bad_input": {"unparseable_values": 0, "missing_timestamps": 0, "missing_message_ids": 3,
                      "bad_timestamps": 1},
    }
    assert {k: report[k] for k in want} == want
    assert report["alerts"] == ["output_duplicates 1 > threshold 0", "missing 1 > threshold 0",
                                "dead_letters_missing 1 > threshold 0"]
    details = tmp_path / "r" / "details"
    unlinked = spark.read.parquet(str(details / "dead_letters_missing")).collect()
    assert [(r["partition"], r["offset"]) for r in unlinked] == [placed[named["bad-2"]]]
    found = spark.read.parquet(str(details / "timestamps")).collect()
    stamps = {r["kind"]: (r["partition"], r["offset"]) for r in found}
    assert stamps == {"outlier": placed[named["future"]], "bad": placed[named["micro"]]}
    lost = spark.read.parquet(str(details / "missing")).collect()
    assert [r["message_id"] for r in lost] == ["j-lost"]


def test_missing_output_topic_is_an_alert(spark: Any, ads_broker: BrokerProcess, topic_name: str,
                                          tmp_path: Path) -> None:
    create_topics(ads_broker.bootstrap, topic_name)
    produce(ads_broker.bootstrap, topic_name, [Rec(b"a", ev("a", 0), at(0), 0)])
    result = CliRunner().invoke(app, [
        "run", "--bootstrap", ads_broker.bootstrap, "--input", topic_name, "--output", f"{topic_name}.nope",
        "--dlq", "", "--date", sc.DAY, "--max-missing", "5", "--master", "local[2]", "--out", str(tmp_path / "r")])
    assert result.exit_code == EXIT_THRESHOLD, result.output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert (report["input_messages"], report["missing"], report["status"]) == (1, 1, "alert")
    assert report["alerts"] == [f"output kafka://{ads_broker.bootstrap}/{topic_name}.nope does not exist, "
                                "and the input has 1 messages"]


def test_export_of_the_day_is_idempotent_and_audits_the_same(spark: Any, ads_broker: BrokerProcess,
                                                            topic_name: str, tmp_path: Path) -> None:
    """`spark-audit export` writes the day in the layout `run --input-path` reads; a rerun replaces
    the day's files (one copy of each record); the audit of the exports finds what the broker audit
    finds, but for the records no export can place in a day (micro) or that are not stamped in it."""
    topics = {"input": topic_name, "output": f"{topic_name}.deduped", "dlq": f"{topic_name}.dlq"}
    create_topics(ads_broker.bootstrap, *topics.values())
    inp, out, named = day()
    placed = produce(ads_broker.bootstrap, topics["input"], inp)
    produce(ads_broker.bootstrap, topics["output"], out)
    produce(ads_broker.bootstrap, topics["dlq"], dead_letters(inp, placed, named))
    runner = CliRunner()
    for role, topic in [*topics.items(), ("input", topics["input"])]:  # the input twice: idempotent
        result = runner.invoke(app, ["export", "--bootstrap", ads_broker.bootstrap, "--topic", topic,
                                     "--date", sc.DAY, "--master", "local[2]", "--out", str(tmp_path / role)])
        assert result.exit_code == 0, result.output
    assert "exported 30 records" in result.output  # k-*, j-*, e-*, bad-*: stamped on the day
    assert sorted(p.name for p in (tmp_path / "input" / f"date={sc.DAY}").iterdir()) == ["partition=0", "partition=1"]
    assert spark.read.parquet(str(tmp_path / "input")).count() == 30
    result = runner.invoke(app, [
        "run", "--input-path", str(tmp_path / "input"), "--output-path", str(tmp_path / "output"),
        "--dlq-path", str(tmp_path / "dlq"), "--date", sc.DAY, "--lookback-hours", "24",
        "--master", "local[2]", "--out", str(tmp_path / "r")])
    assert result.exit_code == EXIT_THRESHOLD, result.output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    want = {
        "input_messages": 30, "input_unique": 24, "input_duplicates": 3, "output_messages": 24,
        "output_duplicates": 1, "missing": 1, "dead_lettered": 2, "dead_letters_missing": 1,
        "timestamp_outliers": 0,
        "bad_input": {"unparseable_values": 0, "missing_timestamps": 0, "missing_message_ids": 3,
                      "bad_timestamps": 0},
    }
    assert {k: report[k] for k in want} == want
