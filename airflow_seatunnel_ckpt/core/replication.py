"""The secondary replica of committed checkpoints (``secondary_url``).

After publishing, the commit copies the epoch's checkpoint to the secondary store,
``_metadata`` last as on the primary; restore falls back to the replica when the
primary checkpoint does not verify.
"""

from __future__ import annotations

import contextlib

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.storage import Storage, copy_file, open_storage


def secondary_storage(config: CheckpointConfig, pipeline: str) -> Storage | None:
    """The pipeline's directory in the secondary store, or None when none is configured."""
    if not config.secondary_url:
        return None
    return open_storage(config.secondary_url, config.storage_options).child(pipeline)


def replicate(primary: Storage, secondary: Storage, epoch: int) -> None:
    """Copy checkpoint ``epoch`` to ``secondary``; files already there with their size are kept."""
    root = layout.checkpoint_dir(epoch)
    # ``_metadata`` last, as on the primary: a crash mid-copy must not leave a replica
    # checkpoint that claims to be complete while parts are missing.
    for f in sorted(primary.walk(root), key=lambda f: f.path == layout.METADATA):
        path = f"{root}/{f.path}"
        with contextlib.suppress(FileNotFoundError):
            if secondary.size(path) == f.size:
                continue
        copy_file(primary, path, secondary, path)
