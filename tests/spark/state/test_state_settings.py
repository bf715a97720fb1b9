"""Keyed state's settings and executor functions, without a stage around them.

The settings are what Spark ships to every task of a state update; the executor
functions are pure functions over Arrow batches, so they run here in-process on a
real checkpoint store and a real report folder.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core.codec import Codec
from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import OperatorState
from airflow_seatunnel_ckpt.core.storage import open_storage
from airflow_seatunnel_ckpt.spark.state import (
    KEY_GROUP_COLUMN,
    Aggregate,
    KeyedState,
    KeyValueState,
    PartPolicy,
    ReportFolder,
    StateError,
    StateKind,
    StateSettings,
    StoreLocation,
    merge_partition,
)


def settings_for(
    root: Path, epoch: int, kind: StateKind = StateKind.KEY_VALUE, **overrides: Any
) -> StateSettings:
    store = StoreLocation(f"file://{root}", {})
    fields: dict[str, Any] = {
        "name": "totals",
        "kind": kind,
        "key_groups": 1,
        "epoch": epoch,
        "attempt": 1,
        "store": store,
        "restore_from": store,
        "policy": PartPolicy(True, 3, Codec.ZSTD, 3),
    }
    fields.update(overrides)
    return StateSettings(**fields)


def restored_state(root: Path, kind: str = "key_value") -> OperatorState:
    """A checkpointed state of one key group with one (empty) full part."""
    import pyarrow as pa

    from airflow_seatunnel_ckpt.core.state.checkpoint import write_arrow_part

    storage = open_storage(f"file://{root}")
    table = pa.table({"k": pa.array([], pa.int64())})
    ref = write_arrow_part(storage, "checkpoint_1/operators/totals/part-0-1", table, epoch=1, key_group=0)
    return OperatorState(1, ["k"], {0: [ref]}, kind)


def test_settings_pickle_as_plain_data_of_the_package_and_compare_equal(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, 2, restored=restored_state(tmp_path)).bound_to(["k"])
    data = pickle.dumps(settings)
    classes: list[str] = []

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            classes.append(f"{module}.{name}")
            return super().find_class(module, name)

    assert Recording(io.BytesIO(data)).load() == settings
    # Only the package's own types: no state contents, no session, no open store.
    assert all(c.startswith("airflow_seatunnel_ckpt.") for c in classes), classes
    assert len(data) < 2_000


def test_store_options_stay_out_of_the_settings_repr(tmp_path: Path) -> None:
    location = StoreLocation("s3://bucket/p", {"secret": "hunter2"})
    assert "hunter2" not in repr(settings_for(tmp_path, 1, store=location))


def test_a_state_checkpointed_as_another_kind_is_refused_with_both_kinds(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="'totals' is a key_value in the checkpoint, not a key_set"):
        settings_for(tmp_path, 2, StateKind.KEY_SET, restored=restored_state(tmp_path))


def test_binding_other_key_columns_than_the_checkpoint_is_refused(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, 2, restored=restored_state(tmp_path))
    assert settings.key_columns == ("k",)
    with pytest.raises(StateError, match=r"keyed by \['k'\] in the checkpoint, not \['customer'\]"):
        settings.bound_to(["customer"])


def test_state_kinds_and_aggregates_keep_their_stored_strings() -> None:
    assert [k.value for k in StateKind] == ["key_set", "key_value"]
    assert StateKind.KEY_SET == "key_set" and f"{StateKind.KEY_VALUE}" == "key_value"
    assert [a.value for a in Aggregate] == ["sum", "count", "min", "max"]


def test_unknown_aggregate_function_is_refused_naming_the_choices(spark: Any, tmp_path: Path) -> None:
    state = KeyValueState(spark, settings_for(tmp_path, 1))
    df = spark.createDataFrame([(1, 2.0)], "k long, amount double")
    with pytest.raises(ConfigError, match=r"'avg_amount' must be .*\('sum', 'count', 'min', 'max'\)"):
        state.aggregate(df, "k", {"avg_amount": ("avg", "amount")})


def test_merge_keeps_running_min_and_max_across_epochs_in_delta_parts(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa

    aggregates = {"low": Aggregate.MIN, "high": Aggregate.MAX}

    def epoch(settings: StateSettings, keys: list[int], values: list[float]) -> tuple[list[dict], Any]:
        batch = pa.record_batch(
            {"k": keys, "low": values, "high": values, KEY_GROUP_COLUMN: [0] * len(keys)}
        )
        reports = ReportFolder(settings.store, settings.reports_folder(f"e{settings.epoch}"))
        out = merge_partition(iter([batch]), settings=settings, aggregates=aggregates, reports=reports)
        rows = pa.Table.from_batches(list(out)).sort_by("k").to_pylist()
        [report] = reports.read()
        return rows, report

    first = settings_for(tmp_path, 1).bound_to(["k"])
    rows, report = epoch(first, [1, 2], [5.0, 3.0])
    assert rows == [{"k": 1, "low": 5.0, "high": 5.0}, {"k": 2, "low": 3.0, "high": 3.0}]
    assert (report.key_group, report.rows, report.changed, report.part.kind) == (0, 2, 2, "full")

    restored = OperatorState(1, ["k"], {0: [report.part]}, StateKind.KEY_VALUE.value)
    second = settings_for(tmp_path, 2, restored=restored).bound_to(["k"])
    rows, report = epoch(second, [1, 3], [7.0, 4.0])
    assert rows == [{"k": 1, "low": 5.0, "high": 7.0}, {"k": 3, "low": 4.0, "high": 4.0}]
    assert (report.changed, report.part.kind, report.part.epoch) == (2, "delta", 2)
    assert report.part.path.startswith("checkpoint_2/operators/totals/part-0-1-")


def test_a_state_name_opened_as_both_kinds_in_one_stage_is_refused(spark: Any, tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.spark import StageContext

    def factory(name: str, kind: type[KeyedState]) -> KeyedState:
        return kind(spark, settings_for(tmp_path, 1, kind.kind, name=name))

    ctx = StageContext(
        spark, pipeline="p", participant="ingest", run_id="r", epoch=1, attempt=1,
        restored_epoch=None, key_groups=1, sources={}, sinks={}, state_factory=factory,
    )
    assert ctx.key_set("seen").settings.kind is StateKind.KEY_SET
    with pytest.raises(ConfigError, match="state 'seen' is already used as a key_set in this stage"):
        ctx.key_value("seen")
