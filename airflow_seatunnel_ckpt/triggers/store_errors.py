"""How long a trigger polls on through failing reads of the checkpoint store."""

from __future__ import annotations

import time

from airflow_seatunnel_ckpt.core.errors import (
    ConfigError,
    CorruptCheckpointError,
    InvalidEpochError,
    InvalidNameError,
)

#: Seconds a trigger keeps polling through failing store reads before it reports the failure.
STORE_ERROR_TOLERANCE_S = 300.0

#: Errors that waiting cannot heal: a damaged record, a bad configuration or name.
LASTING_ERRORS: tuple[type[BaseException], ...] = (CorruptCheckpointError, ConfigError, InvalidNameError,
                                                   InvalidEpochError)


class StoreErrorBudget:
    """Tolerate failing polls for a bounded time: one store hiccup must not end a wait.

    A trigger that reported the first failed poll made its task fail, and the task's next
    try then cancelled the attempt the trigger was watching -- a healthy application
    stopped for a network blip. :meth:`tolerate` says whether to poll again: yes while the
    current run of failures has lasted less than ``tolerance_s``; never for
    :data:`LASTING_ERRORS`. :meth:`succeeded` ends a run of failures.
    """

    def __init__(self, tolerance_s: float = STORE_ERROR_TOLERANCE_S) -> None:
        self.tolerance_s = float(tolerance_s)
        self.failures = 0
        self._since: float | None = None

    def tolerate(self, exc: BaseException) -> bool:
        """Count a failed poll; True if the trigger should poll again."""
        if isinstance(exc, LASTING_ERRORS):
            return False
        now = time.monotonic()
        if self._since is None:
            self._since = now
        self.failures += 1
        return now - self._since < self.tolerance_s

    def succeeded(self) -> None:
        """A poll succeeded: the next failure starts a new run."""
        self._since = None
        self.failures = 0

    def describe(self) -> str:
        """``3 failed polls in 12s (tolerated for 300s)`` for log lines and the final error."""
        lasted = 0.0 if self._since is None else time.monotonic() - self._since
        return f"{self.failures} failed poll(s) in {lasted:.0f}s (tolerated for {self.tolerance_s:g}s)"
