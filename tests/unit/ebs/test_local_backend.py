"""LocalVolumeBackend against a real RocksDB and a real HTTP control endpoint (WorkerDouble).

What these prove: a snapshot is a consistent checkpoint plus a manifest with the worker's offsets;
the worker is resumed on every path; restore gives exactly the snapshot's keys, refuses to go over
a live or non-empty volume, is idempotent and resumes a half-done copy; prune only deletes this
tool's snapshots beyond the policy; move refuses a volume a running process holds.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from rocksdict import Rdict

from ebs_ops.backends.local import LocalVolumeBackend, volume_in_use
from ebs_ops.control import WorkerControlClient
from ebs_ops.exceptions import (
    BadInputError,
    PartitionInUseError,
    SnapshotFailedError,
    UnknownInstanceError,
    UnknownPartitionError,
    UnknownSnapshotError,
    VolumeInUseError,
    WorkerControlError,
)
from ebs_ops.hooks import HookError
from tests.unit.ebs.control_double import HeldOpen, WorkerDouble, stop_hook


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerDouble]:
    with WorkerDouble(tmp_path / "data", 0) as w:
        w.write([f"k{i}" for i in range(2000)])
        yield w


def backend(tmp_path: Path, worker: WorkerDouble | None, **kw: object) -> LocalVolumeBackend:
    control = WorkerControlClient(worker.url) if worker else None
    return LocalVolumeBackend(tmp_path / "data", tmp_path / "snaps", control, **kw)  # type: ignore[arg-type]


def read_keys(db_dir: Path) -> set[bytes]:
    db = Rdict(str(db_dir))
    try:
        return {k for k in db.keys() if k != b"__offsets__"}  # noqa: SIM118 (Rdict iteration)
    finally:
        db.close()


def test_snapshot_records_offsets_and_resumes_worker(tmp_path: Path, worker: WorkerDouble) -> None:
    snap = backend(tmp_path, worker).snapshot(0)
    assert (snap.state, snap.input_offset, snap.output_offset, snap.sequence) == ("completed", 2000, 2000, 2000)
    assert worker.state == "running"
    assert worker.requests == ["POST /partitions/0/pause", "POST /partitions/0/checkpoint",
                               "POST /partitions/0/resume"]
    manifest = json.loads((Path(snap.location) / "manifest.json").read_text())
    assert manifest["created_by"] == "ebs-ops" and manifest["db_relative_path"] == "db"
    volume = Path(snap.location) / "volume"
    assert json.loads((volume / "volume.json").read_text())["partition"] == 0  # worker metadata kept
    assert read_keys(volume / "db") == {f"k{i}".encode() for i in range(2000)}
    ssts = list((volume / "db").glob("*.sst"))
    assert ssts and all(os.stat(p).st_nlink >= 2 for p in ssts)  # hard links, not copies


def test_snapshot_of_db_at_volume_root(tmp_path: Path) -> None:
    with WorkerDouble(tmp_path / "data", 3, db_subdir="") as w:
        w.write(["a", "b"])
        snap = backend(tmp_path, w).snapshot(3)
    volume = Path(snap.location) / "volume"
    assert read_keys(volume) == {b"a", b"b"}
    assert (volume / "volume.json").exists()


def test_restore_stale_snapshot_gives_exactly_its_keys(tmp_path: Path, worker: WorkerDouble) -> None:
    b = backend(tmp_path, worker)
    snap = b.snapshot(0)
    worker.write([f"late{i}" for i in range(100)])  # the worker keeps going after the snapshot
    worker.stop()  # and is stopped before its partition is restored elsewhere (invariant 8)
    target = tmp_path / "other-host"
    target.mkdir()
    result = b.restore(0, str(target), None)
    assert (result.snapshot_id, result.input_offset, result.resumed) == (snap.snapshot_id, 2000, False)
    keys = read_keys(target / "partition-0" / "db")
    assert len(keys) == 2000 and b"late0" not in keys
    again = b.restore(0, str(target), snap.snapshot_id)  # idempotent: finds it done
    assert again.resumed and read_keys(target / "partition-0" / "db") == keys


def test_restore_refuses_existing_volume_and_replace_keeps_it(tmp_path: Path, worker: WorkerDouble) -> None:
    b = backend(tmp_path, worker)
    snap = b.snapshot(0)
    worker.stop()
    target = tmp_path / "host"
    (target / "partition-0").mkdir(parents=True)
    (target / "partition-0" / "precious").write_text("x")
    with pytest.raises(VolumeInUseError, match="--replace"):
        b.restore(0, str(target), snap.snapshot_id)
    assert (target / "partition-0" / "precious").exists()
    replacing = backend(tmp_path, worker, replace=True)
    assert not replacing.restore(0, str(target), snap.snapshot_id).resumed
    assert replacing.restore(0, str(target), snap.snapshot_id).resumed  # the same command again: no-op
    aside = list(target.glob("partition-0.replaced-*"))
    assert len(aside) == 1 and (aside[0] / "precious").read_text() == "x"
    assert len(read_keys(target / "partition-0" / "db")) == 2000
    # Another directory put at the same path later is not mistaken for the restored one.
    os.rename(target / "partition-0", tmp_path / "elsewhere")
    (target / "partition-0").mkdir()
    (target / "partition-0" / "other").write_text("y")
    with pytest.raises(VolumeInUseError, match="holds data"):
        b.restore(0, str(target), snap.snapshot_id)


def test_restore_refuses_a_volume_a_running_process_holds(tmp_path: Path, worker: WorkerDouble) -> None:
    b = backend(tmp_path, worker, replace=True)
    snap = b.snapshot(0)
    worker.stop()
    target = tmp_path / "host"
    (target / "partition-0" / "db").mkdir(parents=True)
    with HeldOpen(target / "partition-0" / "db"):
        assert volume_in_use(target / "partition-0")
        with pytest.raises(VolumeInUseError, match="running worker"):
            b.restore(0, str(target), snap.snapshot_id)
    assert not volume_in_use(target / "partition-0")


def test_restore_resumes_a_half_done_copy(tmp_path: Path, worker: WorkerDouble) -> None:
    b = backend(tmp_path, worker)
    snap = b.snapshot(0)
    worker.stop()
    target = tmp_path / "host"
    staging = target / f".restore-partition-0-{snap.snapshot_id}"
    shutil.copytree(Path(snap.location) / "volume", staging)
    victim = next((staging / "db").glob("*.sst"))
    victim.write_bytes(victim.read_bytes()[:10])  # a copy cut short by a crash
    os.remove(staging / "db" / "CURRENT")
    result = b.restore(0, str(target), snap.snapshot_id)
    assert result.resumed
    assert len(read_keys(target / "partition-0" / "db")) == 2000
    assert not staging.exists()


def test_checkpoint_failure_still_resumes_and_leaves_incomplete(tmp_path: Path) -> None:
    with WorkerDouble(tmp_path / "data", 0, fail_checkpoint=True) as w:
        b = backend(tmp_path, w, step_timeout_s=0.0)
        with pytest.raises(WorkerControlError, match="disk full"):
            b.snapshot(0)
        assert w.requests[-1] == "POST /partitions/0/resume" and w.state == "running"
    [snap] = b.list_snapshots(0)
    assert snap.state == "incomplete"
    with pytest.raises(SnapshotFailedError, match="incomplete"):
        b.wait(snap.snapshot_id, 1)
    assert [s.snapshot_id for s in b.prune(0, keep=1, max_age=None)] == [snap.snapshot_id]
    assert b.list_snapshots(0) == []


def test_bad_input_errors_say_what_to_do(tmp_path: Path, worker: WorkerDouble) -> None:
    b = backend(tmp_path, worker)
    with pytest.raises(UnknownPartitionError, match="volumes present: \\['partition-0'\\]"):
        b.snapshot(7)
    (tmp_path / "data" / "partition-1").mkdir()
    with pytest.raises(UnknownPartitionError, match=r"GET .*/partitions"):
        b.snapshot(1)  # a volume exists, but the worker does not serve partition 1
    assert worker.state == "running"
    with pytest.raises(UnknownSnapshotError, match="ebs-ops list"):
        b.restore(0, str(tmp_path), "snap-nope")
    with pytest.raises(UnknownSnapshotError, match="take one"):
        b.restore(5, str(tmp_path), None)
    with pytest.raises(UnknownInstanceError, match="data-dir"):
        b.restore(0, str(tmp_path / "missing"), None)
    snap = b.snapshot(0)
    with pytest.raises(BadInputError, match="--partition 0"):
        b.restore(2, str(tmp_path), snap.snapshot_id)
    with pytest.raises(BadInputError, match="--control-url"):
        backend(tmp_path, None).snapshot(0)
    dead = LocalVolumeBackend(tmp_path / "data", tmp_path / "snaps", WorkerControlClient("http://127.0.0.1:9"))
    with pytest.raises(WorkerControlError, match="unreachable"):
        dead.snapshot(0)


def test_prune_keeps_newest_and_only_touches_its_own(tmp_path: Path, worker: WorkerDouble) -> None:
    b = backend(tmp_path, worker)
    snaps = [b.snapshot(0) for _ in range(4)]
    foreign = Path(snaps[0].location).with_name("snap-by-hand")
    shutil.copytree(snaps[0].location, foreign)
    manifest = json.loads((foreign / "manifest.json").read_text())
    (foreign / "manifest.json").write_text(json.dumps({**manifest, "snapshot_id": "snap-by-hand",
                                                       "created_by": "someone"}))
    dry = b.prune(0, keep=2, max_age=None, dry_run=True)
    assert [s.snapshot_id for s in dry] == [snaps[1].snapshot_id, snaps[0].snapshot_id]
    assert len(b.list_snapshots(0)) == 5
    b.prune(0, keep=2, max_age=None)
    left = {s.snapshot_id for s in b.list_snapshots(0)}
    assert left == {snaps[2].snapshot_id, snaps[3].snapshot_id, "snap-by-hand"}
    aged = b.prune(0, keep=10, max_age=timedelta(0))  # everything is older than 0s, but the newest stays
    assert [s.snapshot_id for s in aged] == [snaps[2].snapshot_id]
    with pytest.raises(BadInputError, match="keep at least 1"):
        b.prune(0, keep=0, max_age=None)


def test_move_refuses_held_volume_then_moves(tmp_path: Path) -> None:
    data, other = tmp_path / "data", tmp_path / "other"
    (data / "partition-4" / "db").mkdir(parents=True)
    db = Rdict(str(data / "partition-4" / "db"))
    db[b"x"] = b"1"
    db.close()
    other.mkdir()
    b = LocalVolumeBackend(data, tmp_path / "snaps", None, step_timeout_s=1.0)
    with HeldOpen(data / "partition-4" / "db"), pytest.raises(VolumeInUseError, match="stop it"):
        b.move(4, str(other))
    assert (data / "partition-4").exists()
    assert b.move(4, str(other), dry_run=True).dry_run and (data / "partition-4").exists()
    b.move(4, str(other))
    assert not (data / "partition-4").exists() and read_keys(other / "partition-4" / "db") == {b"x"}
    (data / "partition-4").mkdir()
    with pytest.raises(VolumeInUseError, match="already has a volume"):
        b.move(4, str(other))


@pytest.fixture
def other_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A directory on another filesystem than tmp_path (tmpfs /dev/shm), removed afterwards."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem (/dev/shm) on this machine")
    path = Path(tempfile.mkdtemp(prefix="ebs-ops-test-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_restore_and_move_across_filesystems(tmp_path: Path, worker: WorkerDouble,
                                             other_filesystem: Path) -> None:
    b = backend(tmp_path, worker)
    snap = b.snapshot(0)
    worker.stop()
    host = other_filesystem / "host"
    host.mkdir()
    b.restore(0, str(host), snap.snapshot_id)  # hard links impossible: copied
    assert len(read_keys(host / "partition-0" / "db")) == 2000
    back = tmp_path / "back"
    back.mkdir()
    LocalVolumeBackend(host, tmp_path / "snaps").move(0, str(back))
    assert not (host / "partition-0").exists() and not list(back.glob(".moving-*"))
    assert len(read_keys(back / "partition-0" / "db")) == 2000


def test_restore_rerun_after_a_crash_between_swap_and_done_marker_finishes(tmp_path: Path,
                                                                            worker: WorkerDouble) -> None:
    """The staged copy was swapped in but the 'done' marker never written: a re-run records it
    instead of refusing the (restored) volume as foreign data."""
    b = backend(tmp_path, worker)
    snap = b.snapshot(0)
    worker.stop()
    target = tmp_path / "host"
    target.mkdir()
    first = b.restore(0, str(target), snap.snapshot_id)
    marker = target / ".partition-0.ebs-ops-restore.json"
    marker.write_text(json.dumps({"snapshot_id": snap.snapshot_id, "state": "staged"}))  # the crash
    again = b.restore(0, str(target), snap.snapshot_id)
    assert again.resumed and again.volume == first.volume
    assert json.loads(marker.read_text())["state"] == "done"
    assert len(read_keys(target / "partition-0" / "db")) == 2000


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_restore_refuses_while_another_data_dir_worker_holds_the_partition(tmp_path: Path,
                                                                          worker: WorkerDouble) -> None:
    """Issue 16 on the local backend: a live worker holds data/partition-0 (its RocksDB LOCK);
    restoring partition 0 into host/ would start a second one. Refused; nothing changes."""
    snap = backend(tmp_path, worker).snapshot(0)
    worker.stop()
    data, held, host = tmp_path / "data", tmp_path / "data" / "partition-0", tmp_path / "host"
    host.mkdir()
    b = backend(tmp_path, None)
    with HeldOpen(held / "db"):  # the live worker, in another process as in production
        before = tree(tmp_path)
        with pytest.raises(PartitionInUseError) as refused:
            b.restore(0, str(host), snap.snapshot_id)
        msg = str(refused.value)
        for what in (f"partition 0 already has volume {held}", f"running worker of data dir {data}",
                     "double its output", "Nothing was changed", "--force and a stop hook"):
            assert what in msg, msg
        with pytest.raises(PartitionInUseError):
            b.restore(0, str(host), None, dry_run=True)
        with pytest.raises(BadInputError, match="needs a stop hook"):
            backend(tmp_path, None, force=True).restore(0, str(host), snap.snapshot_id)
        assert tree(tmp_path) == before and volume_in_use(held)
    assert [s.snapshot_id for s in b.list_snapshots(0)] == [snap.snapshot_id]


def test_restore_force_stops_the_other_worker_and_moves_its_volume_aside(tmp_path: Path,
                                                                         worker: WorkerDouble) -> None:
    snap = backend(tmp_path, worker).snapshot(0)
    worker.stop()
    data, held, host = tmp_path / "data", tmp_path / "data" / "partition-0", tmp_path / "host"
    host.mkdir()
    log = tmp_path / "hooks.log"
    with HeldOpen(held / "db") as live:
        b = backend(tmp_path, None, force=True, stop_cmd=stop_hook(log, live.proc.pid), step_timeout_s=30.0)
        before = tree(tmp_path)
        assert b.restore(0, str(host), snap.snapshot_id, dry_run=True).dry_run
        assert tree(tmp_path) == before and volume_in_use(held)  # dry run: no hook, nothing moved
        result = b.restore(0, str(host), snap.snapshot_id)
        assert live.proc.wait(30) != 0  # the hook stopped it
    assert log.read_text().splitlines() == [f"0 {data} {held}"]
    assert not held.exists()
    [aside] = data.glob("partition-0.detached-*")
    assert len(read_keys(aside / "db")) == 2000  # detached, kept
    assert not result.resumed and len(read_keys(host / "partition-0" / "db")) == 2000
    assert b.restore(0, str(host), snap.snapshot_id).resumed  # a re-run stops nothing
    assert len(log.read_text().splitlines()) == 1


def test_restore_force_changes_nothing_if_the_stop_hook_fails(tmp_path: Path, worker: WorkerDouble) -> None:
    snap = backend(tmp_path, worker).snapshot(0)
    worker.stop()
    held, host, log = tmp_path / "data" / "partition-0", tmp_path / "host", tmp_path / "hooks.log"
    host.mkdir()
    with HeldOpen(held / "db"):
        b = backend(tmp_path, None, force=True, stop_cmd=stop_hook(log, exit_code=3))
        with pytest.raises(HookError, match="exited 3"):
            b.restore(0, str(host), snap.snapshot_id)
        assert log.exists() and volume_in_use(held) and list(host.iterdir()) == []


def test_restore_onto_the_data_dir_holding_the_partition_is_unchanged_by_force(tmp_path: Path,
                                                                               worker: WorkerDouble) -> None:
    snap = backend(tmp_path, worker).snapshot(0)
    worker.stop()
    data, log = tmp_path / "data", tmp_path / "hooks.log"
    with HeldOpen(data / "partition-0" / "db"):
        b = backend(tmp_path, None, force=True, replace=True, stop_cmd=stop_hook(log))
        with pytest.raises(VolumeInUseError, match="stop that worker first") as refused:
            b.restore(0, str(data), snap.snapshot_id)
        assert not isinstance(refused.value, PartitionInUseError) and not log.exists()


def test_restore_finds_the_holder_through_the_snapshot_source_without_data_dir(tmp_path: Path,
                                                                               worker: WorkerDouble) -> None:
    """--data-dir names some other directory: the snapshot's manifest still says where the partition
    lived, and a live worker there still blocks the restore."""
    snap = backend(tmp_path, worker).snapshot(0)
    worker.stop()
    host = tmp_path / "host"
    host.mkdir()
    b = LocalVolumeBackend(tmp_path / "unrelated", tmp_path / "snaps")
    with HeldOpen(tmp_path / "data" / "partition-0" / "db"), pytest.raises(PartitionInUseError, match="data"):
        b.restore(0, str(host), snap.snapshot_id)
    assert list(host.iterdir()) == []
