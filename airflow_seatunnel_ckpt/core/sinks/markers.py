"""What a table records of who writes it: its owner, and each sink's last committed epoch.

Iceberg keeps both in table properties, Delta its owner in the file sink's owner marker
and the epoch as an application transaction, PostgreSQL in its bookkeeping tables.
:func:`check_marker` is the one judgement of a marker (docs/tables/iceberg.md,
docs/tables/delta.md and docs/POSTGRES.md describe each format's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, SinkRefusedError, TableOwnershipError
from airflow_seatunnel_ckpt.core.sinks.base import SinkCommit
from airflow_seatunnel_ckpt.core.sinks.files import OWNER_MARKER
from airflow_seatunnel_ckpt.core.sinks.options import DeltaSinkOptions, PostgresSinkOptions
from airflow_seatunnel_ckpt.core.storage import Storage


def short(store: str) -> str:
    """The first 12 hex digits of a store id: enough to keep names of two stores apart."""
    return store.replace("-", "")[:12]


#: Prefix of every table property, snapshot summary key and application id written here.
PREFIX = "seatunnel-ckpt"
#: ``<pipeline>@<store id>`` of the table's owner; "" or absent: nobody owns the table.
OWNER = f"{PREFIX}.owner"
#: The owner store's URL (credentials redacted), for messages only.
OWNER_STORE = f"{PREFIX}.owner-store"


@dataclass(frozen=True)
class Owner:
    """The store and pipeline a table belongs to."""

    store_id: str
    pipeline: str
    store: str = ""

    @property
    def value(self) -> str:
        """The ``seatunnel-ckpt.owner`` property value."""
        return f"{self.pipeline}@{self.store_id}"

    def to_json(self) -> bytes:
        """The owner marker file's content (Delta tables)."""
        return json.dumps({"pipeline": self.pipeline, "store": self.store, "store_id": self.store_id},
                          indent=1, sort_keys=True).encode()

    @classmethod
    def parse(cls, properties: Mapping[str, str]) -> Owner | None:
        """The owner Iceberg table properties name, or None for an unowned (or released) table."""
        value = properties.get(OWNER) or ""
        pipeline, at, found = value.rpartition("@")
        if not value:
            return None
        if not at:  # not ours to parse: compare it whole, it never equals an owner we write
            return cls(value, "", properties.get(OWNER_STORE, ""))
        return cls(found, pipeline, properties.get(OWNER_STORE, ""))

    def describe(self) -> str:
        return f"pipeline {self.pipeline!r} of store {self.store_id} ({self.store or 'URL unknown'})"


@dataclass(frozen=True)
class Marker:
    """One sink's last committed epoch as the table records it."""

    store_id: str
    pipeline: str
    sink: str
    epoch: int


def read_owner_file(table_root: Storage, where: str) -> Owner | None:
    """The owner the marker file at a (Delta) table's root names, or None if there is none."""
    try:
        found = json.loads(table_root.read(OWNER_MARKER))
        if not isinstance(found, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise TableOwnershipError(
            f"{where}: the table's owner marker {table_root.describe_path(OWNER_MARKER)} is not valid JSON ({exc}); "
            "check which pipeline writes the table, then delete the marker and commit again") from None
    return Owner(str(found.get("store_id") or ""), str(found.get("pipeline") or ""), str(found.get("store") or ""))


def claim_owner_file(table_root: Storage, request: SinkCommit, where: str) -> None:
    """Create the owner marker at a (Delta) table's root; refuse if another owner's won meanwhile."""
    try:
        table_root.create_exclusive(OWNER_MARKER, owner_for(request).to_json())
    except AlreadyExistsError:  # a racing committer claimed it first: it must be this owner
        check_owner(request, read_owner_file(table_root, where), where)


def owner_for(request: SinkCommit) -> Owner:
    """This request's pipeline and store as a table owner."""
    return Owner(request.resolved_store_id, request.pipeline, request.store)


def marker_keys(pipeline: str, sink: str) -> dict[str, str]:
    """The Iceberg table properties of one sink's marker, by field (epoch, store-id, store)."""
    return {field: f"{PREFIX}.{pipeline}.{sink}.{field}" for field in ("epoch", "store-id", "store")}


def marker_for(request: SinkCommit) -> dict[str, str]:
    """The Iceberg table properties a commit of ``request`` sets: its marker and the owner."""
    keys, owner = marker_keys(request.pipeline, request.sink.sink), owner_for(request)
    return {keys["epoch"]: str(request.epoch), keys["store-id"]: owner.store_id, keys["store"]: request.store,
            OWNER: owner.value, OWNER_STORE: owner.store}


def iceberg_marker(properties: Mapping[str, str], request: SinkCommit, where: str) -> Marker | None:
    """This sink's marker among an Iceberg table's properties (None: never committed)."""
    keys = marker_keys(request.pipeline, request.sink.sink)
    value = properties.get(keys["epoch"])
    if value is None:
        return None
    try:
        epoch = int(value)
    except ValueError:
        raise TableOwnershipError(
            f"{where}: table property {keys['epoch']} is {value!r}, not an epoch number; set it to the last "
            "epoch committed into the table (see the snapshot summaries) and commit again") from None
    return Marker(properties.get(keys["store-id"], ""), request.pipeline, request.sink.sink, epoch)


def delta_app_id(request: SinkCommit) -> str:
    """The Delta application id of this request's store, pipeline and sink."""
    return f"{PREFIX}/{request.resolved_store_id}/{request.pipeline}/{request.sink.sink}"


def placement(request: SinkCommit) -> str:
    """The part of a placed file's path that names its epoch: ``<pipeline>/<sink>/<store>-e<epoch>``.

    Unique per (store, pipeline, sink, epoch): names hold no ``/``, and the store's short id
    keeps a handed-over table's new epochs off the previous owner's files.
    """
    return f"{request.pipeline}/{request.sink.sink}/{short(request.resolved_store_id)}-e{request.epoch}"


def placed_epoch(path: str, request: SinkCommit) -> int | None:
    """The epoch of this store's pipeline and sink that placed the data file ``path`` (None: not ours).

    The inverse of :func:`placement` (Iceberg: ``.../<placement>/<file>``, Delta: ``.../<placement>-<n>.parquet``).
    """
    prefix = f"/{request.pipeline}/{request.sink.sink}/{short(request.resolved_store_id)}-e"
    at = ("/" + path).rfind(prefix)
    if at < 0:
        return None
    digits = ("/" + path)[at + len(prefix):]
    end = next((i for i, c in enumerate(digits) if not c.isdigit()), len(digits))
    return int(digits[:end]) if 0 < end < len(digits) and digits[end] in "/-" else None


def _recorded_in(request: SinkCommit) -> tuple[str, str]:
    """Where the table records its owner, and how to release it (for messages)."""
    options = request.table
    if isinstance(options, DeltaSinkOptions):
        uri = (options.path or request.sink.target_url).rstrip("/")
        return f"owner marker {uri}/{OWNER_MARKER}", f"delete its owner marker {uri}/{OWNER_MARKER}"
    if isinstance(options, PostgresSinkOptions):
        table = options.table
        owners = f"{table.rpartition('.')[0] or 'public'}.seatunnel_ckpt_owners"
        return f"owner row in {owners}", f"delete its row: DELETE FROM {owners} WHERE target_table = '{table}'"
    return f"table property {OWNER}", (
        f"remove its table property {OWNER}, e.g. with pyiceberg: catalog.load_table("
        f"{getattr(options, 'table', '')!r}).transaction().remove_properties({OWNER!r}).commit_transaction()")


def check_owner(request: SinkCommit, found: Owner | None, where: str) -> None:
    """TableOwnershipError if the table is owned by another pipeline or another store."""
    mine = owner_for(request)
    if found is None or (found.store_id, found.pipeline) == (mine.store_id, mine.pipeline):
        return
    if found.store_id == mine.store_id:
        why = "another pipeline of this store writes it"
    elif found.store and found.store == mine.store:
        why = ("the store at this URL was wiped and recreated since (a new store id), so its epochs restarted "
               "and are not the table's")
    else:
        why = "another checkpoint store writes it, and the epochs of two stores are unrelated"
    recorded, release = _recorded_in(request)
    raise TableOwnershipError(
        f"{where}: the table belongs to {found.describe()} ({recorded}), not to {mine.describe()}: {why}. "
        f"Nothing was committed. Give this sink its own table; or, if the table was deliberately handed over "
        f"(the store was recreated or moved, another pipeline takes over), {release}, and commit again: the "
        "next commit claims it")


def check_marker(request: SinkCommit, owner: Owner | None, marker: Marker | None, where: str, *,
                 decided: bool) -> int | None:
    """The epoch the table holds for this store's pipeline and sink (None: none), or a refusal.

    ``decided``: the request's epoch is decided commit (the commit path). Another store's
    marker counts only while that store owns the table (then it is refused); one of this
    store at or above the epoch only if this pipeline's log holds it decided commit.
    """
    check_owner(request, owner, where)
    if marker is None:
        return None
    mine = request.resolved_store_id
    if marker.store_id != mine:
        return None  # the previous owner's, before the table was handed over: not this store's epochs
    # The log is the pipeline's to read: the request carries its answer (log_holds), asked only when needed.
    if marker.epoch >= request.epoch and not (
            (decided and marker.epoch == request.epoch) or request.log_holds(marker.epoch)):
        raise TableOwnershipError(
            f"{where}: the table records epoch {marker.epoch} of this pipeline's sink as committed by this store "
            f"({mine}, {request.store}), but the store's log of pipeline {request.pipeline!r} has no commit "
            f"decision for epoch {marker.epoch}: the pipeline was removed and started again, so its epochs are "
            f"not the table's. Nothing was committed; treating epoch {request.epoch} as already in the table would "
            "lose its rows. Give this sink its own table, or rename the pipeline or the sink")
    return marker.epoch


def refuse_past(request: SinkCommit, newest: int | None, marker: str, where: str) -> None:
    """Before the decision: SinkRefusedError if the table's ``marker`` (named for the message) of this
    store's pipeline's sink, at epoch ``newest`` (:func:`check_marker`), is past the request's epoch."""
    if newest is not None and newest > request.epoch:
        raise SinkRefusedError(
            f"{where}: {marker} is at epoch {newest}, beyond this epoch, and this store commits its epochs in "
            "order. Nothing was committed. Give this sink its own table, or rename the pipeline or the sink")


def delta_marker(table: Any, request: SinkCommit) -> Marker | None:
    """This store's, pipeline's and sink's application transaction in a Delta table."""
    version = table.transaction_version(delta_app_id(request))
    return None if version is None else Marker(request.resolved_store_id, request.pipeline, request.sink.sink, version)
