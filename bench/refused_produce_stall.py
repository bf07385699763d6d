"""How long another client waits while the broker answers an all-refused Produce (issue 12, F3).

    .venv/bin/python bench/refused_produce_stall.py [--partitions 200] [--records 3000] [--rounds 3]

One ads-broker process (a temp data dir, 127.0.0.1). A topic of ``--partitions`` partitions with
``message.timestamp.after.max.ms`` = 1 h; one Produce (v9, acks=1) naming every partition, each a
batch of ``--records`` records all stamped 2 h ahead, so every record is refused and Kafka's answer
(KIP-467) carries one record error per record: 600,000 with the defaults (~86 MB of response).
While it is answered, a second connection sends ApiVersions back to back; printed per round: the
probe's round trips, its median and maximum round trip, and the hostile request's answer time and
size. A measurement on a shared machine, not a pass/fail check.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from ads_broker.embedded import ads_broker_process
from ads_broker.log.records import Record, build_batch

HOUR_MS = 3_600_000


class Conn:
    """One plain connection speaking kafka-python's codec (framing by hand)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.cid = 0

    def request(self, request: Any, version: int) -> bytes:
        self.cid += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self.cid, client_id="stall-bench")
        self.sock.sendall(bytes(request.encode(version=version, header=True, framed=True)))
        size = struct.unpack(">i", self._exact(4))[0]
        return self._exact(size)

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return bytes(buf)


def hostile_request(topic: str, partitions: int, records: int) -> ProduceRequest:
    ahead = int(time.time() * 1000) + 2 * HOUR_MS
    batch = build_batch([Record(offset=i, timestamp=ahead, key=b"k", value=b"", headers=[])  # type: ignore[arg-type]
                         for i in range(records)])
    return ProduceRequest(transactional_id=None, acks=1, timeout_ms=60000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=batch) for p in range(partitions)])])


def one_round(port: int, request: ProduceRequest, records: int) -> dict[str, float]:
    answer: list[bytes] = []
    done = threading.Event()
    hostile, probe = Conn(port), Conn(port)
    probe.request(ApiVersionsRequest(), 0)

    def send() -> None:
        started = time.monotonic()
        answer.append(hostile.request(request, 9))
        answer_s.append(time.monotonic() - started)
        done.set()

    answer_s: list[float] = []
    sender = threading.Thread(target=send)
    trips: list[float] = []
    sender.start()
    while not done.is_set():
        started = time.monotonic()
        probe.request(ApiVersionsRequest(), 0)
        trips.append(time.monotonic() - started)
    sender.join()
    decoded = ProduceResponse[9].decode(answer[0][5:])  # correlation id, then v9's (flexible) tag buffer
    errors = [len(p.record_errors) for t in decoded.responses for p in t.partition_responses]
    assert all(n == records for n in errors), "every record must be named"
    return {"probe_trips": len(trips), "probe_median_ms": statistics.median(trips) * 1000,
            "probe_max_s": max(trips), "answer_s": answer_s[0], "answer_mb": len(answer[0]) / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work-dir", type=Path, help="keep the broker's data and log here (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stall-bench-") as tmp:
        root = args.work_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        broker = ads_broker_process(root / "data", log_path=root / "broker.log")
        broker.start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.create_topics([NewTopic("refused", args.partitions, 1, config={
                "message.timestamp.after.max.ms": str(HOUR_MS)})])["refused"].result(60)
            request = hostile_request("refused", args.partitions, args.records)
            for i in range(args.rounds):
                row = one_round(broker.port, request, args.records)
                print(f"round {i + 1}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                                      for k, v in row.items()), flush=True)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
