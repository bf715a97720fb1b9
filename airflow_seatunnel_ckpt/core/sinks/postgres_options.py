"""The PostgreSQL sink's options, checked without psycopg (a DAG is parsed without it).

``{"type": "postgres", "table": "<schema>.<name>", "postgres_conn_id": "...", "mode":
"append" | "upsert", "merge_keys": [...], "create_table": false, "epoch_column": ""}`` and the
session's bounded
waits (``lock_timeout_s``, ``statement_timeout_s``, ``idle_in_transaction_timeout_s``);
``conninfo`` (a libpq
connection string without a password) instead of ``postgres_conn_id`` where no Airflow
connection exists (the core's own tests, a script). The options travel in the prepared
record; a password never does: it comes from the connection when the commit runs.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from airflow_seatunnel_ckpt.core.errors import ConfigError

#: The sink's two modes: each epoch's rows added, or merged on ``merge_keys``.
MODES = ("append", "upsert")
#: The session's timeouts (seconds) and their defaults: a lock wait (a paused committer holding the
#: epoch's marker row), one statement (a large epoch's COPY), a transaction left idle by its client.
TIMEOUTS = {"lock_timeout_s": 30.0, "statement_timeout_s": 3600.0, "idle_in_transaction_timeout_s": 60.0}
#: A password in a libpq connection string, keyword form or URL form.
_PASSWORD = re.compile(r"(^|\s)password\s*=|://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)


@dataclass(frozen=True)
class PostgresOptions:
    """One PostgreSQL sink's table and how rows land in it."""

    schema: str
    name: str
    mode: str
    merge_keys: tuple[str, ...]
    create_table: bool
    postgres_conn_id: str
    conninfo: str
    #: A ``bigint`` column of the table each commit fills with its epoch ("": none): which
    #: epoch appended a row, so that a replay removes exactly the replayed epochs' rows.
    epoch_column: str = ""
    #: How long a statement waits for a lock (the marker row a paused committer holds) before it
    #: fails, transiently: the commit is retried and the epoch stays COMMITTING meanwhile.
    lock_timeout_s: float = TIMEOUTS["lock_timeout_s"]
    #: How long one statement may run (a large epoch's ``COPY`` or ``MERGE``).
    statement_timeout_s: float = TIMEOUTS["statement_timeout_s"]
    #: How long the server keeps a transaction whose client went quiet (a paused or hung
    #: committer) before it ends the session, releasing its locks.
    idle_in_transaction_timeout_s: float = TIMEOUTS["idle_in_transaction_timeout_s"]

    @property
    def table(self) -> str:
        """``schema.name`` as the options name it (for messages)."""
        return f"{self.schema}.{self.name}"

    def target_url(self) -> str:
        """The table as an Airflow asset URI of the Postgres provider, ``postgres://host:port/database/schema/table``.

        From ``conninfo`` where it names them (host ``localhost``, port 5432 and database
        ``default`` otherwise); for ``postgres_conn_id`` the connection's id stands for the
        host and the database is ``default``: the connection is read only when a task runs.
        """
        host, port, database = self.postgres_conn_id, "5432", "default"
        if self.conninfo and not self.postgres_conn_id:
            found = _conninfo_fields(self.conninfo)
            host = found.get("host", "localhost").split(",")[0] or "localhost"
            port = found.get("port", "5432").split(",")[0] or "5432"
            database = found.get("dbname") or "default"
        if host.startswith("/"):  # a Unix socket directory
            host = "localhost"
        return f"postgres://{host}:{port}/{database}/{self.schema}/{self.name}"

    def to_options(self) -> dict[str, Any]:
        """The options recorded in the prepared record (``SinkManifest.table``), never a secret."""
        out: dict[str, Any] = {"type": "postgres", "table": self.table, "mode": self.mode,
                               "create_table": self.create_table}
        if self.merge_keys:
            out["merge_keys"] = list(self.merge_keys)
        if self.postgres_conn_id:
            out["postgres_conn_id"] = self.postgres_conn_id
        if self.conninfo:
            out["conninfo"] = self.conninfo
        if self.epoch_column:
            out["epoch_column"] = self.epoch_column
        out.update({name: getattr(self, name) for name, default in TIMEOUTS.items() if getattr(self, name) != default})
        return out

    def session_settings(self) -> dict[str, str]:
        """The PostgreSQL settings each connection of the sink sets (milliseconds)."""
        return {"lock_timeout": _ms(self.lock_timeout_s), "statement_timeout": _ms(self.statement_timeout_s),
                "idle_in_transaction_session_timeout": _ms(self.idle_in_transaction_timeout_s)}


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def replay_refusal(epochs: Mapping[int, Mapping[str, Any]]) -> str | None:
    """Why a replay cannot replace the rows of an append sink's ``epochs`` (epoch -> its recorded options).

    An append's rows are told apart by their epoch only through ``epoch_column``: without it
    in every replayed epoch, the replay would add the rows again beside the old ones.
    """
    lacking = sorted(e for e, options in epochs.items() if not options.get("epoch_column"))
    if not lacking or any(o.get("merge_keys") for o in epochs.values()):
        return None
    table = next(iter(epochs.values())).get("table")
    return (f"it appends to the PostgreSQL table {table} without an epoch_column in epoch(s) {lacking}, so the rows "
            "those epochs appended cannot be told from the others, and the replay would add them again beside "
            f"them. Give the sink an epoch_column (ALTER TABLE {table} ADD COLUMN _seatunnel_epoch bigint, then "
            "epoch_column: '_seatunnel_epoch' in its options): epochs committed from then on can be replayed")


def _conninfo_fields(conninfo: str) -> dict[str, str]:
    """``host``, ``port`` and ``dbname`` of a libpq connection string (keyword or URL form), as far as given."""
    if conninfo.startswith(("postgres://", "postgresql://")):
        url = urlsplit(conninfo)
        found = {"host": url.hostname or "", "port": str(url.port or ""), "dbname": url.path.lstrip("/")}
        found.update({k: v[-1] for k, v in parse_qs(url.query).items()})
        return {k: v for k, v in found.items() if v}
    try:
        words = shlex.split(conninfo)
    except ValueError:
        return {}
    return {k.strip(): v for k, _, v in (w.partition("=") for w in words) if v}


def parse(options: Mapping[str, Any], where: str) -> PostgresOptions:
    """The checked options of a PostgreSQL sink; ConfigError naming the option and the fix."""
    table = options.get("table")
    if not isinstance(table, str) or not table or table.count(".") > 1 or not all(table.split(".")):
        raise ConfigError(f"{where}: 'table' must be '<schema>.<name>' (or '<name>' in schema public), "
                          f"got {table!r}")
    schema, _, name = table.rpartition(".")
    mode = str(options.get("mode") or "append")
    if mode not in MODES:
        raise ConfigError(f"{where}: mode must be one of {list(MODES)}, got {mode!r}")
    raw_keys = options.get("merge_keys") or []
    keys: Sequence[Any] = [raw_keys] if isinstance(raw_keys, str) else list(raw_keys)
    if any(not isinstance(k, str) or not k for k in keys):
        raise ConfigError(f"{where}: merge_keys must be column names, got {raw_keys!r}")
    if mode == "upsert" and not keys:
        raise ConfigError(f"{where}: mode 'upsert' needs merge_keys (the columns of the table's primary key or "
                          "a unique constraint)")
    if mode == "append" and keys:
        raise ConfigError(f"{where}: merge_keys {list(keys)} with mode 'append'; set mode 'upsert' to merge rows on "
                          "them, or drop merge_keys")
    conn_id = str(options.get("postgres_conn_id") or "")
    conninfo = str(options.get("conninfo") or "")
    if not conn_id and not conninfo:
        raise ConfigError(f"{where}: name the database with postgres_conn_id (an Airflow Postgres connection) or "
                          "conninfo (a libpq connection string without a password)")
    if _PASSWORD.search(conninfo):
        raise ConfigError(f"{where}: conninfo holds a password, and the sink's options are stored in the "
                          "checkpoint store; put the credentials in an Airflow Postgres connection and name it in "
                          "postgres_conn_id (or use a password file, PGPASSFILE)")
    epoch_column = options.get("epoch_column") or ""
    if not isinstance(epoch_column, str) or epoch_column in keys:
        raise ConfigError(f"{where}: epoch_column must be a column name (not a merge key), got {epoch_column!r}")
    timeouts = {}
    for option, default in TIMEOUTS.items():
        value = options.get(option, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 7 * 24 * 3600:
            raise ConfigError(f"{where}: {option} must be a number of seconds above 0 (at most a week), got {value!r}; "
                              f"the default is {default:g}")
        timeouts[option] = float(value)
    return PostgresOptions(schema or "public", name, mode, tuple(keys), bool(options.get("create_table", False)),
                           conn_id, conninfo, epoch_column, **timeouts)
