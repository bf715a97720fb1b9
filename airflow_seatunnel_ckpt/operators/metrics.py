"""The metrics the provider's tasks emit through Airflow's ``Stats`` (listed in docs/OPERATIONS.md, "Metrics")."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from airflow.sdk.observability.stats import Stats

PREFIX = "seatunnel_ckpt"
EPOCH_DURATION = f"{PREFIX}.epoch_duration"
CHECKPOINT_BYTES = f"{PREFIX}.checkpoint_bytes"
FILES_PUBLISHED = f"{PREFIX}.files_published"
ROWS_PUBLISHED = f"{PREFIX}.rows_published"
EPOCHS_COMMITTED = f"{PREFIX}.epochs_committed"
EPOCHS_ABORTED = f"{PREFIX}.epochs_aborted"
RECOVERY_ACTIONS = f"{PREFIX}.recovery_actions"


def epoch_committed(tags: Mapping[str, str], duration_s: float | None, files: int,
                    rows: int) -> None:
    """Record one epoch's commit."""
    Stats.incr(EPOCHS_COMMITTED, tags=dict(tags))
    Stats.incr(FILES_PUBLISHED, count=files, tags=dict(tags))
    Stats.incr(ROWS_PUBLISHED, count=rows, tags=dict(tags))
    if duration_s is not None and duration_s >= 0:
        Stats.timing(EPOCH_DURATION, timedelta(seconds=duration_s), tags=dict(tags))


def epoch_aborted(tags: Mapping[str, str]) -> None:
    """Record one epoch's abort."""
    Stats.incr(EPOCHS_ABORTED, tags=dict(tags))


def checkpoint_written(tags: Mapping[str, str], nbytes: int) -> None:
    """Record the size of the checkpoint parts one participant wrote for an epoch."""
    Stats.gauge(CHECKPOINT_BYTES, nbytes, tags=dict(tags))


def recovery_action(tags: Mapping[str, str], action: str) -> None:
    """Record one action a recovery run took."""
    Stats.incr(RECOVERY_ACTIONS, tags={**tags, "action": action})
