"""What a stage task does once Airflow terminated it (SIGTERM): Spark stopped, py4j kept quiet, one clear error (used by
``StageSubmitHook.on_kill`` for a stage run in-process)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

_log = logging.getLogger(__name__)


class StageTerminatedError(RuntimeError):
    """The stage task was terminated (SIGTERM) while its in-process Spark work ran; raised in place of what the
    interrupted Spark call raised (consequences whose tracebacks only bury it)."""


class _DropPy4JRecords(logging.Filter):
    """Drops log records written by py4j's code (it logs through the *root* logger too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}py4j{os.sep}" not in (record.pathname or "")


def quiet_py4j() -> None:
    """Silence py4j for the rest of this process (once the JVM goes, every call in flight logs a traceback): its loggers
    at CRITICAL, and its records dropped from the root logger, which it also writes through."""
    for name in ("py4j", "py4j.java_gateway", "py4j.clientserver"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    root = logging.getLogger()
    if not any(isinstance(f, _DropPy4JRecords) for f in root.filters):
        root.addFilter(_DropPy4JRecords())


def stop_local_spark(announce: Callable[[], None] | None = None, timeout_s: float = 20) -> bool:
    """Cancel the jobs of this process's Spark session and stop it (``announce`` first); False if there is none.

    Run in a thread: the SIGTERM handler interrupts the main thread inside a py4j call, whose connection it must not
    reuse. The JVM's log is turned off first (it reports each cancelled job as an error).
    """
    pyspark = sys.modules.get("pyspark")
    context = getattr(getattr(pyspark, "SparkContext", None), "_active_spark_context", None)
    if context is None:
        return False
    if announce is not None:
        announce()

    def stop() -> None:
        try:
            context.setLogLevel("OFF")
            context.cancelAllJobs()
            context.stop()
        except Exception as exc:  # the JVM may already be gone: nothing left to stop
            _log.debug("stopping the Spark session after SIGTERM: %s", exc)

    stopper = threading.Thread(target=stop, name="stage-on-kill", daemon=True)
    stopper.start()
    stopper.join(timeout=timeout_s)
    return True
