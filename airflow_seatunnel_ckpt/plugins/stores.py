"""Which checkpoint stores the page shows: :mod:`airflow_seatunnel_ckpt.hooks.stores`, which the
recovery DAG's tasks use too (one discovery for both)."""

from airflow_seatunnel_ckpt.hooks.stores import (
    CONFIG_OPTION,
    CONFIG_SECTION,
    ConfiguredStore,
    UnknownStoreError,
    configured_stores,
    find_store,
)

__all__ = ["CONFIG_OPTION", "CONFIG_SECTION", "ConfiguredStore", "UnknownStoreError", "configured_stores",
           "find_store"]
