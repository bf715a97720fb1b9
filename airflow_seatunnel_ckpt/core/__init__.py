"""The checkpoint core, without Airflow or PySpark: storage, state, the transaction log, two-phase
commit, recovery and retention. Start at :class:`CheckpointStore`."""

from airflow_seatunnel_ckpt.core import errors, models
from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.models import *  # noqa: F403 -- the record types, as models.__all__ names them
from airflow_seatunnel_ckpt.core.ops.retention import RetentionReport
from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline
from airflow_seatunnel_ckpt.core.protocol.recovery import RecoveryReport, RecoveryStep
from airflow_seatunnel_ckpt.core.protocol.restore import RestorePoint, RestoreSource
from airflow_seatunnel_ckpt.core.protocol.txlog import TransactionLog
from airflow_seatunnel_ckpt.core.state.checkpoint import CheckpointManager, Problem
from airflow_seatunnel_ckpt.core.storage import FileInfo, Storage, open_storage
from airflow_seatunnel_ckpt.core.store import CheckpointStore, StoredPipeline

__all__ = [
    "CheckpointConfig", "CheckpointManager", "CheckpointStore", "FileInfo", "Pipeline", "Problem", "RecoveryReport",
    "RecoveryStep", "RestorePoint", "RestoreSource", "RetentionReport", "Storage", "StoredPipeline", "TransactionLog",
    "errors", "open_storage",
]
__all__ += models.__all__
