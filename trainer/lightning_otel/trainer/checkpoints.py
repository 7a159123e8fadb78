"""`lightning-otel train`: one scheduled training run, safe under cron, crashes and reruns.

A run: take the lock -> recover -> load the latest checkpoint (model, optimizer, step) and the
ledger of trained rollouts -> make sure the servers serve that checkpoint -> select rollouts not in
the ledger (complete: rewarded, and quiet for `min_age_s`) -> one update -> commit a checkpoint ->
swap it in and probe it -> retention -> exit. Exit codes: 0 done, nothing to do, or a step skipped
(its rollouts excluded, see below), 1 failed (the servers keep the previous weights), 3 another run
holds the lock.

Exactly once: a checkpoint directory holds the model, the optimizer, the step and the ids of the
rollouts that step trained on, written under a temporary name and renamed into place: the rename
commits the update and its rollouts together. The ledger is the union of every committed step's
ids (kept in ledger/ when a checkpoint is retired). A crash before the rename loses the update and
the rollouts stay untrained; after it, a rerun finds the checkpoint and only swaps it in. A
checkpoint the probe rejects moves to rejected/: its rollouts return to the pool.

Excluded for good: rollouts no run can train on (a non-finite reward, no trainable call or token, a
non-finite gradient) are written to excluded/ (rollout id, cause, reason; one Parquet file per run,
renamed into place) and selection leaves them out like trained ones, so a scheduled run never loops
on them. A rollout is in at most one of the two ledgers: only a run that commits nothing excludes the
rollouts of its batch.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

log = logging.getLogger(__name__)
WATERMARK_FILE = "watermark.json"


class LockHeld(RuntimeError):
    pass


class JobFailed(RuntimeError):
    pass


@contextmanager
def run_lock(state_dir: Path):
    state_dir.mkdir(parents=True, exist_ok=True)
    handle = open(state_dir / "lock", "w")  # noqa: SIM115
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise LockHeld(f"another training run holds {state_dir / 'lock'}") from None
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def checkpoint_version(checkpoint: Path | None) -> str:
    """The version a committed checkpoint's weights are served as; "0" for the base weights (None)."""
    return json.loads((checkpoint / "state.json").read_text())["version"] if checkpoint is not None else "0"


class CheckpointStore:
    """checkpoints/step-NNNNNN/{model|adapter, optimizer.pt (or optimizer/ when sharded), state.json,
    rollouts.parquet (rollout_id, start_us)}, ledger/, excluded/, watermark.json."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.checkpoints = root / "checkpoints"
        self.ledger_dir = root / "ledger"
        self.excluded_dir = root / "excluded"
        for path in (self.checkpoints, self.ledger_dir, self.excluded_dir, root / "rejected"):
            path.mkdir(parents=True, exist_ok=True)

    def recover(self) -> None:
        """Drop uncommitted work (temporary directories): a crash before a commit left it."""
        for tmp in self.checkpoints.glob(".tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)
        for tmp in self.excluded_dir.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)

    def committed(self) -> list[Path]:
        return sorted(p for p in self.checkpoints.glob("step-*") if (p / "state.json").exists())

    def latest(self) -> Path | None:
        steps = self.committed()
        return steps[-1] if steps else None

    def trained_ids(self, started_from_us: int | None = None) -> pa.Table:
        """The ledger's rollout ids; `started_from_us`: only those of rollouts that started then or later
        (rows written before the ledger kept start times are always kept). A ledger file whose name
        says its newest start (`ledger_name`) before `started_from_us` is not opened: a job that has
        run for months reads the files of its window, not one per step ever trained."""
        # Names, not Paths, are filtered and sorted: a job months old has tens of thousands of files
        # here, and sorting their Paths was most of the select stage (bench/store_scale.py).
        names = [name for name in os.listdir(self.ledger_dir) if name.endswith(".parquet")]
        if started_from_us is not None:
            names = [name for name in names if not _newest_start_before(name, started_from_us)]
        files = [p / "rollouts.parquet" for p in self.committed()] + [self.ledger_dir / name for name in sorted(names)]
        tables = []
        for table in (pq.read_table(f) for f in files if f.exists()):
            if started_from_us is not None and "start_us" in table.column_names:
                starts = table.column("start_us")
                table = table.filter(pc.or_kleene(pc.is_null(starts), pc.greater_equal(starts, started_from_us)))
            tables.append(table.select(["rollout_id"]))
        return pa.concat_tables(tables) if tables else pa.table({"rollout_id": pa.array([], pa.string())})

    def watermark(self) -> datetime | None:
        """The time before which every rollout has been considered (selection_window.py); None: no run
        has set it yet."""
        path = self.root / WATERMARK_FILE
        return datetime.fromisoformat(json.loads(path.read_text())["watermark"]) if path.exists() else None

    def save_watermark(self, value: datetime) -> None:
        """Written, synced and renamed: a crash leaves the old watermark, which only reads more."""
        tmp = self.root / f".{WATERMARK_FILE}.tmp"
        tmp.write_text(json.dumps({"watermark": value.isoformat()}))
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, self.root / WATERMARK_FILE)

    def excluded(self) -> pa.Table:
        """Every rollout excluded for good: rollout_id, cause, reason."""
        tables = [pq.read_table(f) for f in sorted(self.excluded_dir.glob("*.parquet"))]
        empty = pa.table({name: pa.array([], pa.string()) for name in ("rollout_id", "cause", "reason")})
        return pa.concat_tables(tables) if tables else empty

    def untrainable_ids(self, started_from_us: int | None = None) -> pa.Table:
        """Rollouts a run must not select: trained (the ledger, from `started_from_us` on) or excluded
        for good (few: all of them)."""
        return pa.concat_tables([self.trained_ids(started_from_us), self.excluded().select(["rollout_id"])])

    def exclude(self, exclusions: dict[str, tuple[str, str]]) -> None:
        """Record rollout id -> (cause, reason) in excluded/, atomically (written, synced, renamed)."""
        if not exclusions:
            return
        ids = sorted(exclusions)
        table = pa.table(
            {
                "rollout_id": pa.array(ids, pa.string()),
                "cause": [exclusions[i][0] for i in ids],
                "reason": [exclusions[i][1] for i in ids],
            }
        )
        name = f"{time.time_ns()}-{os.getpid()}.parquet"
        tmp = self.excluded_dir / f".{name}.tmp"  # not *.parquet: never read half-written
        pq.write_table(table, tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, self.excluded_dir / name)
        fd = os.open(self.excluded_dir, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    def commit(self, step: int, write) -> Path:
        """`write(folder)` fills a temporary folder, which is then synced and renamed into place."""
        tmp = self.begin(step)
        write(tmp)
        return self.finish(step, tmp)

    def begin(self, step: int) -> Path:
        """A fresh temporary folder for this step's files (commit's first half: several processes
        may write into it, e.g. sharded optimizer state, before one of them calls finish)."""
        tmp = self.checkpoints / f".tmp-step-{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        return tmp

    def finish(self, step: int, tmp: Path) -> Path:
        """Sync what `begin`'s folder holds and rename it into place: the commit."""
        for path in tmp.rglob("*"):
            if path.is_file():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        final = self.checkpoints / f"step-{step:06d}"
        os.replace(tmp, final)  # the commit: this update and its rollouts, together
        fd = os.open(self.checkpoints, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        return final

    def reject(self, checkpoint: Path) -> None:
        os.replace(checkpoint, self.root / "rejected" / f"{checkpoint.name}-{int(time.time())}")

    def retire(self, keep: int) -> None:
        """Keep the newest `keep` checkpoints (at least 2: the served one and its rollback); the
        rollout ids of retired ones move to ledger/ first, so the ledger never forgets a step."""
        for old in self.committed()[: -max(keep, 2)]:
            trained = old / "rollouts.parquet"
            if trained.exists():
                os.replace(trained, self.ledger_dir / ledger_name(old.name, pq.read_table(trained)))
            shutil.rmtree(old)


_NEWEST = re.compile(r"\.newest-(\d+)\.parquet$")


def ledger_name(stem: str, trained: pa.Table) -> str:
    """The ledger file name of a step's trained rollouts (rollout_id, start_us): `<stem>.newest-<us>.parquet`
    with the newest start, so trained_ids can pass over it unopened; `<stem>.parquet` when a start is
    unknown (null, or no start_us column), a file every run reads."""
    starts = trained.column("start_us") if "start_us" in trained.column_names else None
    if starts is None or trained.num_rows == 0 or starts.null_count:
        return f"{stem}.parquet"
    return f"{stem}.newest-{pc.max(starts).as_py()}.parquet"


def _newest_start_before(name: str, started_from_us: int) -> bool:
    found = _NEWEST.search(name)
    return found is not None and int(found.group(1)) < started_from_us
