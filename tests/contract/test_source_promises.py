"""Promises every source keeps, each parametrised over every source's context.

Files, an Iceberg table, a Delta table, another pipeline's output, a Kafka topic (on the
session's broker) and a PostgreSQL table read by query and by change data capture (on the
session's server), each read by a downstream pipeline through the Spark stage runtime:

- every input row is read once across epochs, and an aborted epoch's input is read again
  by the next one;
- a retried epoch (attempt 2) reads exactly the input its first attempt pinned, even when
  new input arrived between the attempts;
- input gone before a replay (files deleted, rows deleted and their files removed, a topic
  deleted and created again) refuses the replay, whatever the source's options allow a
  normal epoch to skip, and the committed output stays;
- input replaced under its identity (a file rewritten under its name, a table replaced, a
  topic created again) is refused, never read as the pinned input: by a retry and by a replay;
- a source that takes an Airflow connection (Kafka, both PostgreSQL sources) reads through it
  as through its inline address, and the store never holds the connection's secret.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import Decision
from tests.contract.sources import SOURCES, Reads, SourceContext

pytestmark = pytest.mark.spark

#: Promises a source does not keep yet (strict: the case fails once it does, so the mark goes).
KNOWN_DEFECTS: dict[tuple[str, str], str] = {}


def cases(promise: str) -> list[Any]:
    out = []
    for name in SOURCES:
        defect = KNOWN_DEFECTS.get((name, promise))
        marks = [pytest.mark.xfail(reason=defect, strict=True)] if defect else []
        out.append(pytest.param(name, id=name, marks=marks))
    return out


def reads_of(source: str, tmp_path: Path, request: pytest.FixtureRequest, spark: Any,
             permissive: bool = False) -> Reads:
    return Reads(SOURCES[source](tmp_path, request), spark, permissive)


@pytest.mark.parametrize("source", cases("read-once"))
def test_every_input_row_is_read_once_across_epochs_and_an_aborted_epochs_input_again_by_the_next(
        spark: Any, tmp_path: Path, request: pytest.FixtureRequest, source: str) -> None:
    reads = reads_of(source, tmp_path, request, spark)
    reads.context.add([1, 2, 3])
    reads.epoch()
    reads.context.add([4, 5])
    reads.epoch(decision=Decision.ABORT)
    reads.context.add([6])
    reads.epoch()  # epoch 2's input again, and the new
    reads.epoch()  # nothing new: nothing read

    assert reads.ids() == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("source", cases("retry-pinned"))
def test_a_retried_epoch_reads_exactly_its_pinned_input_though_new_input_arrived_between_the_attempts(
        spark: Any, tmp_path: Path, request: pytest.FixtureRequest, source: str) -> None:
    reads = reads_of(source, tmp_path, request, spark)
    reads.context.add([1, 2])
    reads.epoch()
    reads.context.add([3, 4])
    reads.fail_after_staging("retried")
    reads.context.add([5, 6])  # arrives between the attempts: the next epoch's

    reads.epoch("retried", attempt=2)
    assert reads.ids() == [1, 2, 3, 4]
    reads.epoch()
    assert reads.ids() == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("source", cases("gone-before-replay"))
def test_input_gone_before_a_replay_refuses_it_whatever_the_sources_options_and_the_output_stays(
        spark: Any, tmp_path: Path, request: pytest.FixtureRequest, source: str) -> None:
    reads = reads_of(source, tmp_path, request, spark, permissive=True)
    reads.context.add([1, 2])
    reads.epoch()
    reads.context.add([3, 4])
    reads.epoch()
    reads.context.remove()

    with pytest.raises(Exception) as refused:
        reads.replay(1)

    assert not isinstance(refused.value, AssertionError), refused.value
    assert reads.ids() == [1, 2, 3, 4], f"the refused replay changed the output ({refused.value})"
    assert reads.pipeline.committed_epochs() == [1, 2]


@pytest.mark.parametrize("source", cases("replaced-before-retry"))
def test_input_replaced_under_its_identity_before_a_retry_is_refused_not_read_as_the_pinned_input(
        spark: Any, tmp_path: Path, request: pytest.FixtureRequest, source: str) -> None:
    reads = reads_of(source, tmp_path, request, spark)
    reads.context.add([1, 2])
    reads.fail_after_staging("retried")
    reads.context.replace()

    with pytest.raises(Exception) as refused:
        reads.attempt("retried", 2)

    assert not isinstance(refused.value, AssertionError), refused.value
    epoch = reads.pipeline.epoch_for_run("retried")
    assert epoch is not None and reads.pipeline.txlog.read_prepared(epoch, "ingest") is None


@pytest.mark.parametrize("source", cases("replaced-before-replay"))
def test_input_replaced_under_its_identity_before_a_replay_is_refused_not_read_as_the_pinned_input(
        spark: Any, tmp_path: Path, request: pytest.FixtureRequest, source: str) -> None:
    reads = reads_of(source, tmp_path, request, spark)
    reads.context.add([1, 2])
    reads.epoch()
    reads.context.replace()

    with pytest.raises(Exception) as refused:
        reads.replay(1)

    assert not isinstance(refused.value, AssertionError), refused.value
    assert reads.ids() == [1, 2], f"the refused replay changed the output ({refused.value})"
    assert reads.pipeline.committed_epochs() == [1]


#: The credential of the connections the suite names: looked for in every file of the store.
SECRET = "contract-secret-5d1e"


@pytest.mark.parametrize("source", [c for c in cases("connection")
                                    if SOURCES[c.values[0]].by_connection is not SourceContext.by_connection])
def test_a_source_named_by_a_connection_reads_every_row_once_and_the_store_never_holds_its_secret(
        source: str, tmp_path: Path, request: pytest.FixtureRequest, spark: Any, airflow_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import airflow_seatunnel_ckpt.hooks.postgres_connection  # noqa: F401  (the task's resolver, as a stage task has it)
    from tests.operators.test_stage_postgres_connection_submit import files_holding

    context = SOURCES[source](tmp_path, request)
    named = context.by_connection(SECRET)
    assert named is not None
    options, conn_id, connection = named
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
    reads = Reads(context, spark, options=options)

    context.add([1, 2, 3])
    reads.epoch()
    context.add([4])
    reads.epoch()

    assert reads.ids() == [1, 2, 3, 4]
    assert files_holding(reads.root / "store", SECRET) == []
