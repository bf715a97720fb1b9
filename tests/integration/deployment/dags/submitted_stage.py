"""The stage of ``submitted_orders``: waits for a release marker, then stages its orders.

A single-file top-level module beside the DAG: the stage task ships it with ``--py-files``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def release_marker() -> Path:
    return Path(os.environ["SEATUNNEL_CKPT_EXAMPLE_DIR"]) / "submitted" / "release"


def wait_then_stage(ctx: Any, spark: Any) -> None:
    """Stage the new orders once the test released the stage (so it can act on it mid-run)."""
    deadline = time.monotonic() + 600
    while not release_marker().exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    ctx.sink("orders_out").write(ctx.source("orders").read())
