"""What ads-broker's request-path metrics (ads_broker/request_metrics.py) cost per call, in process.

    .venv/bin/python bench/request_metrics_cost.py

Times the three calls the broker makes on its hot path: ``request_done`` for a Produce answering 4
partitions (one per request, in server.py's dispatch), ``appended`` (one per partition appended)
and ``fetched`` for a 4-partition consumer fetch, best of 5 runs of 100,000 calls each, next to a
plain dict increment as a yardstick for how loaded the machine is. The end-to-end cost is measured
by bench/broker_throughput.py --baseline (docs/BENCHMARKS.md, "Request metrics").
"""

from __future__ import annotations

import sys
import time
import timeit
from pathlib import Path

from kafka.protocol.producer import ProduceResponse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.request_metrics import BrokerMetrics

CALLS = 100_000


def best_us(fn: object) -> float:
    return min(timeit.repeat(fn, number=CALLS, repeat=5)) / CALLS * 1e6  # type: ignore[arg-type]


def main() -> None:
    metrics = BrokerMetrics(max_topic_labels=100, max_connections=100)
    part = ProduceResponse.TopicProduceResponse.PartitionProduceResponse
    response = ProduceResponse(responses=[ProduceResponse.TopicProduceResponse(name="t", partition_responses=[
        part(index=i, error_code=0, base_offset=0, log_append_time_ms=-1, log_start_offset=0, record_errors=[],
             error_message=None) for i in range(4)])], throttle_time_ms=0)
    request = DecodedRequest(api_key=0, api_version=9, correlation_id=1, client_id="bench", body=None)
    reads = [("t", 0, 1000)] * 4
    counts: dict[str, int] = {}

    def plain() -> None:
        counts["a"] = counts.get("a", 0) + 1

    print(f"yardstick, dict increment:           {best_us(plain):6.2f} µs")
    done = best_us(lambda: metrics.request_done(request, response, time.perf_counter()))
    print(f"request_done (Produce, 4 partitions): {done:6.2f} µs")
    print(f"appended (one partition):             {best_us(lambda: metrics.appended('t', 100, 30000)):6.2f} µs")
    print(f"fetched (4 partitions):               {best_us(lambda: metrics.fetched(reads)):6.2f} µs")


if __name__ == "__main__":
    main()
