"""Storage: the handful of primitives the commit protocol needs, over any fsspec URL.

The interface (:mod:`.base`), one module per backend, the backend registry with the
conditional-create probe (:mod:`.registry`) and publishing (:mod:`.publish`); see
docs/STORAGE.md.
"""

from airflow_seatunnel_ckpt.core.storage import base
from airflow_seatunnel_ckpt.core.storage.base import *  # noqa: F403 -- the interface, as base.__all__ names it
from airflow_seatunnel_ckpt.core.storage.local import LocalStorage
from airflow_seatunnel_ckpt.core.storage.memory import MemoryStorage
from airflow_seatunnel_ckpt.core.storage.object_store import ObjectStorage
from airflow_seatunnel_ckpt.core.storage.publish import PublishMethod, copy_file, publish_files
from airflow_seatunnel_ckpt.core.storage.registry import ENTRY_POINT_GROUP, backend_for, open_storage

__all__ = [
    "ENTRY_POINT_GROUP", "LocalStorage", "MemoryStorage", "ObjectStorage", "PublishMethod",
    "backend_for", "copy_file", "open_storage", "publish_files",
]
__all__ += base.__all__
