"""Storage: the handful of primitives the commit protocol needs, over any fsspec URL.

Shaped like fsspec: one interface (:mod:`.base`), one module per backend (:mod:`.local`,
:mod:`.memory`, :mod:`.object_store`), the backend registry and the conditional-create
probe (:mod:`.registry`) and placing staged files (:mod:`.publish`); the URL checks (no
password in a URL, names that stay inside the store) are part of the interface in
:mod:`.base`. docs/STORAGE.md has the guarantees of each backend.

Backends are registered by protocol name in the ``airflow_seatunnel_ckpt.storage``
entry-point group (the analogue of SeaTunnel's ``StateBackend`` service registration);
:func:`open_storage` picks one and probes the store.
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
