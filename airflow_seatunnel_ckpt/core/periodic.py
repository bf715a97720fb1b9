"""A daemon thread that calls one function every few seconds until it is stopped.

The lease of a running stage is renewed this way (:class:`~.protocol.lease.LeaseKeeper`),
and the stage's Spark progress is logged this way (``spark.progress.StageProgress``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Periodic:
    """Call ``tick`` every ``interval_s`` seconds from a daemon thread, from :meth:`start` until :meth:`stop`.

    The first call comes ``interval_s`` after the start. ``tick`` handles its own errors:
    whatever it raises ends the thread.

    :param name: the thread's name (shown in thread dumps).
    """

    def __init__(self, tick: Callable[[], object], interval_s: float, name: str) -> None:
        self.tick = tick
        self.interval_s = interval_s
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Periodic:
        """Start the thread; returns ``self``."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float) -> None:
        """Call ``tick`` no more, and wait up to ``timeout_s`` seconds for a call in progress to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()
