"""`dedupe-worker` CLI: inspect a store, clear errors for bad config and missing volumes."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import structlog
from typer.testing import CliRunner

from dedupe_worker.cli import app
from dedupe_worker.keys import encode_message_id
from dedupe_worker.store.rocksdb import RocksDBOptions, RocksDBStore

runner = CliRunner()


def test_inspect_shows_meta_and_finds_a_message_id(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path / "partition-2", RocksDBOptions(), topic="events", partition=2)
    store.record([encode_message_id("m-1")], [1234], input_offset=9, output_offset=1)
    store.close()
    result = runner.invoke(app, ["inspect", "--partition", "2", "--data-dir", str(tmp_path),
                                 "--message-id", "m-1"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["input_offset"], out["output_offset"], out["keys"], out["found"]) == (9, 1, 1, True)
    assert (out["generation_first_sequence"], out["generation_first_seen_ms"]) == (0, 1234)


def test_inspect_missing_volume_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["inspect", "--partition", "0", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "no store at" in result.output


def test_run_with_invalid_config_exits_2_naming_the_setting(tmp_path: Path) -> None:
    cfg = tmp_path / "dedupe.toml"
    cfg.write_text("batch_size = -1\n")
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        result = runner.invoke(app, ["run", "--config", str(cfg)])
    finally:  # `run` installs signal handlers and configures logging: undo both
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        structlog.reset_defaults()
    assert result.exit_code == 2 and "batch_size" in result.output
