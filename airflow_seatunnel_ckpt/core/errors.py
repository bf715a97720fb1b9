"""The exception hierarchy of airflow-seatunnel-ckpt: a class per failure a caller handles differently."""

from __future__ import annotations


class CheckpointError(Exception):
    """Root of every error raised by this package.

    ``retryable`` False: a refusal a retry cannot change, so Airflow fails the task at once.
    """

    retryable: bool = True


class ConfigError(CheckpointError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""

    retryable = False


class InvalidNameError(CheckpointError, ValueError):
    """A pipeline, participant, source, sink or operator name is not a safe path segment."""

    retryable = False


class InvalidEpochError(CheckpointError, ValueError):
    """An epoch number is negative, not an integer or absurdly large."""

    retryable = False


class StorageError(CheckpointError):
    """The checkpoint store could not carry out an operation (I/O, permissions, network)."""


class AlreadyExistsError(StorageError):
    """A create-exclusive write found the path already present (someone else won)."""


class CorruptCheckpointError(CheckpointError):
    """A stored file failed its checksum, framing or structural checks (``path`` names it)."""

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

    retryable = False


class DecisionConflictError(CheckpointError):
    """The epoch's single decision record says the opposite of what was asked."""

    retryable = False


class NotPreparedError(CheckpointError):
    """A commit was requested but not every expected participant is prepared and verified."""


class PublishError(StorageError):
    """Publishing staged output failed part-way; the epoch stays COMMITTING for a retry."""


class RecoveryError(CheckpointError):
    """No safe restore point exists; the message says which file is damaged and the way out."""


class PipelineOwnershipError(CheckpointError):
    """A DAG tried to run a pipeline that another DAG owns (per the pipeline's descriptor)."""

    retryable = False


class SinkRefusedError(CheckpointError):
    """A sink's table refuses the epoch's staged output (a merge key twice, a column's type ...).

    Before the commit decision it aborts the epoch; after it, ``resolve --skip-sink`` is the way on.
    """

    retryable = False


class TableOwnershipError(SinkRefusedError):
    """A table sink's table belongs to another pipeline or store, or records epochs this store's log lacks."""


def retryable(exc: BaseException) -> bool:
    """Whether running the step again may succeed: False for this package's refusals, else True."""
    return getattr(exc, "retryable", True) if isinstance(exc, CheckpointError) else True
