"""The exception hierarchy of airflow-seatunnel-ckpt.

Every failure a caller must handle differently has its own class, and every message
names what was being done, where (path, epoch), what was expected, what was found and
what the user can do about it. Storage URLs in messages are always redacted.
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Root of every error raised by this package."""


class ConfigError(CheckpointError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class InvalidNameError(CheckpointError, ValueError):
    """A pipeline, participant, source, sink or operator name is not a safe path segment."""


class InvalidEpochError(CheckpointError, ValueError):
    """An epoch number is negative, not an integer or absurdly large."""


class StorageError(CheckpointError):
    """The checkpoint store could not carry out an operation (I/O, permissions, network)."""


class AlreadyExistsError(StorageError):
    """A create-exclusive write found the path already present (someone else won)."""


class CorruptCheckpointError(CheckpointError):
    """A stored file failed its checksum, framing or structural checks.

    ``path`` names the damaged file so an operator can inspect or remove it.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class IncompatibleFormatError(CorruptCheckpointError):
    """A stored file was written by a newer (or unknown) format version."""


class EpochNotFoundError(CheckpointError, LookupError):
    """The transaction log has no record of the requested epoch."""


class PendingEpochError(CheckpointError):
    """A new epoch cannot begin while an earlier one is still undecided."""

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch


class FencedAttemptError(CheckpointError):
    """A stale attempt tried to prepare over, or publish, the winning attempt's work."""


class DecisionConflictError(CheckpointError):
    """The epoch's single decision record says the opposite of what was asked."""


class NotPreparedError(CheckpointError):
    """A commit was requested but not every expected participant is prepared and verified."""


class PublishError(StorageError):
    """Publishing staged output failed part-way; the epoch stays COMMITTING for a retry."""


class TableOwnershipError(PublishError):
    """A table sink's table belongs to another pipeline or store, or records epochs this store's log lacks.

    Raised before anything is placed or committed; the message names both owners and the way out.
    """


class RecoveryError(CheckpointError):
    """No safe restore point exists; the message says which file is damaged and the way out."""


class PipelineOwnershipError(CheckpointError):
    """A DAG tried to run a pipeline that another DAG owns (per the pipeline's descriptor)."""
