"""Issue 16, hole 7: settings that would void exactly-once are refused, a partition that dies is
noticed, and a pause that times out does not linger. No broker: these are decisions made before
(or without) any I/O."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry

from dedupe_worker.config import load_config
from dedupe_worker.exceptions import ConfigError, DedupeError, FencedError, StoreError
from dedupe_worker.metrics import WorkerMetrics
from dedupe_worker.records import BadHeaderError, source_offset
from dedupe_worker.runner import WorkerRunner
from dedupe_worker.worker import PartitionWorker


@pytest.mark.parametrize(("key", "value"), [("enable.idempotence", "false"), ("acks", "1"),
                                            ("transactional.id", "mine"), ("isolation.level", "read_uncommitted"),
                                            ("enable.auto.commit", "true"), ("auto.offset.reset", "latest")])
def test_kafka_overrides_that_void_exactly_once_are_refused(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        load_config(None, kafka={key: value})
    assert "cannot be overridden" in str(e.value)


def test_harmless_kafka_overrides_are_kept() -> None:
    assert load_config(None, kafka={"linger.ms": "20"}).kafka == {"linger.ms": "20"}


@pytest.mark.parametrize("raw", [b"abc", b"-1", b"1.5", b"", b"9" * 40])
def test_a_bad_source_offset_header_is_a_clear_error(raw: bytes) -> None:
    with pytest.raises(BadHeaderError, match=r"dedupe\.source\.offset"):
        source_offset([("dedupe.source.offset", raw)])


def test_pause_that_times_out_is_withdrawn(tmp_path: object) -> None:
    w = PartitionWorker(load_config(None), 0, WorkerMetrics(CollectorRegistry()))
    with pytest.raises(DedupeError, match="did not pause"):
        w.pause(timeout_s=0.05)  # no run loop serves it
    assert not w._pause_requested.is_set()


def _runner_with(failures: list[BaseException | None]) -> WorkerRunner:
    runner = WorkerRunner(load_config(None), registry=CollectorRegistry())
    metrics = WorkerMetrics(runner.registry)
    for p, failure in enumerate(failures):
        w = PartitionWorker(runner.cfg, p, metrics)
        w.failure = failure
        runner.workers[p] = w
    runner._threads = [threading.Thread(target=lambda: None)]
    return runner


def test_a_failed_partition_stops_the_process_and_exits_non_zero() -> None:
    runner = _runner_with([None, StoreError("volume gone")])
    runner.alive()
    assert runner.stop_event.is_set()
    assert runner.exit_code() == 1
    assert runner.registry.get_sample_value("dedupe_partition_failed", {"partition": "1"}) == 1


def test_a_fenced_partition_leaves_the_others_running_and_exits_3() -> None:
    runner = _runner_with([None, FencedError("another worker owns it")])
    runner.alive()
    assert not runner.stop_event.is_set()
    assert runner.exit_code() == 3
    assert _runner_with([None, None]).exit_code() == 0


def test_metrics_bind_loopback_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config(None).metrics_host == "127.0.0.1"
    monkeypatch.setenv("DEDUPE_METRICS_HOST", "0.0.0.0")
    assert load_config(None).metrics_host == "0.0.0.0"
