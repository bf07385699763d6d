"""Issue 12, "every component can use it": the load generator and the worker run against a broker
that only lets authenticated clients in (SASL/SCRAM), given ``security.protocol`` and ``sasl.*``
settings: the load generator as ``--kafka KEY=VALUE``, the worker in its config's ``[kafka]``
table. Before, the worker's admin clients (topic layout, durability and side-topic checks) ignored
``[kafka]`` and could not connect at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from ads_broker.embedded import ads_broker_process, free_port
from dedupe_worker.kafka import create_topics
from tests.integration.worker.helpers import Topics, message_ids, stop_worker

pytestmark = [pytest.mark.timeout(240)]

PASSWORD = "pw-" + uuid.uuid4().hex[:10]


def _sasl(bootstrap: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": "worker", "sasl.password": PASSWORD}


def _read(bootstrap: str, topic: str, partitions: int, settings: dict[str, str]) -> list[Any]:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                            "enable.auto.commit": False, "isolation.level": "read_committed",
                            "enable.partition.eof": True, **settings}
    c = Consumer(conf)
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[Any] = []
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while len(eof) < partitions and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                if m.error() is None:
                    out.append(m)
                elif m.error().code() == -191:  # _PARTITION_EOF
                    eof.add(m.partition())
        return out
    finally:
        c.close()


def test_loadgen_and_worker_through_a_sasl_scram_listener(tmp_path: Path) -> None:
    data = tmp_path / "broker"
    added = subprocess.run([sys.executable, "-m", "ads_broker", "users", "add", "worker", "--data-dir", str(data)],
                           env={**os.environ, "ADS_BROKER_USER_PASSWORD": PASSWORD}, capture_output=True,
                           text=True, timeout=60, check=False)
    assert added.returncode == 0, added.stderr
    plain, sasl = free_port(), free_port()
    broker = ads_broker_process(data, port=plain, log_path=tmp_path / "broker.log", config={
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"}).start()
    bootstrap = f"127.0.0.1:{sasl}"
    settings = _sasl(bootstrap)
    topics = Topics(input="sec-in", output="sec-out", dlq="sec-dlq")
    worker: subprocess.Popen[bytes] | None = None
    try:
        create_topics(bootstrap, {topics.input: 2}, extra=settings)
        create_topics(bootstrap, {topics.output: 2, topics.dlq: 2}, durable=True, extra=settings)
        manifest = tmp_path / "load.json"
        load = subprocess.run(
            [sys.executable, "-m", "dedupe_worker", "loadgen", "--bootstrap", bootstrap, "--topic", topics.input,
             "--unique", "300", "--duplicate-rate", "0.1", "--malformed-rate", "0", "--manifest", str(manifest),
             *[a for k, v in settings.items() for a in ("-X", f"{k}={v}")]],
            capture_output=True, text=True, timeout=120, check=False)
        assert load.returncode == 0, load.stdout + load.stderr
        unique = set((tmp_path / "load.ids").read_text().split())
        assert len(unique) == 300

        config = tmp_path / "worker.toml"
        config.write_text("[kafka]\n" + "".join(f'"{k}" = "{v}"\n' for k, v in settings.items()))
        log = tmp_path / "worker.log"
        with open(log, "ab") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "dedupe_worker", "run", "--config", str(config), "--bootstrap", bootstrap,
                 *topics.args(), "--data-dir", str(tmp_path / "w")], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            ids = message_ids(_read(bootstrap, topics.output, 2, settings))
            if len(ids) >= len(unique):
                break
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"output has {len(ids)} of {len(unique)} ids; see {log}"
            time.sleep(1)
        assert set(ids) == unique and max(ids.values()) == 1
        assert json.loads(manifest.read_text())["duplicates"] > 0
    finally:
        if worker is not None:
            stop_worker(worker)
        broker.stop()
