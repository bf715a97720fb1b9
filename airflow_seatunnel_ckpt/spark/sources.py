"""Sources: what input an epoch consumes (offsets) and how to read it (a DataFrame).

A source is two steps, split so that the runner can log the first before doing the second:

* :meth:`Source.plan` -- given every committed epoch's offsets, decide this epoch's
  offsets: plain JSON data. The runner fixes them for the epoch (every retry reads the
  same input) and records them in the prepared record, the write-ahead log.
* :meth:`Source.read` -- turn those offsets into a DataFrame.

:class:`FileSource` is the reference implementation: its offsets are the files an epoch
reads, so each epoch reads exactly the files no committed epoch consumed, and files that
arrive late land in a later epoch. A Kafka-like source would plan ``{partition: (from,
to)}`` ranges from the last committed end offsets and read them with Spark's batch
reader; register it with :func:`register_source`.
"""

from __future__ import annotations

import posixpath
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError
from airflow_seatunnel_ckpt.spark.locations import fsspec_url, hadoop_path
from airflow_seatunnel_ckpt.spark.registry import Registry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Formats Spark reads and writes without extra packages.
FILE_FORMATS = ("parquet", "json", "csv", "orc")


class SourceError(CheckpointError):
    """A source cannot plan or read its input (missing path, unreadable file, no schema)."""


class Source(ABC):
    """Input of a stage: offsets in, DataFrame out.

    A new kind of source implements two methods and registers a type name, in the module
    of the stage function (the runner imports it before it builds the sources)::

        class KafkaSource(Source):
            def __init__(self, name, topic, servers):
                super().__init__(name)
                self.topic, self.servers = topic, servers

            def plan(self, history):
                # Resume where the last committed epoch that read the topic stopped.
                ends = [e["offsets"]["end"] for e in history if e["offsets"]]
                start = ends[-1] if ends else "earliest"
                return {"start": start, "end": latest_offsets(self.servers, self.topic)}

            def read(self, spark, offsets):
                return (spark.read.format("kafka")
                        .option("kafka.bootstrap.servers", self.servers)
                        .option("subscribe", self.topic)
                        .option("startingOffsets", json.dumps(offsets["start"]))
                        .option("endingOffsets", json.dumps(offsets["end"])).load())

        register_source("kafka", KafkaSource)  # spec: {"type": "kafka", "topic": ..., ...}

    ``plan`` must be a pure function of the committed history and the outside world;
    its result is stored before the stage runs, so a retry of the epoch reads the same
    range even if more input arrived. An epoch whose stage did not read the source
    records ``{}`` for it.

    :param name: the source's name in the stage spec (and in the checkpoint).
    """

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """This epoch's offsets, given ``history``: the offsets of every committed epoch,
        oldest first, as ``[{"epoch": e, "offsets": {...}}, ...]``. Must be JSON data."""

    @abstractmethod
    def read(self, spark: SparkSession, offsets: Mapping[str, Any]) -> DataFrame:
        """The input the planned ``offsets`` describe, as a DataFrame."""


class FileSource(Source):
    """Files below a directory (any fsspec URL), read by Spark as parquet/json/csv/orc.

    Options (the stage spec's ``sources.<name>`` mapping):

    * ``path`` (required): directory URL, e.g. ``file:///data/in`` or ``s3://bucket/in``;
    * ``format``: ``parquet`` (default), ``json``, ``csv`` or ``orc``;
    * ``options``: reader options passed to Spark untouched (``{"header": "true"}``);
    * ``schema``: DDL schema string (recommended for json/csv; also used for an epoch
      without new files);
    * ``max_files_per_epoch``: read at most this many new files (oldest names first);
    * ``storage_options``: fsspec options used to list the directory.

    Files and directories whose name starts with ``_`` or ``.`` are ignored (``_SUCCESS``,
    ``.crc``, in-progress uploads), as Spark does.
    """

    def __init__(
        self,
        name: str,
        path: str,
        format: str = "parquet",
        options: Mapping[str, Any] | None = None,
        schema: str | None = None,
        max_files_per_epoch: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name)
        if format not in FILE_FORMATS:
            raise ConfigError(
                f"file source {name!r}: format must be one of {FILE_FORMATS}, got {format!r}"
            )
        if max_files_per_epoch is not None and (
            not isinstance(max_files_per_epoch, int) or max_files_per_epoch < 1
        ):
            raise ConfigError(
                f"file source {name!r}: max_files_per_epoch must be a positive integer"
            )
        self.url = fsspec_url(path).rstrip("/")
        self.format = format
        self.options = {k: str(v) for k, v in (options or {}).items()}
        self.schema = schema
        self.max_files_per_epoch = max_files_per_epoch
        self.storage_options = dict(storage_options or {})

    def list_files(self) -> list[str]:
        """Every data file below the directory, relative to it, sorted."""
        from fsspec.core import url_to_fs

        try:
            fs, root = url_to_fs(self.url, **self.storage_options)
            found = fs.find(root, detail=False)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise SourceError(f"file source {self.name!r}: cannot list {self.url}: {exc}") from exc
        root = root.rstrip("/") + "/"
        out = []
        for full in found:
            rel = (
                str(full)[len(root) :]
                if str(full).startswith(root)
                else posixpath.basename(str(full))
            )
            if rel and not any(seg.startswith(("_", ".")) for seg in rel.split("/")):
                out.append(rel)
        return sorted(out)

    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The files below the directory that no committed epoch consumed."""
        consumed: set[str] = set()
        for entry in history:
            files = entry.get("offsets", {}).get("files", [])
            if not isinstance(files, list):
                raise SourceError(
                    f"file source {self.name!r}: committed offsets of epoch {entry.get('epoch')} "
                    f"have no file list: {entry!r}"
                )
            consumed.update(files)
        new = [f for f in self.list_files() if f not in consumed]
        if self.max_files_per_epoch is not None:
            new = new[: self.max_files_per_epoch]
        return {"files": new}

    def read(self, spark: SparkSession, offsets: Mapping[str, Any]) -> DataFrame:
        """Read exactly the planned files (an empty DataFrame if there are none)."""
        files = list(offsets.get("files", []))
        reader = spark.read.format(self.format).options(**self.options)
        if self.schema:
            reader = reader.schema(self.schema)
        if files:
            return reader.load([hadoop_path(f"{self.url}/{f}") for f in files])
        if self.schema:
            return spark.createDataFrame([], self.schema)
        # No new file and no declared schema: borrow the schema of any existing file.
        existing = self.list_files()
        if not existing:
            raise SourceError(
                f"file source {self.name!r}: {self.url} has no files and no 'schema' option, "
                "so the empty "
                "input of this epoch has no columns; declare the schema in the source options"
            )
        return reader.load(hadoop_path(f"{self.url}/{existing[-1]}")).limit(0)


#: Source type name -> factory(name, **options).
_TYPES: Registry[Source] = Registry("source", {"file": FileSource})


def register_source(type_name: str, factory: Callable[..., Source]) -> None:
    """Make ``{"type": type_name, ...}`` in a stage spec build a source as ``factory(name, **options)``."""
    _TYPES.register(type_name, factory)


def source_from_options(name: str, options: Mapping[str, Any]) -> Source:
    """Build the source a stage spec describes."""
    return _TYPES.build(name, options)
