"""The stage of ``connect_orders``: the example's, where no Java can be started."""

from __future__ import annotations

import os
import shutil
from typing import Any

from orders_example import dedup_orders


def dedup_without_java(ctx: Any, spark: Any) -> None:
    """The example's :func:`~orders_example.dedup_orders`, refusing to run where a JVM could start."""
    if "JAVA_HOME" in os.environ or shutil.which("java"):
        raise RuntimeError(f"this worker can start Java (JAVA_HOME={os.environ.get('JAVA_HOME')!r}, "
                           f"java={shutil.which('java')!r}): the Connect stage must run without it")
    if type(spark).__module__ != "pyspark.sql.connect.session":
        raise RuntimeError(f"the stage was given a {type(spark).__module__} session, not a Spark Connect one")
    dedup_orders(ctx, spark)
