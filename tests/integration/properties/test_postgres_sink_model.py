"""The PostgreSQL sink over whole epochs, as the table sinks' model: every committed row once.

:class:`PostgresSinkModel` runs the table-sink state machine of
:mod:`tests.integration.properties.test_table_sink_model` (good epochs, bad merge keys, schema changes,
a wiped store, a second store and pipeline, racing committers, a crash at every point of the
commit -- including right after the database transaction committed, before the log's
``committed`` -- then recovery) against tables of a real PostgreSQL server, one database per
example. The rows are read with psycopg. On top of the model's checks, the marker table
holds each committed epoch of each store's pipeline once, and no marker of an epoch that
did not commit. Replays (append and upsert) run between races and crashes, and a fixed run
kills a replay at each point of its prepare, decision and commit.
"""

from __future__ import annotations

from typing import Any, ClassVar

import psycopg
import pyarrow as pa
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from airflow_seatunnel_ckpt.core import EpochState
from tests.integration.properties.settings import model_settings, run_model
from tests.integration.properties.test_table_sink_model import (
    COMMITTED,
    FAILED,
    FAST,
    TableSinkModel,
    killed_replays,
    model_tests,
    variant,
)
from tests.postgres_server import PostgresServer

pytestmark = pytest.mark.properties


class PostgresSinkModel(TableSinkModel):
    """The table-sink model with each table a PostgreSQL table (``public.orders_<n>``)."""

    FORMAT = "postgres"
    FAULTS = TableSinkModel.FAULTS | {"table_refusal"}
    #: The session's server (set by the module's autouse fixture: a state machine takes no fixtures).
    server: ClassVar[PostgresServer | None] = None

    def __init__(self) -> None:
        assert self.server is not None, "the postgres_server fixture did not run"
        self.dbname = self.server.create_database()
        self.dsn = self.server.conninfo(self.dbname)
        super().__init__()

    def teardown(self) -> None:
        super().teardown()
        assert self.server is not None
        self.server.drop_database(self.dbname)

    def options(self, table: int) -> dict[str, Any]:
        keys = {"mode": "upsert", "merge_keys": ["id"]} if self.upsert else {}
        return {"type": "postgres", "table": f"public.orders_{table}", "conninfo": self.dsn, "create_table": True,
                "epoch_column": "_seatunnel_epoch", **keys}

    @precondition(lambda self: "table_refusal" in self.FAULTS)
    @rule(count=st.integers(1, 3))
    def epoch_the_table_refuses(self, count: int) -> None:
        """Rows only the table refuses (a NUL character in text): refused before the decision, by the trial load."""
        rows = self.rows(count)
        rows = rows.set_column(1, "region", pa.array(["EU\x00"] * count))
        outcome, error = self.run_epoch(self.main, rows)
        assert outcome != COMMITTED, "an epoch with a NUL character in a text column committed into the table"
        assert outcome != FAILED, f"an epoch the table refuses was decided commit and failed after it: {error}"
        if not self.main.conflict:
            assert "0x00" in str(error) and "'region'" in str(error), f"the refusal does not name it: {error}"

    def target_of(self, options: dict[str, Any]) -> str:
        return f"postgres://conninfo/{options['table']}"

    def query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            if conn.execute("SELECT to_regclass('public.seatunnel_ckpt_epochs')").fetchone() == (None,):
                return []
            return conn.execute(statement, params).fetchall()

    def table_ids(self, table: int) -> list[int | None]:
        with psycopg.connect(self.dsn) as conn:
            if conn.execute("SELECT to_regclass(%s)", (f"public.orders_{table}",)).fetchone() == (None,):
                return []
            return [r[0] for r in conn.execute(f"SELECT id FROM public.orders_{table}").fetchall()]

    def each_committed_row_in_the_table_once(self) -> None:
        super().each_committed_row_in_the_table_once()
        self.each_committed_epoch_has_one_marker()

    def each_committed_epoch_has_one_marker(self) -> None:
        """Per store and pipeline: the marker rows are exactly its COMMITTED epochs that had rows."""
        found = self.query("SELECT store_id, pipeline, epoch, count(*) FROM public.seatunnel_ckpt_epochs "
                           "GROUP BY 1, 2, 3")
        assert all(n == 1 for *_, n in found), f"an epoch's marker row more than once: {found}"
        for w in self.writers:
            store_id = w.pipeline.store_id()
            markers = sorted(e for s, p, e, _ in found if (s, p) == (store_id, w.name))
            committed = sorted(s.epoch for s in w.pipeline.list_epochs() if s.state is EpochState.COMMITTED)
            assert markers == committed, (
                f"{w.label} ({w.name!r}): marker rows for epochs {markers}, committed epochs {committed}")


@pytest.fixture(autouse=True)
def _server(postgres_server: PostgresServer) -> None:
    PostgresSinkModel.server = postgres_server


globals().update(model_tests(PostgresSinkModel, "postgres"))
_ROWS_REFUSED = variant(PostgresSinkModel, "PostgresRefusesRowsTheTableRefuses", {"table_refusal"})
_ROWS_REFUSED.TestCase.settings = model_settings(fast_examples=FAST["examples"], fast_steps=FAST["steps"])
test_postgres_sink_refuses_rows_only_the_table_refuses_before_the_decision = _ROWS_REFUSED.TestCase
_REPLAYS = variant(PostgresSinkModel, "PostgresReplaysEpochs", {"replay", "race", "crash"})
_REPLAYS.TestCase.settings = model_settings(fast_examples=FAST["examples"], fast_steps=FAST["steps"])
test_postgres_sink_replays_append_and_upsert_epochs_leaving_every_row_once = _REPLAYS.TestCase


@pytest.mark.parametrize("upsert", [False, True], ids=["append", "upsert"])
def test_postgres_sink_replays_killed_at_each_point_of_their_commit_leave_every_row_once(upsert: bool) -> None:
    run_model(_REPLAYS, killed_replays(upsert), fast_examples=FAST["examples"], fast_steps=FAST["steps"])
