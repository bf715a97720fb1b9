"""The store id: a UUID naming one checkpoint store, written once at the store's root.

A store's URL says where it is, not which store it is: a wiped and recreated store (an
ephemeral ``$AIRFLOW_HOME``) has the same URL and restarts its epochs at 1, and a store
copied elsewhere keeps its epochs under a new URL. Whatever the store writes outside
itself (the markers of table sinks, :mod:`core.tables.markers`) names it by this id.

``<store>/_store_id`` is created by the first caller that needs it, with the store's
put-if-absent primitive (of concurrent first callers exactly one wins and every caller
returns the winner's id), and only read thereafter. It is framed and checksummed like
every record; pipelines are never named with a leading ``_``, so it shares no name.
"""

from __future__ import annotations

import time
import uuid

from airflow_seatunnel_ckpt.core import codec
from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.storage import Storage

#: The store id file, at the root of the store (beside the pipelines' directories).
STORE_ID = "_store_id"


def store_id(root: Storage) -> str:
    """The id of the store rooted at ``root``, created (create-exclusive) on first use."""
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


def short(store: str) -> str:
    """The first 12 hex digits of a store id: enough to keep names of two stores apart."""
    return store.replace("-", "")[:12]
