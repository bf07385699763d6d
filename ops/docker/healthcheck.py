"""Container HEALTHCHECK: the worker's /metrics answers and no partition has failed for good.

Healthy means: ``GET http://127.0.0.1:$DEDUPE_METRICS_PORT/metrics`` returns 200 within the
timeout and no ``dedupe_partition_failed`` sample is 1 (a partition thread that ended on an error
it cannot restart from). A container that runs ads-broker instead sets ``ADS_BROKER_HEALTH`` to the
broker's HOST:PORT, and health is a TCP connect to it (the broker serves no HTTP endpoint).
Exit 0 = healthy, 1 = unhealthy (Docker's contract); the reason goes to stdout, which Docker keeps
in ``docker inspect``'s health log.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.request

TIMEOUT_S = 4.0


def failed_partitions(metrics_text: str) -> list[str]:
    """Label sets of ``dedupe_partition_failed`` samples whose value is 1."""
    out = []
    for line in metrics_text.splitlines():
        if line.startswith("dedupe_partition_failed{") or line.startswith("dedupe_partition_failed "):
            name, _, value = line.rpartition(" ")
            if float(value) >= 1:
                out.append(name.removeprefix("dedupe_partition_failed"))
    return out


def check_worker(port: int) -> str | None:
    """None when healthy, else why not."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            body = resp.read().decode()
    except OSError as exc:
        return f"{url} did not answer: {exc}"
    failed = failed_partitions(body)
    return f"partitions failed for good: {', '.join(failed)}" if failed else None


def check_broker(address: str) -> str | None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=TIMEOUT_S):
            return None
    except OSError as exc:
        return f"ads-broker at {address} refused or timed out: {exc}"


def main() -> int:
    broker = os.environ.get("ADS_BROKER_HEALTH")
    problem = check_broker(broker) if broker else check_worker(int(os.environ.get("DEDUPE_METRICS_PORT", "9400")))
    print(problem or "healthy")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
