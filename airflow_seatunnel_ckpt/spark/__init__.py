"""The PySpark stage runtime: sources, keyed state on executors, staged sinks.

A stage is a plain function ``stage(ctx, spark)``; :func:`run_stage` does the rest (epoch, restore, input plan,
checkpoint parts, sink manifests, prepared record)::

    def dedup_orders(ctx: StageContext, spark: SparkSession) -> None:
        new = ctx.source("orders").read()                              # only unconsumed input
        fresh = ctx.key_set("seen_orders").dedup(new, key="order_id")  # keyed state
        ctx.sink("orders_table").write(fresh)                          # attempt staging

Run it in-process or on any master with :func:`submit_stage` (Airflow's ``SparkSubmitHook``, in
:mod:`airflow_seatunnel_ckpt.hooks.spark_submit`; nothing else here imports Airflow).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.spark.context import BoundSource, StageContext
    from airflow_seatunnel_ckpt.spark.registry import register_sink, register_source
    from airflow_seatunnel_ckpt.spark.runner import StageFunction, load_stage_function, run_stage
    from airflow_seatunnel_ckpt.spark.sinks.base import Sink, SinkError
    from airflow_seatunnel_ckpt.spark.sinks.files import FileSink
    from airflow_seatunnel_ckpt.spark.sources.base import Source, SourceError
    from airflow_seatunnel_ckpt.spark.sources.files import FileSource
    from airflow_seatunnel_ckpt.spark.spec import DEFAULT_KEY_GROUPS, StageResult, StageSpec
    from airflow_seatunnel_ckpt.spark.state import KeySet, KeyValueState, StateError

#: Public name -> module that defines it. Imported on first use, so that importing a
#: light module of this package (the option registries, the spec, the checks a DAG runs
#: when it is parsed) does not import PySpark.
_EXPORTS = {
    "BoundSource": "context",
    "StageContext": "context",
    "StageFunction": "runner",
    "load_stage_function": "runner",
    "run_stage": "runner",
    "FileSink": "sinks.files",
    "Sink": "sinks.base",
    "SinkError": "sinks.base",
    "register_sink": "registry",
    "FileSource": "sources.files",
    "Source": "sources.base",
    "SourceError": "sources.base",
    "register_source": "registry",
    "DEFAULT_KEY_GROUPS": "spec",
    "StageResult": "spec",
    "StageSpec": "spec",
    "KeySet": "state",
    "KeyValueState": "state",
    "StateError": "state",
    "submit_stage": "airflow_seatunnel_ckpt.hooks.spark_submit",  # Airflow's SparkSubmitHook: not in spark/
}

__all__ = [
    "DEFAULT_KEY_GROUPS", "BoundSource", "FileSink", "FileSource", "KeySet", "KeyValueState", "Sink", "SinkError",
    "Source", "SourceError", "StageContext", "StageFunction", "StageResult", "StageSpec", "StateError",
    "load_stage_function", "register_sink", "register_source", "run_stage", "submit_stage",
]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    full = module if module.startswith("airflow_seatunnel_ckpt.") else f"{__name__}.{module}"
    value = getattr(importlib.import_module(full), name)
    globals()[name] = value
    return value
