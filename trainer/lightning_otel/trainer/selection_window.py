"""Which part of the store a scheduled run reads: a window behind a durable watermark, so a run's
selection costs the same at 50M spans as at 1M.

The watermark W (kept in the job's state, checkpoints.CheckpointStore.watermark) is a time before
which every rollout has been fully considered. A run selects rollouts that started at or after
W - `lookback_s` (the look-back: a reward that arrives late, within it, is still trained on), and
reads the hour partitions from W - `lookback_s` - `max_rollout_s` on, so a rollout that starts
inside the window is read whole even when it began before the partitions of its start (a rollout
longer than `max_rollout_s` with no span in the extra stretch could be seen cut; it is still never
selected, since its visible start is before the window). The anti-join with the trained ledger uses
the same window: ledger rows of rollouts that started before it cannot match.

After a run that committed its step, or had nothing to do, W moves to the earliest of:
- the completeness cutoff, now - `min_age_s` (a rollout that ends after it is not complete yet);
- the start of the oldest rollout still open (ended after the cutoff): it becomes selectable later;
- the start of the newest rollout selected, when the selection was cut by `max_rollouts` (those
  after it were not considered), or of the oldest one selected, when the run trained none of them
  (fewer than `min_rollouts`: they wait for the next run).
A run that fails (swap, probe) leaves W where it was, so it never passes a rollout that returned to
the pool. W only ever makes a run read less; exactly-once comes from the ledger, which every
window still consults. A reward that arrives after the look-back is trained on only by a run with
`backfill`, which reads the whole store (docs/training.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True)
class Window:
    select_from: datetime | None  # rollouts that started at or after this; None: every rollout
    read_from: datetime | None  # the partitions read; None: the whole store


def window(watermark: datetime | None, lookback_s: float, max_rollout_s: float, backfill: bool) -> Window:
    """The window a run reads: everything on the first run (no watermark yet) or with `backfill`."""
    if watermark is None or backfill:
        return Window(None, None)
    select_from = watermark - timedelta(seconds=lookback_s)
    return Window(select_from, select_from - timedelta(seconds=max_rollout_s))


def next_watermark(
    now: datetime,
    min_age_s: float,
    oldest_open: datetime | None,
    held_back_to: datetime | None,
) -> datetime:
    """The watermark after a run that committed its step or had nothing to do: the completeness
    cutoff, held back to the oldest open rollout's start and to `held_back_to` (the selection's
    newest start when `max_rollouts` cut it, its oldest when nothing was trained)."""
    candidates = [now - timedelta(seconds=min_age_s)]
    candidates += [t for t in (oldest_open, held_back_to) if t is not None]
    return min(candidates)


def from_epoch_us(value: int | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value / 1e6, tz=UTC)


def to_epoch_us(value: datetime) -> int:
    return round(value.timestamp() * 1e6)
