"""The windowed max/avg behind ``reauthentication-latency-max`` / ``-avg`` (Kafka's ``SampledStat``
with ``Max`` and ``Avg``): recorded values count for ``samples * window_ms``, then drop out."""

from __future__ import annotations

import math

from ads_broker.request_metrics import WindowedMaxAvg


def test_max_and_avg_over_the_live_samples() -> None:
    stat = WindowedMaxAvg(samples=2, window_ms=1000)
    assert all(math.isnan(v) for v in stat.measure(0.0))  # no event: NaN, as Kafka's Max/Avg
    stat.record(4.0, 0.0)
    stat.record(2.0, 500.0)
    assert stat.measure(600.0) == (4.0, 3.0)
    stat.record(9.0, 1200.0)  # the first window is complete: a second sample starts
    assert stat.measure(1300.0) == (9.0, 5.0)


def test_old_samples_drop_out_and_are_reused() -> None:
    stat = WindowedMaxAvg(samples=2, window_ms=1000)
    stat.record(7.0, 0.0)
    stat.record(1.0, 1000.0)
    assert stat.measure(1999.0) == (7.0, 4.0)
    assert stat.measure(2000.0) == (1.0, 1.0)  # the sample of t=0 is 2 windows old
    assert all(math.isnan(v) for v in stat.measure(3000.0))
    stat.record(3.0, 3000.0)  # reuses the oldest sample's slot
    assert stat.measure(3000.0) == (3.0, 3.0)
