"""Local volume backend: volumes are directories, snapshots are worker-made RocksDB checkpoints.

Layout (docs/CONTRACTS.md):

    <data-dir>/partition-<p>/                  one partition's volume (holds the worker's RocksDB)
    <snapshot-dir>/partition-<p>/<id>/         a completed snapshot:
        manifest.json                          offsets, sequence, time, created-by, worker
        volume/                                the volume as of the snapshot (RocksDB checkpoint:
                                               SST files hard-linked when on the same filesystem)
    <snapshot-dir>/partition-<p>/<id>.incomplete/   a snapshot whose run stopped before the manifest

Invariants:
- the checkpoint is taken BY THE WORKER (it owns the open DB) while the partition is paused, and
  the partition is resumed as soon as the checkpoint exists, on every path;
- a snapshot directory without ``.incomplete`` always has its manifest (written, fsynced, then the
  directory renamed into place);
- restore builds the volume in a staging directory next to the target and renames it into place,
  so the target is either absent, the old volume, or the complete restored volume; a re-run resumes
  the staging copy; a volume a running worker holds open (its RocksDB LOCK) is never touched;
- a local volume is "attached" to the data dir whose running worker holds its LOCK: restore
  refuses while the partition's volume in another data dir (``--data-dir``, or where the snapshot
  was taken) is held; ``force`` runs the stop hook, waits for the LOCK to be released and moves
  that volume aside (``partition-<p>.detached-<time>``) first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import struct
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

from ebs_ops.backends.base import (
    StepCallback,
    no_progress,
    require_stop_hook,
    second_writer_refusal,
    select_prunable,
)
from ebs_ops.control import WorkerControlClient, paused
from ebs_ops.exceptions import (
    BadInputError,
    SnapshotFailedError,
    StepTimeoutError,
    UnknownInstanceError,
    UnknownPartitionError,
    UnknownSnapshotError,
    VolumeInUseError,
)
from ebs_ops.hooks import run_hook
from ebs_ops.models import CREATED_BY, MoveResult, RestoreResult, SnapshotInfo, WorkerPosition

log = structlog.get_logger(__name__)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
INCOMPLETE = ".incomplete"
# Files RocksDB itself owns in a DB directory; anything else at the volume root is worker metadata
# the checkpoint does not carry, so the snapshot copies it alongside.
_ROCKSDB_PREFIXES = ("LOCK", "LOG", "MANIFEST-", "CURRENT", "OPTIONS-", "IDENTITY")
_ROCKSDB_SUFFIXES = (".sst", ".log", ".blob", ".dbtmp")


def volume_dir(data_dir: Path, partition: int) -> Path:
    return data_dir / f"partition-{partition}"


def volume_in_use(volume: Path) -> bool:
    """True when a process holds a RocksDB LOCK under ``volume`` (a running worker).

    Uses F_OFD_GETLK, which tests without taking the lock, so it never disturbs the holder.
    """
    for lock in _lock_files(volume):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            probe = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
            cmd = getattr(fcntl, "F_OFD_GETLK", fcntl.F_GETLK)
            l_type = struct.unpack("hhqqi4x", fcntl.fcntl(fd, cmd, probe))[0]
        finally:
            os.close(fd)
        if l_type != fcntl.F_UNLCK:
            return True
    return False


def _lock_files(volume: Path) -> list[Path]:
    if not volume.is_dir():
        return []
    return [p for p in (volume / "LOCK", *volume.glob("*/LOCK")) if p.is_file()]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: Path, body: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _is_rocksdb_file(name: str) -> bool:
    return name.startswith(_ROCKSDB_PREFIXES) or name.endswith(_ROCKSDB_SUFFIXES)


def _copy_tree_resumable(src: Path, dst: Path) -> int:
    """Copy ``src`` into ``dst``; files already there with the same size are kept (resume).

    SST and blob files are immutable in RocksDB, so they are hard-linked when possible.
    Returns the number of files written by this call.
    """
    written = 0
    for root, _dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            s, d = Path(root) / name, dst / rel / name
            if d.exists() and d.stat().st_size == s.stat().st_size:
                continue
            d.unlink(missing_ok=True)
            if name.endswith((".sst", ".blob")):
                try:
                    os.link(s, d)
                except OSError:
                    _copy_durably(s, d)
            else:
                _copy_durably(s, d)
            written += 1
        _fsync_dir(dst / rel)  # new names (links and copies) survive a power loss
    return written


def _copy_durably(src: Path, dst: Path) -> None:
    """Copy with metadata and fsync, so a later 'done' marker never points at unwritten data."""
    shutil.copy2(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalVolumeBackend:
    """Snapshots, restore and move for worker volumes that are local directories."""

    def __init__(self, data_dir: Path, snapshot_dir: Path, control: WorkerControlClient | None = None,
                 *, worker: str = "", progress: StepCallback = no_progress,
                 freeze_cmd: str | None = None, thaw_cmd: str | None = None,
                 stop_cmd: str | None = None, start_cmd: str | None = None,
                 hook_timeout_s: float = 60.0, step_timeout_s: float = 300.0,
                 replace: bool = False, force: bool = False) -> None:
        # Absolute: the worker resolves the checkpoint path we send in ITS working directory.
        self.data_dir = Path(data_dir).absolute()
        self.snapshot_dir = Path(snapshot_dir).absolute()
        self.control = control
        self.worker = worker or (control.url if control else "")
        self.progress = progress
        self.freeze_cmd, self.thaw_cmd = freeze_cmd, thaw_cmd
        self.stop_cmd, self.start_cmd = stop_cmd, start_cmd
        self.hook_timeout_s = hook_timeout_s
        self.step_timeout_s = step_timeout_s
        self.replace = replace
        self.force = force  # restore: stop + move aside another data dir's volume of the partition

    # --- snapshot -------------------------------------------------------------------------------

    def snapshot(self, partition: int, *, dry_run: bool = False) -> SnapshotInfo:
        volume = volume_dir(self.data_dir, partition)
        if not volume.is_dir():
            raise UnknownPartitionError(
                f"no volume for partition {partition} at {volume}; "
                f"check --data-dir (volumes present: {self._volumes_present()})"
            )
        if self.control is None:
            raise BadInputError(
                "local snapshots are taken by the running worker (it owns the open RocksDB); "
                "pass --control-url http://127.0.0.1:PORT of `dedupe-worker run --control-port`"
            )
        now = datetime.now(UTC)
        snap_id = f"snap-p{partition}-{now.strftime('%Y%m%dT%H%M%S%fZ')}"
        final = self.snapshot_dir / f"partition-{partition}" / snap_id
        staging = final.with_name(snap_id + INCOMPLETE)
        if dry_run:
            self.control.partitions()  # proves the worker answers; changes nothing
            return self._info(snap_id, partition, "dry-run", now, volume, final)
        staging.mkdir(parents=True)
        position = self._checkpoint(partition, volume, staging)
        self.progress("write manifest")
        self._copy_volume_metadata(volume, staging / "volume", position)
        manifest = self._manifest(snap_id, partition, now, position, volume)
        _write_json_atomic(staging / MANIFEST, manifest)
        os.replace(staging, final)
        _fsync_dir(final.parent)
        log.info("snapshot_created", snapshot_id=snap_id, partition=partition, path=str(final))
        return self._from_manifest(manifest, final)

    def _checkpoint(self, partition: int, volume: Path, staging: Path) -> WorkerPosition:
        assert self.control is not None
        self.progress("pause worker")
        with paused(self.control, partition) as position:
            db_rel = self._db_relative(volume, position)
            target = staging / "volume" / db_rel
            target.parent.mkdir(parents=True, exist_ok=True)
            run_hook("freeze", self.freeze_cmd, self.hook_timeout_s, partition=partition,
                     volume=volume, instance=self.data_dir)
            try:
                self.progress("checkpoint")
                done = self.control.checkpoint(partition, str(target))
            finally:
                run_hook("thaw", self.thaw_cmd, self.hook_timeout_s, partition=partition,
                         volume=volume, instance=self.data_dir)
        return WorkerPosition(done.partition, done.input_offset, done.output_offset, done.sequence,
                              db_rel.as_posix())

    @staticmethod
    def _db_relative(volume: Path, position: WorkerPosition) -> Path:
        db = Path(position.db_path or volume).resolve()
        try:
            return db.relative_to(volume.resolve())
        except ValueError:
            raise BadInputError(
                f"worker reports db_path {db} outside the volume {volume}; "
                "the worker and ebs-ops disagree on --data-dir: pass the worker's --data-dir"
            ) from None

    @staticmethod
    def _copy_volume_metadata(volume: Path, snap_volume: Path, position: WorkerPosition) -> None:
        """Copy small non-RocksDB files at the volume root the checkpoint does not include."""
        db_is_root = position.db_path in ("", ".")
        for entry in volume.iterdir():
            if not entry.is_file() or (db_is_root and _is_rocksdb_file(entry.name)):
                continue
            dest = snap_volume / entry.name
            if not dest.exists():
                shutil.copy2(entry, dest)

    def _manifest(self, snap_id: str, partition: int, now: datetime, pos: WorkerPosition,
                  volume: Path) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT, "snapshot_id": snap_id, "partition": partition,
            "created_at": now.isoformat(), "created_by": CREATED_BY, "worker": self.worker,
            "input_offset": pos.input_offset, "output_offset": pos.output_offset,
            "sequence": pos.sequence, "db_relative_path": pos.db_path, "source_volume": str(volume),
        }

    # --- list / wait / prune ----------------------------------------------------------------------

    def list_snapshots(self, partition: int | None = None) -> list[SnapshotInfo]:
        if partition is None:
            dirs = sorted(self.snapshot_dir.glob("partition-*/*")) if self.snapshot_dir.is_dir() else []
        else:
            dirs = sorted((self.snapshot_dir / f"partition-{partition}").glob("*"))
        infos = [info for d in dirs if d.is_dir() and (info := self._read(d)) is not None]
        return sorted(infos, key=lambda s: (s.partition, s.created_at))

    def _read(self, path: Path) -> SnapshotInfo | None:
        if path.name.endswith(INCOMPLETE):
            snap_id = path.name.removesuffix(INCOMPLETE)
            partition = int(path.parent.name.removeprefix("partition-"))
            created = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            return self._info(snap_id, partition, "incomplete", created, Path(), path)
        try:
            manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None  # not a snapshot this tool wrote
        except ValueError as exc:
            raise BadInputError(
                f"snapshot manifest {path / MANIFEST} is not valid JSON ({exc}); "
                "move that directory out of the snapshot dir and re-run"
            ) from exc
        return self._from_manifest(manifest, path)

    def _info(self, snap_id: str, partition: int, state: str, created: datetime, volume: Path,
              location: Path) -> SnapshotInfo:
        return SnapshotInfo(snapshot_id=snap_id, partition=partition, state=state, created_at=created,
                            created_by=CREATED_BY, worker=self.worker, source=str(volume),
                            location=str(location))

    @staticmethod
    def _from_manifest(m: dict[str, Any], path: Path) -> SnapshotInfo:
        return SnapshotInfo(
            snapshot_id=m["snapshot_id"], partition=int(m["partition"]), state="completed",
            created_at=datetime.fromisoformat(m["created_at"]), created_by=m.get("created_by", ""),
            input_offset=m.get("input_offset"), output_offset=m.get("output_offset"),
            sequence=m.get("sequence"), worker=m.get("worker", ""),
            source=m.get("source_volume", ""), location=str(path),
        )

    def find(self, snapshot_id: str) -> SnapshotInfo:
        for info in self.list_snapshots():
            if info.snapshot_id == snapshot_id:
                return info
        raise UnknownSnapshotError(
            f"no snapshot {snapshot_id!r} under {self.snapshot_dir}; "
            "list them with `ebs-ops list --backend local`"
        )

    def wait(self, snapshot_id: str, timeout_s: float) -> SnapshotInfo:
        """A local checkpoint is complete when its manifest exists: no polling needed."""
        info = self.find(snapshot_id)
        if info.state != "completed":
            raise SnapshotFailedError(
                f"snapshot {snapshot_id} at {info.location} is incomplete (the run that took it "
                "stopped before writing its manifest); prune it and take a new snapshot"
            )
        return info

    def prune(self, partition: int, *, keep: int, max_age: timedelta | None,
              dry_run: bool = False) -> list[SnapshotInfo]:
        if keep < 1:
            raise BadInputError(f"--keep {keep}: keep at least 1 snapshot (the newest is never pruned)")
        now = datetime.now(UTC)
        mine = [s for s in self.list_snapshots(partition) if s.created_by == CREATED_BY]
        doomed = select_prunable(mine, keep, max_age, now)
        # An incomplete snapshot younger than the step timeout may still be being written.
        stale = timedelta(seconds=self.step_timeout_s)
        doomed += [s for s in mine if s.state == "incomplete" and now - s.created_at > stale]
        for s in doomed:
            log.info("prune", snapshot_id=s.snapshot_id, dry_run=dry_run)
            if not dry_run:
                shutil.rmtree(s.location)
        return doomed

    # --- restore ----------------------------------------------------------------------------------

    def restore(self, partition: int, instance: str, snapshot_id: str | None, *,
                dry_run: bool = False) -> RestoreResult:
        """Every check runs before anything changes; only then, with ``force``, is the worker that
        holds the partition in another data dir stopped and its volume moved aside."""
        require_stop_hook(self.force, self.stop_cmd, partition)
        data_dir = self._instance_dir(instance)
        snap = self._pick_snapshot(partition, snapshot_id)
        volume = volume_dir(data_dir, partition)
        marker = data_dir / f".partition-{partition}.ebs-ops-restore.json"
        self.progress("check target")
        holders = self._other_holders(partition, data_dir, snap)
        done = self._already_restored(volume, marker, snap)
        staging = data_dir / f".restore-partition-{partition}-{snap.snapshot_id}"
        swapped = not done and not dry_run and self._swapped_before_crash(volume, marker, staging, snap)
        if not (done or swapped):
            self._check_target_free(volume)
        self._release_other_holders(partition, holders, data_dir, dry_run=dry_run)
        if done:
            return self._restore_result(snap, volume, data_dir, resumed=True, dry_run=dry_run)
        if swapped:
            # The last run swapped the staged copy in and died before recording it: finish that.
            self._mark_done(marker, snap, volume)
            return self._restore_result(snap, volume, data_dir, resumed=True, dry_run=False)
        if dry_run:
            return self._restore_result(snap, volume, data_dir, resumed=False, dry_run=True)
        resumed = staging.exists()
        self.progress("copy snapshot")
        _copy_tree_resumable(Path(snap.location) / "volume", staging)
        _write_json_atomic(marker, {"snapshot_id": snap.snapshot_id, "state": "staged"})
        self.progress("swap in volume")
        if volume.exists():
            aside = volume.with_name(f"{volume.name}.replaced-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
            os.replace(volume, aside)
            log.info("volume_moved_aside", volume=str(volume), to=str(aside))
        os.replace(staging, volume)
        _fsync_dir(data_dir)
        self._mark_done(marker, snap, volume)
        return self._restore_result(snap, volume, data_dir, resumed=resumed, dry_run=False)

    def _other_holders(self, partition: int, data_dir: Path, snap: SnapshotInfo) -> list[Path]:
        """Volumes of ``partition`` outside ``data_dir`` that a running worker holds open: the one
        under ``--data-dir`` and the one the snapshot was taken from (its manifest records it)."""
        candidates = [volume_dir(self.data_dir, partition)]
        if snap.source:
            candidates.append(Path(snap.source))
        found: list[Path] = []
        for vol in candidates:
            real = vol.resolve()
            if real.parent == data_dir.resolve() or real in found:
                continue  # the target itself: the same-instance checks cover it
            if volume_in_use(real):
                found.append(real)
        return found

    def _release_other_holders(self, partition: int, holders: list[Path], data_dir: Path, *,
                               dry_run: bool) -> None:
        """Refuse while another data dir's running worker holds the partition; with ``force`` stop
        it (stop hook), wait for its LOCK to be released and move its volume aside."""
        if not holders:
            return
        if not self.force:
            held = holders[0]
            raise second_writer_refusal(
                partition, f"volume {held} open by a running worker of data dir {held.parent} "
                "(its RocksDB LOCK is held)", str(data_dir),
                undo=f"Stop the worker of {held.parent} (so it releases {held})",
                forced=f"runs the stop hook for {held.parent}, waits for the LOCK to be released, moves "
                       f"{held.name} aside as {held.name}.detached-<time>")
        for held in holders:
            if dry_run:
                log.info("dry_run_would_stop", partition=partition, instance=str(held.parent), volume=str(held))
                continue
            log.warning("forced_release", partition=partition, instance=str(held.parent), volume=str(held),
                        reason="--force: stopping the other worker of the partition before restoring")
            self.progress("stop the other worker")
            run_hook("stop", self.stop_cmd, self.hook_timeout_s, partition=partition, volume=held,
                     instance=held.parent)
            self._wait_released(held)
            aside = held.with_name(f"{held.name}.detached-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
            os.replace(held, aside)
            _fsync_dir(held.parent)
            log.info("volume_detached", partition=partition, volume=str(held), to=str(aside))

    @staticmethod
    def _mark_done(marker: Path, snap: SnapshotInfo, volume: Path) -> None:
        _write_json_atomic(marker, {"snapshot_id": snap.snapshot_id, "state": "done",
                                    "volume_inode": volume.stat().st_ino,
                                    "restored_at": datetime.now(UTC).isoformat()})

    @staticmethod
    def _swapped_before_crash(volume: Path, marker: Path, staging: Path, snap: SnapshotInfo) -> bool:
        """Marker says 'staged' for this snapshot, the staging dir is gone and the volume exists."""
        if staging.exists() or not (volume.exists() and marker.exists()):
            return False
        with contextlib.suppress(ValueError, OSError):
            body = json.loads(marker.read_text(encoding="utf-8"))
            return bool(body.get("snapshot_id") == snap.snapshot_id and body.get("state") == "staged")
        return False

    @staticmethod
    def _instance_dir(instance: str) -> Path:
        data_dir = Path(instance).absolute()
        if not data_dir.is_dir():
            raise UnknownInstanceError(
                f"local instance {instance!r} is not a directory; for the local backend an "
                "instance is a worker's --data-dir: create it or fix the path"
            )
        return data_dir

    def _pick_snapshot(self, partition: int, snapshot_id: str | None) -> SnapshotInfo:
        if snapshot_id is not None:
            snap = self.wait(snapshot_id, 0)
            if snap.partition != partition:
                raise BadInputError(
                    f"snapshot {snapshot_id} is of partition {snap.partition}, not {partition}; "
                    f"a volume keeps its partition id: restore it with --partition {snap.partition}"
                )
            return snap
        done = [s for s in self.list_snapshots(partition) if s.state == "completed"]
        if not done:
            raise UnknownSnapshotError(
                f"no completed snapshot of partition {partition} under {self.snapshot_dir}; "
                "take one with `ebs-ops snapshot` or check --snapshot-dir"
            )
        return done[-1]

    @staticmethod
    def _already_restored(volume: Path, marker: Path, snap: SnapshotInfo) -> bool:
        if not (volume.exists() and marker.exists()):
            return False
        with contextlib.suppress(ValueError, OSError):
            body = json.loads(marker.read_text(encoding="utf-8"))
            # The inode ties the marker to the directory this restore created, not to whatever
            # later sits at the same path.
            return bool(body.get("snapshot_id") == snap.snapshot_id and body.get("state") == "done"
                        and body.get("volume_inode") == volume.stat().st_ino)
        return False

    def _check_target_free(self, volume: Path) -> None:
        if volume_in_use(volume):
            raise VolumeInUseError(
                f"volume {volume} is open by a running worker (its RocksDB LOCK is held); "
                "stop that worker first, then re-run"
            )
        if volume.exists() and any(volume.iterdir()) and not self.replace:
            raise VolumeInUseError(
                f"volume {volume} already exists and holds data; refusing to restore over it. "
                "Pass --replace to move it aside (kept as partition-<p>.replaced-<time>) or move it yourself"
            )

    def _restore_result(self, snap: SnapshotInfo, volume: Path, data_dir: Path, *, resumed: bool,
                        dry_run: bool) -> RestoreResult:
        return RestoreResult(partition=snap.partition, snapshot_id=snap.snapshot_id, volume=str(volume),
                             instance=str(data_dir), device=str(volume), input_offset=snap.input_offset,
                             output_offset=snap.output_offset, sequence=snap.sequence, resumed=resumed,
                             dry_run=dry_run)

    # --- move -------------------------------------------------------------------------------------

    def move(self, partition: int, to_instance: str, *, dry_run: bool = False) -> MoveResult:
        source = volume_dir(self.data_dir, partition)
        target_dir = self._instance_dir(to_instance)
        target = volume_dir(target_dir, partition)
        if not source.is_dir():
            raise UnknownPartitionError(
                f"no volume for partition {partition} at {source}; check --data-dir "
                f"(volumes present: {self._volumes_present()})"
            )
        if target.exists():
            raise VolumeInUseError(
                f"{target} already exists: the target already has a volume for partition {partition}; "
                "move or remove it first"
            )
        result = MoveResult(partition, str(source), str(self.data_dir), str(target_dir), str(target), dry_run)
        if dry_run:
            return result
        self.progress("stop worker")
        run_hook("stop", self.stop_cmd, self.hook_timeout_s, partition=partition, volume=source,
                 instance=self.data_dir)
        self._wait_released(source)
        self.progress("move volume")
        self._move_dir(source, target)
        self.progress("start worker")
        run_hook("start", self.start_cmd, self.hook_timeout_s, partition=partition, volume=target,
                 instance=target_dir)
        return result

    def _wait_released(self, volume: Path) -> None:
        """Wait (up to the step timeout) for the stopped worker to release its RocksDB LOCK."""
        if not self.stop_cmd and volume_in_use(volume):
            raise VolumeInUseError(
                f"volume {volume} is still open by a running worker; stop it "
                "(or pass --stop-cmd) and re-run: nothing was moved"
            )
        deadline = time.monotonic() + self.step_timeout_s
        while volume_in_use(volume):
            if time.monotonic() >= deadline:
                raise StepTimeoutError(
                    f"worker still holds {volume} {self.step_timeout_s:.0f}s after the stop hook; "
                    "check the worker and re-run: nothing was moved"
                )
            time.sleep(0.2)

    @staticmethod
    def _move_dir(source: Path, target: Path) -> None:
        try:
            os.rename(source, target)
        except OSError:
            # Another filesystem: copy to a staging name, rename into place, then drop the source.
            staging = target.with_name(f".moving-{target.name}")
            _copy_tree_resumable(source, staging)
            os.replace(staging, target)
            shutil.rmtree(source)
        _fsync_dir(target.parent)

    def _volumes_present(self) -> list[str]:
        if not self.data_dir.is_dir():
            return []
        return sorted(p.name for p in self.data_dir.glob("partition-*") if p.is_dir())
