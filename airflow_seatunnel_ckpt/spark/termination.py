"""What a stage task does once Airflow terminated it (SIGTERM): Spark stopped, py4j kept quiet, one clear error.

Used by :meth:`StageSubmitHook.on_kill <airflow_seatunnel_ckpt.hooks.stage_submit.StageSubmitHook.on_kill>`
for a stage run in-process.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

_log = logging.getLogger(__name__)


class StageTerminatedError(RuntimeError):
    """The stage task was terminated (SIGTERM) while its in-process Spark work ran.

    Raised in place of whatever the interrupted Spark call raised once ``on_kill`` had
    stopped the session (a cancelled job, a JVM gone under a py4j call): those are
    consequences of the termination, and their chained tracebacks only bury it.
    """


class _DropPy4JRecords(logging.Filter):
    """Drops log records written by py4j's code (it logs through the *root* logger too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}py4j{os.sep}" not in (record.pathname or "")


def quiet_py4j() -> None:
    """Silence py4j for the rest of this process: once the JVM goes away, every py4j call in
    flight logs a broken-pipe, connection-refused or empty-answer traceback.

    py4j writes them through its own loggers and through the root logger
    (``logging.info("Exception while sending command.", exc_info=True)``), so its loggers
    are raised to CRITICAL and the root logger drops records whose code is py4j's.
    """
    for name in ("py4j", "py4j.java_gateway", "py4j.clientserver"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    root = logging.getLogger()
    if not any(isinstance(f, _DropPy4JRecords) for f in root.filters):
        root.addFilter(_DropPy4JRecords())


def stop_local_spark(announce: Callable[[], None] | None = None, timeout_s: float = 20) -> bool:
    """Cancel the jobs of this process's Spark session and stop it; False if there is none.

    ``announce`` is called first, when there is a session to stop (to say so in the task log).

    Run in a thread: the SIGTERM handler that calls it interrupts the main thread in the
    middle of a py4j call, whose connection it must not reuse. The JVM's log is turned off
    first: it reports each cancelled job (and, when it got the signal too, its own shutdown
    racing the running tasks) as an error with a stack trace.
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
