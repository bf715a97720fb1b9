"""What a stage task does once Airflow terminated it (SIGTERM): py4j kept quiet, one clear error.

Used by :meth:`SparkStageOperator.on_kill <airflow_seatunnel_ckpt.operators.stage.SparkStageOperator.on_kill>`.
"""

from __future__ import annotations

import logging
import os


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
