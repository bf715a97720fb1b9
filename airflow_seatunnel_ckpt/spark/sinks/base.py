"""The Spark-side sink interface: a stage's output, written into its attempt's staging below
``_staging/epoch=<e>/attempt=<a>/<sink>/`` and published by the commit (:mod:`core.sinks.base`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError
from airflow_seatunnel_ckpt.core.models import ExpectationResult, SinkMode
from airflow_seatunnel_ckpt.core.protocol.expectations import Expectation
from airflow_seatunnel_ckpt.core.sinks.options import SinkOptionsBase

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class SinkError(CheckpointError):
    """A sink was used wrongly (written twice in one stage, unknown format, ...)."""


class Sink:
    """Output of a stage (``name`` in the spec), bound to the attempt's staging directory; the commit publishes it to
    ``target_url``."""

    format = "parquet"
    #: A table sink's typed options for the commit (``SinkManifest.table``); None for files.
    table: SinkOptionsBase | None = None

    def __init__(self, name: str, target_url: str, mode: str | SinkMode = SinkMode.APPEND) -> None:
        self.name = name
        self.target_url = target_url
        self.staging_url: str | None = None
        #: fsspec options of the store holding the staging (for executors writing it).
        self.staging_options: dict[str, Any] = {}
        self.rows: int | None = None
        #: Data-quality rules on the rows written (the ``expectations`` option), their
        #: measured counts once written, and the sink taking the quarantined rows (bound
        #: by the runner when a rule quarantines).
        self.expectations: tuple[Expectation, ...] = ()
        self.expectation_results: tuple[ExpectationResult, ...] = ()
        self.quarantine: Sink | None = None
        try:
            self.mode = SinkMode(mode)
        except ValueError:
            raise ConfigError(
                f"sink {name!r}: mode must be one of {[m.value for m in SinkMode]}, got {mode!r}; "
                "'append' adds each epoch's rows beside the earlier epochs', 'upsert' replaces the rows with "
                "the same merge_keys, 'snapshot' replaces the whole content with each epoch's rows"
            ) from None

    def bind(self, staging_url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        """Called by the runner: stage into ``staging_url`` (opened with ``storage_options``)."""
        self.staging_url = staging_url
        self.staging_options = dict(storage_options or {})

    @property
    def written(self) -> bool:
        """Whether the stage wrote this sink."""
        return self.rows is not None

    def write(self, df: DataFrame) -> int:
        """Stage ``df``; returns the number of rows written."""
        raise NotImplementedError

    def quarantine_options(self) -> dict[str, Any] | None:
        """The options of the sink taking this sink's quarantined rows (None: it has none)."""
        return None
