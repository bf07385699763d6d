"""What librdkafka does with a KIP-951 leader hint, from its own debug log (issue 13).

    .venv/bin/python bench/leader_hint_probe.py [--work-dir DIR]

Three brokers and ZooKeeper as in ``bench/cluster_replication.py``; one RF 3 partition
(``min.insync.replicas=2``) under an idempotent acks=all producer sending a record every 5 ms;
one controlled shutdown (SIGTERM) of its leader. Prints the client's timeline from its debug log
(``debug=broker,topic,msg,protocol,metadata``): the SIGTERM, the first NOT_LEADER_OR_FOLLOWER,
the leader update librdkafka applies from that answer (``updated with leader N``), its first
Produce to the new leader and how many Metadata answers it had received before it (0: it went
on the hint alone), and the first ack there. A check, not a timing: one run on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.cluster_replication import IDS, Cluster, wait

TOPIC = "hinted"
#: librdkafka debug lines: ``%7|<epoch seconds>|<FAC>|<name>| [thrd:<broker>]: <text>``.
LINE = re.compile(r"^%\d\|(?P<ts>[\d.]+)\|(?P<fac>\w+)\|[^|]*\| \[thrd:(?P<thrd>[^\]]*)\]: (?P<text>.*)$")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", type=Path, help="keep the brokers' data and logs here (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="leader-hint-") as tmp:
        root = args.work_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        cluster = Cluster(root, 6000)
        try:
            sigterm, leader = run(cluster, root / "librdkafka-debug.log")
        finally:
            cluster.close()
        lines = (root / "librdkafka-debug.log").read_text(errors="replace").splitlines()
    report(lines, sigterm, cluster.procs[leader].port)


def run(cluster: Cluster, debug_log: Path) -> tuple[float, int]:
    """The SIGTERM under a streaming producer whose debug log (librdkafka writes it to fd 2, with
    its own timestamps) goes to ``debug_log``; returns the SIGTERM's wall-clock time and the leader."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(60)
    wait(lambda: sorted(cluster.state(TOPIC, 0)[1]) == list(IDS), f"a full ISR on {TOPIC}-0")
    leader = cluster.state(TOPIC, 0)[0]
    with debug_log.open("w") as sink, _stderr_to(sink.fileno()):
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 0, "retry.backoff.ms": 20, "retry.backoff.max.ms": 100,
                             "debug": "broker,topic,msg,protocol,metadata"})
        acked: list[float] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                acked.append(time.monotonic())

        def stream(until: float, enough: bool = False) -> None:
            while time.monotonic() < until and not (enough and acked):
                producer.produce(TOPIC, b"x", partition=0, on_delivery=on_delivery)
                producer.poll(0.005)

        stream(time.monotonic() + 60, enough=True)  # the first ack (connections, producer id)
        stream(time.monotonic() + 1.0)
        sigterm = time.time()
        cluster.procs[leader].signal(signal.SIGTERM)
        stream(time.monotonic() + 4.0)
        unflushed = producer.flush(60)
    if unflushed or not acked:
        raise SystemExit(f"records not acknowledged: {unflushed} pending")
    return sigterm, leader


@contextlib.contextmanager
def _stderr_to(fd: int) -> Iterator[None]:
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def report(lines: list[str], sigterm: float, old_port: int) -> None:
    events = [m for line in lines if (m := LINE.match(line.replace("\n", " ")))]
    after = [m for m in events if float(m["ts"]) >= sigterm - 0.01]
    first_error = next((m for m in after if "Not leader for partition" in m["text"] and m["fac"] == "REQERR"), None)
    if first_error is None:
        raise SystemExit("no NOT_LEADER_OR_FOLLOWER answer after the SIGTERM")
    t0 = float(first_error["ts"])
    rest = [m for m in after if float(m["ts"]) >= t0]
    update = next((m for m in rest if "updated with leader" in m["text"]), None)
    to_new = next((m for m in rest if m["text"].find("Sent ProduceRequest") >= 0 and f":{old_port}/" not in m["thrd"]),
                  None)
    metadata_before = [m for m in rest if "Received MetadataResponse" in m["text"]
                       and (to_new is None or float(m["ts"]) <= float(to_new["ts"]))]
    ack = next((m for m in rest if "delivered" in m["text"] and f":{old_port}/" not in m["thrd"]), None)

    def at(m: re.Match[str] | None) -> str:
        return "-" if m is None else f"+{float(m['ts']) - sigterm:.3f} s"

    print(f"SIGTERM of the leader (port {old_port})        +0.000 s")
    print(f"first NOT_LEADER_OR_FOLLOWER answer          {at(first_error)}")
    print(f"leader updated from the answer               {at(update)}  {update['text'] if update else ''}")
    print(f"first Produce to the new leader              {at(to_new)}")
    print(f"Metadata answers received before it          {len(metadata_before)}")
    print(f"first acknowledgement from the new leader    {at(ack)}")


if __name__ == "__main__":
    main()
