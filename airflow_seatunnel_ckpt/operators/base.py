"""The provider's task bases, by the name DAGs import them (defined in :mod:`..pipeline_task`)."""

from airflow_seatunnel_ckpt.pipeline_task import (
    PIPELINE_TEMPLATE_FIELDS,
    STORE_TEMPLATE_FIELDS,
    TERMINAL_RUN_STATES,
    BasePipelineOperator,
    BaseStoreOperator,
    ask_airflow_run_finished,
    refusals_fail_at_once,
)

__all__ = [
    "PIPELINE_TEMPLATE_FIELDS", "STORE_TEMPLATE_FIELDS", "TERMINAL_RUN_STATES", "BasePipelineOperator",
    "BaseStoreOperator", "ask_airflow_run_finished", "refusals_fail_at_once",
]
