"""The sink contract: what every sink (files, Iceberg, Delta, PostgreSQL) promises the protocol.

A sink module satisfies :class:`SinkConnector` (``precheck`` before the decision,
``commit`` after it, ``replace`` for a replay's, recovery's ``held_epoch``), each called
with one :class:`SinkCommit`; :mod:`core.sinks` wraps them with the refusal wording
(docs/ARCHITECTURE.md, decision 45, has the promises).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from airflow_seatunnel_ckpt.core import codec
from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.storage.base import Storage
from airflow_seatunnel_ckpt.core.storage.publish import DEFAULT_CONCURRENCY

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.models import PublishedSink, SinkManifest
    from airflow_seatunnel_ckpt.core.sinks.options import SinkOptionsBase


#: Called with a table sink's options before its commit; returns extra properties holding secrets
#: (:func:`core.sinks.register_secret_resolver` adds one).
SECRET_RESOLVERS: list[Callable[[Mapping[str, Any]], Mapping[str, Any]]] = []


def _nothing_committed(epoch: int) -> bool:
    return False


@dataclass(frozen=True)
class SinkCommit:
    """Everything one sink's precheck and commit need: which epoch, which files, from where, for whom."""

    pipeline: str
    #: The checkpoint store's URL without credentials (recorded in the target beside the epoch).
    store: str
    epoch: int
    sink: SinkManifest
    #: The checkpoint store: the staged files are ``<sink.staging>/<file.path>`` in it.
    staged: Storage
    #: Transient failures are retried this many times (with backoff) before raising.
    retries: int
    #: The store's id (:mod:`core.sinks.markers`), recorded in a table with the epoch. Empty:
    #: read from the store, the parent of ``staged``, when needed (:attr:`resolved_store_id`).
    store_id: str = ""
    #: Whether this pipeline's transaction log holds an epoch decided commit (the pipeline's
    #: answer, :meth:`Pipeline.holds_commit`): a target's marker at or above the epoch counts
    #: only then. Without it no other epoch counts as committed (a marker is refused).
    log_holds: Callable[[int], bool] = field(default=_nothing_committed, compare=False)
    #: fsspec options for opening ``sink.target_url`` as a store (a file sink's target).
    target_options: Mapping[str, Any] = field(default_factory=dict)
    #: Files checked and copied at once by a file sink's publish.
    concurrency: int = DEFAULT_CONCURRENCY

    @property
    def table(self) -> SinkOptionsBase:
        """The sink's typed options (a file sink's manifest names none: its target is all it needs)."""
        from airflow_seatunnel_ckpt.core.sinks.options import FileSinkOptions

        found: SinkOptionsBase | None = self.sink.table
        if found is not None:
            return found
        return FileSinkOptions.model_validate({"path": self.sink.target_url, "mode": self.sink.mode.value})

    @property
    def type(self) -> str:
        """The sink's type (a registered type's options without a model stay the stage's mapping)."""
        table: Any = self.table
        return str(table["type"] if isinstance(table, Mapping) else table.type)

    @functools.cached_property
    def resolved_store_id(self) -> str:
        """``store_id``, or the id of the store whose pipeline directory ``staged`` is (read once, when needed)."""
        if self.store_id:
            return self.store_id
        staged = self.staged
        return store_id(type(staged)(staged.url.rsplit("/", 1)[0], staged.storage_options))

    @property
    def replaces(self) -> tuple[int, ...]:
        """The epochs a replay's commit replaces (empty: not a replay)."""
        return self.sink.replaces

    @property
    def owner(self) -> dict[str, str]:
        """The store (its URL) and pipeline a file sink's owner marker names."""
        return {"store": self.store, "pipeline": self.pipeline}

    @property
    def where(self) -> str:
        """The pipeline, epoch and sink, for messages."""
        return f"pipeline {self.pipeline!r} epoch {self.epoch} sink {self.sink.sink!r}"

    def published(self, location: str, how: str) -> PublishedSink:
        """The committed record of this sink's epoch: where it landed (``location``) and how."""
        from airflow_seatunnel_ckpt.core.models import PublishedSink

        sink = self.sink
        return PublishedSink(sink.sink, redact_url(sink.target_url), location, len(sink.files), sink.rows, sink.bytes,
                             str(how))

    def secrets(self) -> dict[str, Any]:
        """Extra properties the registered resolvers add for this sink (credentials)."""
        out: dict[str, Any] = {}
        for resolve in SECRET_RESOLVERS:
            out.update(resolve(self.table.to_dict()))
        return out


# -- store id --------------------------------------------------------------------------------------
# A UUID naming one checkpoint store: its URL says where it is, not which store it is (a wiped
# and recreated store restarts at epoch 1 under the same URL). Created once with the store's
# put-if-absent primitive, framed and checksummed like every record.


#: The store id file, at the root of the store (beside the pipelines' directories).
STORE_ID = "_store_id"


def store_id(root: Storage) -> str:
    """The id of the store rooted at ``root``, created (create-exclusive) on first use.

    A URL says where a store is, not which store it is: a wiped and recreated store (an
    ephemeral ``$AIRFLOW_HOME``) keeps its URL and restarts its epochs at 1, a copied one keeps
    its epochs under a new URL. What the store writes outside itself (table markers) names it
    by this id.
    """
    try:
        data = root.read(STORE_ID)
    except FileNotFoundError:
        new = str(uuid.uuid4())
        payload = {"store_id": new, "created_at": time.time(), "url": redact_url(root.url)}
        try:
            root.create_exclusive(STORE_ID, codec.encode_json(payload))
            return new
        except AlreadyExistsError:  # a concurrent first user won: its id is the store's
            data = root.read(STORE_ID)
    where = root.describe_path(STORE_ID)
    record = codec.decode_json(data, where)
    found = record.get("store_id") if isinstance(record, dict) else None
    try:
        return str(uuid.UUID(str(found)))
    except ValueError:
        raise CorruptCheckpointError(
            f"{where}: the store id is {found!r}, not a UUID. Restore the file from a backup of the store; "
            "only if none exists, delete it (a new id is created, and every table this store wrote must then "
            "be handed over to it, see docs/tables)", where) from None


class SinkConnector(Protocol):
    """One sink type: a module :data:`core.sinks.CONNECTORS` names (see the module docs)."""

    def precheck(self, request: SinkCommit) -> None:
        """Refuse (SinkRefusedError, ConfigError) an epoch the target would refuse; before the decision."""

    def commit(self, request: SinkCommit) -> PublishedSink:
        """Make the epoch's staged output visible in the target once."""

    def replace(self, request: SinkCommit) -> PublishedSink:
        """A replay's commit: its staged output in place of the replaced epochs' (``request.replaces``), once."""

    def held_epoch(self, request: SinkCommit) -> int | None:
        """Recovery's view: the newest epoch of this pipeline's sink the target holds (None: none); reads only."""
