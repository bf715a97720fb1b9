"""The checkpoint-store connection type and its hook.

A connection of type ``seatunnel_ckpt`` names one checkpoint store: the fsspec URL of its
root plus the storage options (credentials, endpoint) and any other
:class:`~airflow_seatunnel_ckpt.core.CheckpointConfig` field, all kept in the connection
extras::

    AIRFLOW_CONN_ORDERS_STORE='{"conn_type": "seatunnel_ckpt",
        "extra": {"storage_url": "s3://lake/ckpt",
                  "storage_options": {"client_kwargs": {"endpoint_url": "http://minio:9000"}},
                  "prepared_timeout_s": 1800}}'

``login`` / ``password`` fill the ``key`` / ``secret`` storage options (the names s3fs uses)
when the extras do not set them. Without any connection the hook falls back to the local
default store of :func:`~airflow_seatunnel_ckpt.core.config.default_storage_url`, the same
way the Spark provider falls back to ``local[*]``.

Storage options are secrets: nothing here logs them, and URLs are logged redacted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore
from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import ConfigError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import EpochState

if TYPE_CHECKING:
    from airflow.sdk import Connection

    from airflow_seatunnel_ckpt.core import Pipeline

#: The ``conn_type`` of checkpoint-store connections.
CONN_TYPE = "seatunnel_ckpt"


def config_from_connection(
    conn: Connection | None,
    storage_url: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> CheckpointConfig:
    """Build the checkpoint configuration from a connection, an explicit URL and overrides.

    Precedence, lowest first: built-in defaults, the connection (``host`` as URL,
    ``login``/``password`` as ``key``/``secret``, then every key of the extras), the
    ``storage_url`` argument, then ``overrides``. Validation happens once, in
    :meth:`CheckpointConfig.from_mapping`, so a bad value fails with the field's name.
    """
    values: dict[str, Any] = {}
    if conn is not None:
        if conn.conn_type and conn.conn_type != CONN_TYPE:
            raise ConfigError(
                f"connection {conn.conn_id!r} has type {conn.conn_type!r}; a checkpoint store "
                f"needs a connection of type {CONN_TYPE!r}"
            )
        extra = conn.extra_dejson
        if not isinstance(extra, Mapping):
            raise ConfigError(f"connection {conn.conn_id!r}: extras must be a JSON object")
        values.update(extra)
        if "storage_url" not in values and conn.host:
            values["storage_url"] = conn.host
        options = dict(values.get("storage_options") or {})
        if conn.login and "key" not in options:
            options["key"] = conn.login
        if conn.password and "secret" not in options:
            options["secret"] = conn.password
        if options:
            values["storage_options"] = options
    if storage_url:
        values["storage_url"] = storage_url
    values.update(overrides or {})
    return CheckpointConfig.from_mapping(values)


@dataclass(frozen=True)
class PreparedCheck:
    """What the prepared-state sensor and trigger found for one DAG run's epoch.

    ``outcome`` is one of:

    * ``waiting``  -- no epoch yet, or some expected participant has not prepared;
    * ``prepared`` -- every expected participant prepared and its checkpoint verifies;
    * ``decided``  -- the epoch is already decided for commit (a cleared sensor re-ran);
    * ``aborted``  -- the epoch is decided for abort; there is nothing left to wait for;
    * ``corrupt``  -- a prepared record, checkpoint part or staged file failed verification;
    * ``timeout`` / ``error`` -- only from the trigger: its deadline passed, or reading the
      store failed (the task reports it).
    """

    outcome: str
    message: str
    epoch: int | None = None
    state: str | None = None
    missing: list[str] = field(default_factory=list)
    participants: dict[str, int] = field(default_factory=dict)  #: participant -> attempt

    @property
    def done(self) -> bool:
        """Whether waiting longer cannot change the outcome."""
        return self.outcome != "waiting"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for XCom and trigger events."""
        return {"outcome": self.outcome, "message": self.message, "epoch": self.epoch,
                "state": self.state, "missing": list(self.missing),
                "participants": dict(self.participants)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreparedCheck:
        """Inverse of :meth:`to_dict`."""
        return cls(data["outcome"], data["message"], data.get("epoch"), data.get("state"),
                   list(data.get("missing") or []), dict(data.get("participants") or {}))


def check_prepared(pipeline: Pipeline, run_id: str,
                   participants: Sequence[str] | None = None) -> PreparedCheck:
    """Whether the epoch of ``run_id`` is ready for the commit/abort decision.

    ``participants`` are the stages that must prepare; ``None`` accepts any (at least one)
    participant, which suits the common one-stage pipeline. Only reads the store.
    """
    try:
        epoch = pipeline.epoch_for_run(run_id)
        if epoch is None:
            return PreparedCheck("waiting", f"run {run_id!r} has not begun an epoch yet")
        status = pipeline.status(epoch)
        state = status.state
        attempts = {name: rec.attempt for name, rec in status.prepared.items()}
        if state in (EpochState.ABORTING, EpochState.ABORTED):
            why = status.decision.reason if status.decision else "unknown reason"
            return PreparedCheck("aborted", f"epoch {epoch} is {state.value}: {why}", epoch,
                                 state.value, participants=attempts)
        if state in (EpochState.COMMITTING, EpochState.COMMITTED):
            return PreparedCheck("decided", f"epoch {epoch} is already {state.value}", epoch,
                                 state.value, participants=attempts)
        expected = list(participants) if participants else []
        missing = [name for name in expected if name not in status.prepared]
        if missing or not status.prepared:
            waiting_for = ", ".join(missing) if missing else "any participant"
            return PreparedCheck("waiting", f"epoch {epoch} is {state.value}; waiting for "
                                 f"{waiting_for} to prepare", epoch, state.value, missing, attempts)
        # Sizes and presence only: the commit decision right after re-reads every part and
        # staged file against its CRC32C, so a deep check here would read all of it twice.
        problems = pipeline.verify_prepared(epoch, expected or None, deep=False)
        if problems:
            return PreparedCheck("corrupt", f"epoch {epoch}: prepared output does not verify: "
                                 + "; ".join(str(p) for p in problems), epoch, state.value,
                                 participants=attempts)
        return PreparedCheck("prepared", f"epoch {epoch}: {', '.join(sorted(attempts))} "
                             "prepared and verified", epoch, state.value, participants=attempts)
    except CorruptCheckpointError as exc:
        return PreparedCheck("corrupt", str(exc))


class CheckpointStoreHook(BaseHook):
    """Open the checkpoint store named by a ``seatunnel_ckpt`` connection.

    :param store_conn_id: connection of type ``seatunnel_ckpt``; ``None`` means no
        connection: the store is ``storage_url`` or the local default.
    :param storage_url: store URL; overrides the connection's URL when both are given.
    :param store_config: further :class:`CheckpointConfig` fields (e.g.
        ``prepared_timeout_s``); they override the connection's extras.
    """

    conn_name_attr = "store_conn_id"
    default_conn_name = "seatunnel_ckpt_default"
    conn_type = CONN_TYPE
    hook_name = "SeaTunnel Checkpoint Store"

    def __init__(
        self,
        store_conn_id: str | None = None,
        storage_url: str | None = None,
        store_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.store_conn_id = store_conn_id
        self.storage_url = storage_url
        self.store_config = dict(store_config or {})

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Relabel the generic connection form for a checkpoint store."""
        return {
            "hidden_fields": ["schema", "port"],
            "relabeling": {
                "host": "Storage URL",
                "login": "Access key (storage option 'key')",
                "password": "Secret (storage option 'secret')",
            },
            "placeholders": {
                "host": "s3://bucket/checkpoints or file:///var/lib/ckpt",
                "extra": '{"storage_options": {}, "prepared_timeout_s": 600, "max_retain": 10}',
            },
        }

    def get_config(self) -> CheckpointConfig:
        """The validated checkpoint configuration (reads the connection, if any)."""
        conn = self.get_connection(self.store_conn_id) if self.store_conn_id else None
        return config_from_connection(conn, self.storage_url, self.store_config)

    async def aget_config(self) -> CheckpointConfig:
        """:meth:`get_config` for the triggerer's event loop (connection read without blocking)."""
        conn = await self.aget_connection(self.store_conn_id) if self.store_conn_id else None
        return config_from_connection(conn, self.storage_url, self.store_config)

    @cached_property
    def config(self) -> CheckpointConfig:
        """The configuration, read once per hook."""
        return self.get_config()

    def get_conn(self) -> CheckpointStore:
        """The :class:`CheckpointStore` (Airflow's generic hook entry point)."""
        return CheckpointStore(self.config)

    @cached_property
    def store(self) -> CheckpointStore:
        """The store, opened once per hook."""
        return self.get_conn()

    def get_pipeline(self, name: str) -> Pipeline:
        """The named pipeline of this store (the name is validated by the core)."""
        return self.store.pipeline(name)

    def check_prepared(self, pipeline: str, run_id: str,
                       participants: Sequence[str] | None = None) -> PreparedCheck:
        """:func:`check_prepared` on this store's pipeline."""
        return check_prepared(self.get_pipeline(pipeline), run_id, participants)

    def describe(self) -> str:
        """A log-safe description of the store: redacted URL, never the options."""
        via = f"connection {self.store_conn_id!r}" if self.store_conn_id else "no connection"
        return f"{redact_url(self.config.storage_url)} ({via})"

    def test_connection(self) -> tuple[bool, str]:
        """Open the store and list its pipelines (the UI's *Test* button)."""
        try:
            pipelines = self.store.list_pipelines()
        except Exception as exc:  # the UI wants a message, not a traceback
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"store {self.describe()} is reachable; {len(pipelines)} pipeline(s)"
