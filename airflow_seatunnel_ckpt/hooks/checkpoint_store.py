"""The checkpoint-store connection type (``seatunnel_ckpt``) and its hook.

A connection names one store: ``host`` its URL, ``login`` / ``password`` the ``key`` /
``secret`` storage options, and any :class:`~airflow_seatunnel_ckpt.core.CheckpointConfig`
field in its extras (docs/REFERENCE.md). Where a task's store is comes from
:class:`StoreSettings` alone. Storage options are secrets: never logged.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

import pydantic
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from pydantic import ConfigDict

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore
from airflow_seatunnel_ckpt.core.config import form_values, redact_url
from airflow_seatunnel_ckpt.core.errors import ConfigError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import EpochState, Record, unprepared
from airflow_seatunnel_ckpt.hooks import (
    iceberg_catalog,  # noqa: F401  (registers the catalog secret resolver)
    postgres_connection,  # noqa: F401  (registers the PostgreSQL one)
)

if TYPE_CHECKING:
    from airflow.sdk import Connection

    from airflow_seatunnel_ckpt.core import Pipeline

CONN_TYPE = "seatunnel_ckpt"
#: The connection a task without store arguments uses, when it is defined (the variable names another).
DEFAULT_CONN_ID = "seatunnel_ckpt_default"
DEFAULT_CONN_ENV = "SEATUNNEL_CKPT_STORE_CONN_ID"


def config_from_connection(conn: Connection | None, storage_url: str | None = None,
                           overrides: Mapping[str, Any] | None = None) -> CheckpointConfig:
    """Build the checkpoint configuration from a connection, an explicit URL and overrides.

    Precedence, lowest first: built-in defaults, the connection (``host`` as URL,
    ``login``/``password`` as ``key``/``secret``, then its extras), ``storage_url``, ``overrides``.
    """
    values: dict[str, Any] = {}
    if conn is not None:
        if conn.conn_type and conn.conn_type != CONN_TYPE:
            raise ConfigError(f"connection {conn.conn_id!r} has type {conn.conn_type!r}; a checkpoint store "
                              f"needs a connection of type {CONN_TYPE!r}")
        extra = conn.extra_dejson
        if not isinstance(extra, Mapping):
            raise ConfigError(f"connection {conn.conn_id!r}: extras must be a JSON object")
        try:
            # As the UI's connection form saves them: empty fields null, numbers as text.
            values.update(form_values(extra))
        except ConfigError as exc:
            raise ConfigError(f"connection {conn.conn_id!r}: {exc}; fix the field in the connection "
                              "(Admin > Connections) or its extras") from exc
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
    try:
        return CheckpointConfig.from_mapping(values)
    except ConfigError as exc:
        if conn is None:
            raise
        given = f" and the task's store_config {sorted(overrides)}" if overrides else ""
        raise ConfigError(f"connection {conn.conn_id!r}{given}: {exc}; fix the field in the connection "
                          "(Admin > Connections) or its extras") from exc


#: Storage option names whose values are credentials (fsspec/s3fs, gcsfs, adlfs spellings).
_SECRET_OPTION = ("secret", "password", "token", "credential", "private", "account_key", "sas")


def _is_secret_option(name: str) -> bool:
    lowered = name.lower()
    return lowered == "key" or any(word in lowered for word in _SECRET_OPTION)


def mask_store_secrets(options: Mapping[str, Any]) -> None:
    """Register the credential values of ``options`` (nested too) with Airflow's secrets masker.

    By key name, not every value: masking an endpoint URL or a region would blank those
    words out of every log line.
    """
    from airflow.sdk.log import mask_secret

    for name, value in options.items():
        if isinstance(value, Mapping):
            mask_store_secrets(value)
        elif isinstance(value, str) and _is_secret_option(str(name)):
            mask_secret(value, str(name))


@dataclass(frozen=True)
class StoreSettings:
    """Where a task's checkpoint store is: the three store arguments every task accepts.

    An explicit ``store_conn_id``, else an explicit ``storage_url`` (which also overrides a
    connection's URL), else the default connection when it is defined, else the local
    default store, as the Spark provider falls back to ``spark_default`` and ``local[*]``.
    ``store_config``: further :class:`CheckpointConfig` fields, overriding the connection's
    extras and the pipeline's descriptor.
    """

    conn_id: str | None = None
    storage_url: str | None = None
    store_config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, store_conn_id: str | None = None, storage_url: str | None = None,
           store_config: Mapping[str, Any] | None = None) -> StoreSettings:
        """From the keyword arguments operators take (``None`` / empty for unset)."""
        return cls(store_conn_id or None, storage_url or None, dict(store_config or {}))

    def check(self, where: str) -> None:
        """Check when the DAG is parsed, opening nothing: ``store_config``'s keys and values and the
        protocol of ``storage_url`` / ``secondary_url`` (a templated URL is checked once rendered)."""
        from airflow_seatunnel_ckpt.core.errors import CheckpointError
        from airflow_seatunnel_ckpt.core.storage.registry import backend_for

        config = dict(self.store_config)
        url = self.storage_url
        if url is not None and ("{{" in url or "{%" in url):
            url = None
        try:
            checked = CheckpointConfig.from_mapping({**config, **({"storage_url": url} if url else {})})
            for key in ("storage_url", "secondary_url"):
                value = url if key == "storage_url" else checked.secondary_url
                if value and "://" in value and "{{" not in value:
                    backend_for(value.split("://", 1)[0].lower())
        except CheckpointError as exc:
            raise ConfigError(
                f"{where}: bad store arguments (storage_url={redact_url(self.storage_url or '') or None!r}, "
                f"store_config keys {sorted(config)}): {exc}. Fix the task's store arguments in the DAG"
            ) from exc
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: bad store_config {sorted(config)}: {exc}") from exc

    def connection_ids(self) -> tuple[str | None, bool]:
        """The connection to read and whether it must exist (see the class docstring)."""
        if self.conn_id:
            return self.conn_id, True
        if self.storage_url:
            return None, False
        return os.environ.get(DEFAULT_CONN_ENV) or DEFAULT_CONN_ID, bool(os.environ.get(DEFAULT_CONN_ENV))

    def config(self, conn: Connection | None) -> CheckpointConfig:
        """The checkpoint configuration with ``conn`` (or None); its credentials are masked in logs."""
        config = config_from_connection(conn, self.storage_url, self.store_config)
        mask_store_secrets(config.storage_options)
        return config


@pydantic.dataclasses.dataclass(config=ConfigDict(frozen=True, extra="forbid"))
class PreparedCheck(Record):
    """What the prepared-state sensor and trigger found for one DAG run's epoch (plain data, for XCom
    and trigger events)."""

    class Outcome(enum.StrEnum):
        """The values of ``outcome``."""

        WAITING = "waiting"  # no epoch yet, or an expected participant has not prepared
        PREPARED = "prepared"  # every expected participant prepared and its checkpoint verifies
        DECIDED = "decided"  # already decided commit (a cleared sensor re-ran)
        ABORTED = "aborted"  # decided abort: nothing left to wait for
        CORRUPT = "corrupt"  # a prepared record, checkpoint part or staged file failed verification
        TIMEOUT = "timeout"  # only from the trigger: its deadline passed
        ERROR = "error"  # only from the trigger: reading the store failed

    outcome: PreparedCheck.Outcome  # callers and trigger events may give the plain string
    message: str
    epoch: int | None = None
    state: str | None = None
    missing: list[str] = pydantic.Field(default_factory=list)
    participants: dict[str, int] = pydantic.Field(default_factory=dict)  #: participant -> attempt

    @property
    def done(self) -> bool:
        """Whether waiting longer cannot change the outcome."""
        return self.outcome is not PreparedCheck.Outcome.WAITING


Outcome = PreparedCheck.Outcome


def check_prepared(pipeline: Pipeline, run_id: str,
                   participants: Sequence[str] | None = None) -> PreparedCheck:
    """Whether the epoch of ``run_id`` is ready for the commit/abort decision (only reads the store).

    ``participants``: the stages that must prepare; ``None``: those the descriptor declares,
    else any (at least one).
    """
    try:
        epoch = pipeline.epoch_for_run(run_id)
        if epoch is None:
            return PreparedCheck(Outcome.WAITING, f"run {run_id!r} has not begun an epoch yet")
        status = pipeline.status(epoch)
        state = status.state
        attempts = {name: rec.attempt for name, rec in status.prepared.items()}
        found = partial(PreparedCheck, epoch=epoch, state=state.value, participants=attempts)
        if state in (EpochState.ABORTING, EpochState.ABORTED):
            why = status.decision.reason if status.decision else "unknown reason"
            return found(Outcome.ABORTED, f"epoch {epoch} is {state.value}: {why}")
        if state in (EpochState.COMMITTING, EpochState.COMMITTED):
            return found(Outcome.DECIDED, f"epoch {epoch} is already {state.value}")
        expected = list(participants) if participants else (pipeline.declared_participants() or [])
        missing = unprepared(status.prepared, expected)
        if missing or not status.prepared:
            waiting_for = ", ".join(missing) if missing else "any participant"
            return found(Outcome.WAITING, f"epoch {epoch} is {state.value}; waiting for {waiting_for} to prepare",
                         missing=missing)
        # Sizes and presence only: the commit decision right after re-reads every part and
        # staged file against its CRC32C, so a deep check here would read all of it twice.
        problems = pipeline.verify_prepared(epoch, expected or None, deep=False)
        if problems:
            return found(Outcome.CORRUPT, f"epoch {epoch}: prepared output does not verify: "
                         + "; ".join(str(p) for p in problems))
        return found(Outcome.PREPARED, f"epoch {epoch}: {', '.join(sorted(attempts))} prepared and verified")
    except CorruptCheckpointError as exc:
        return PreparedCheck(Outcome.CORRUPT, str(exc))


class CheckpointStoreHook(BaseHook):
    """Open the checkpoint store named by a ``seatunnel_ckpt`` connection (the arguments: :class:`StoreSettings`)."""

    conn_name_attr = "store_conn_id"
    default_conn_name = "seatunnel_ckpt_default"
    conn_type = CONN_TYPE
    hook_name = "SeaTunnel Checkpoint Store"

    def __init__(self, store_conn_id: str | None = None, storage_url: str | None = None,
                 store_config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.settings = StoreSettings.of(store_conn_id, storage_url, store_config)
        self.store_conn_id = self.settings.conn_id  # (the attribute conn_name_attr names)
        self.resolved_conn_id: str | None = None

    @classmethod
    def from_settings(cls, settings: StoreSettings) -> CheckpointStoreHook:
        """The hook for a task's :class:`StoreSettings`."""
        return cls(settings.conn_id, settings.storage_url, settings.store_config)

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form's relabelling, for Airflow 3.1 (3.2+ reads the provider info's
        ``ui-field-behaviour`` and ``conn-fields`` instead and never calls this)."""
        from airflow_seatunnel_ckpt.get_provider_info import UI_FIELD_BEHAVIOUR

        return {key.replace("-", "_"): value for key, value in UI_FIELD_BEHAVIOUR.items()}

    def get_config(self) -> CheckpointConfig:
        """The validated checkpoint configuration (reads the connection, if any)."""
        conn_id, required = self.settings.connection_ids()
        try:
            conn = self.get_connection(conn_id) if conn_id is not None else None
        except AirflowNotFoundException:
            if required:
                raise
            conn = None
        return self._config_with(conn_id, conn)

    async def aget_config(self) -> CheckpointConfig:
        """:meth:`get_config` for the triggerer's event loop (connection read without blocking)."""
        conn_id, required = self.settings.connection_ids()
        try:
            conn = await self.aget_connection(conn_id) if conn_id is not None else None
        except AirflowNotFoundException:
            if required:
                raise
            conn = None
        return self._config_with(conn_id, conn)

    def _config_with(self, conn_id: str | None, conn: Connection | None) -> CheckpointConfig:
        self.resolved_conn_id = conn_id if conn is not None else None
        return self.settings.config(conn)

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
        """The named pipeline of this store: the store's configuration, then its descriptor's, then
        this hook's ``store_config``."""
        return self.store.pipeline(name, overrides=self.settings.store_config)

    def check_prepared(self, pipeline: str, run_id: str,
                       participants: Sequence[str] | None = None) -> PreparedCheck:
        """:func:`check_prepared` on this store's pipeline."""
        return check_prepared(self.get_pipeline(pipeline), run_id, participants)

    def describe(self) -> str:
        """A log-safe description of the store: redacted URL, never the options."""
        url = redact_url(self.config.storage_url)
        if self.resolved_conn_id:
            via = f"connection {self.resolved_conn_id!r}"
        elif self.settings.storage_url:
            via = "storage_url argument"
        else:
            via = f"no connection: default store, connection {DEFAULT_CONN_ID!r} is not defined"
        return f"{url} ({via})"

    def test_connection(self) -> tuple[bool, str]:
        """The UI's *Test* button: open the store, probe its conditional create afresh (the
        transaction log's one guarantee) and list its pipelines."""
        from airflow_seatunnel_ckpt.core.storage.registry import forget_probes, probe_conditional_create

        try:
            forget_probes()  # a Test click must really probe, not trust an earlier result
            store = self.get_conn()
            probe_conditional_create(store.storage)
            pipelines = store.list_pipelines()
        except Exception as exc:  # the UI wants a message, not a traceback
            return False, f"{type(exc).__name__}: {exc}"
        return True, (f"store {self.describe()} is reachable and honours conditional create; "
                      f"{len(pipelines)} pipeline(s)")
