"""Config precedence and validation; in-batch and in-store dedupe of one batch; fault spec parsing."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedupe_worker.config import load_config, parse_partitions
from dedupe_worker.exceptions import ConfigError
from dedupe_worker.faults import FaultHook
from dedupe_worker.keys import encode_message_id
from dedupe_worker.store.keyfilter import Probe, key_hashes
from dedupe_worker.worker import Split, split_batch


def test_partition_ranges() -> None:
    assert parse_partitions("0-3,7") == [0, 1, 2, 3, 7]
    for bad in ("3-1", "a", "1,1"):
        with pytest.raises(ValueError):
            parse_partitions(bad)


def test_flags_beat_env_beat_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_file = tmp_path / "dedupe.toml"
    cfg_file.write_text('bootstrap = "file:1"\ninput_topic = "file-in"\npartitions = "0-1"\n'
                        'batch_size = 10\n[aging]\nmax_keys = 100\n')
    monkeypatch.setenv("DEDUPE_INPUT_TOPIC", "env-in")
    monkeypatch.setenv("DEDUPE_BATCH_SIZE", "20")
    monkeypatch.setenv("DEDUPE_PARTITIONS", "2-3")
    cfg = load_config(cfg_file, bootstrap=None, batch_size=30)
    assert (cfg.bootstrap, cfg.input_topic, cfg.batch_size, cfg.partitions) == ("file:1", "env-in", 30, [2, 3])
    assert cfg.aging.max_keys == 100


def test_no_file_uses_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("DEDUPE_INPUT_TOPIC", "DEDUPE_BATCH_SIZE", "DEDUPE_PARTITIONS"):
        monkeypatch.delenv(k, raising=False)
    cfg = load_config(None, bootstrap="127.0.0.1:1")
    assert (cfg.input_topic, cfg.output_topic, cfg.exactly_once) == ("events", "events.deduped", "reconcile")


def test_pipeline_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEDUPE_PIPELINE", raising=False)
    assert load_config(None).pipeline is False
    assert load_config(None, pipeline=True).pipeline is True
    monkeypatch.setenv("DEDUPE_PIPELINE", "true")
    assert load_config(None).pipeline is True
    assert load_config(None, pipeline=False).pipeline is False  # --no-pipeline beats the env


@pytest.mark.parametrize(("text", "match"), [
    ("batch_size = 0\n", "batch_size"),
    ("bogus = 1\n", "bogus"),
    ('exactly_once = "maybe"\n', "exactly_once"),
    ('output_topic = "events"\n', "must differ"),
    ("[aging]\nmax_keys = -5\n", "aging.max_keys"),
    ('[kafka]\npartitioner = "consistent"\n', "murmur2_random"),
])
def test_invalid_config_names_the_setting_and_file(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Path("/nonexistent/dedupe.toml"))


@dataclass
class Rec:
    """Stands in for confluent_kafka.Message in a pure-logic test (no broker involved)."""

    k: bytes | None
    v: bytes | None
    off: int

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v

    def offset(self) -> int:
        return self.off


class SetStore:
    """The two store methods :func:`split_batch` uses, over a set (the store itself is tested in
    test_store.py); its probes are the real key-filter hashes, so their narrowing is checked too."""

    def __init__(self, stored: set[bytes]) -> None:
        self.stored = stored

    def probe(self, keys: list[bytes]) -> Probe:
        return key_hashes(keys)

    def contains(self, keys: list[bytes], probe: Probe | None = None) -> list[bool]:
        assert probe is not None and len(probe) == len(keys)
        return [k in self.stored for k in keys]


def _probe_matches(split: Split) -> bool:
    assert split.probe is not None
    return bool((split.probe.block_hash == key_hashes(split.new_keys).block_hash).all()
                and (split.probe.masks == key_hashes(split.new_keys).masks).all())


def test_split_batch_dedupes_in_batch_and_against_the_store() -> None:
    stored = {encode_message_id("old")}
    recs = [Rec(b"a", b"{}", 0), Rec(b"old", b"{}", 1), Rec(b"a", b"{}", 2), Rec(None, b"nope", 3),
            Rec(b"b", b"{}", 4), Rec(None, b'{"messageId": "b"}', 5)]
    split = split_batch(recs, SetStore(stored))  # type: ignore[arg-type]
    assert [r.off for r in split.new] == [0, 4]
    assert split.new_keys == [encode_message_id("a"), encode_message_id("b")]
    assert sorted((r.off, why) for r, why in split.duplicates) == [(1, "in_store"), (2, "in_batch"),
                                                                   (5, "in_batch")]
    assert [(r.off, why) for r, why in split.dead] == [(3, "invalid_json")]
    assert _probe_matches(split)


@given(st.lists(st.integers(0, 9), max_size=40), st.sets(st.integers(0, 9)), st.sets(st.integers(0, 9)))
def test_split_batch_of_uuid_keys_agrees_with_a_model(picks: list[int], stored_picks: set[int],
                                                      in_flight_picks: set[int]) -> None:
    """All-UUID batches take a loop-free path when nothing repeats inside the batch; whichever
    path runs, the result is the model's: first copies in input order, the rest duplicates (keys
    of the batch in flight count as stored), and the probe describes exactly the new keys."""
    ids = [str(uuid.UUID(int=i + 1, version=4)).encode() for i in range(10)]
    recs = [Rec(ids[p], b"{}", off) for off, p in enumerate(picks)]
    stored = {encode_message_id(ids[p].decode()) for p in stored_picks}
    in_flight = {encode_message_id(ids[p].decode()) for p in in_flight_picks}
    split = split_batch(recs, SetStore(stored), in_flight)  # type: ignore[arg-type]
    seen: set[int] = set()
    new, dups = [], []
    for off, p in enumerate(picks):
        if p in seen:
            dups.append((off, "in_batch"))
        elif p in stored_picks or p in in_flight_picks:
            dups.append((off, "in_store"))
        else:
            new.append(off)
        seen.add(p)
    assert [r.off for r in split.new] == new
    assert split.new_keys == [encode_message_id(ids[picks[o]].decode()) for o in new]
    assert sorted((r.off, why) for r, why in split.duplicates) == sorted(dups)
    assert split.dead == []
    assert _probe_matches(split)


def test_fault_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEDUPE_FAULT", "after_produce:3:kill")
    hook = FaultHook.from_env()
    assert (hook.point, hook.batch, hook.action) == ("after_produce", 3, "kill")
    hook.hit("after_produce", 2)  # not the batch: returns
    hook.hit("before_produce", 3)  # not the point: returns
    monkeypatch.setenv("DEDUPE_FAULT", "somewhere:1")
    with pytest.raises(ConfigError, match="expected point:batch"):
        FaultHook.from_env()


def test_generation_size_follows_the_aging_bound() -> None:
    from dedupe_worker.config import AgingConfig, StoreConfig

    assert StoreConfig().rocksdb(AgingConfig(max_keys=8_000_000)).generation_keys == 2_000_000
    assert StoreConfig().rocksdb(AgingConfig(max_bytes=1200)).generation_keys == 10
    assert StoreConfig().rocksdb(AgingConfig(max_keys=100, max_bytes=1200)).generation_keys == 10
    assert StoreConfig().rocksdb(AgingConfig()).generation_keys == 2**62  # unbounded: one generation
    assert StoreConfig(generation_keys=7).rocksdb(AgingConfig(max_keys=100)).generation_keys == 7
