"""The epoch's Airflow tasks (sensor, branch, commit, abort) around a core-only stage.

Real Airflow on SQLite drives real core calls against a local store; the stage is
:class:`CorePrepareOperator`, so no Spark is needed and each DAG run takes about a second.
Crashes are injected by making a storage call fail (the worker "dies" at that line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from airflow_seatunnel_ckpt.core.errors import FencedAttemptError, StorageError
from airflow_seatunnel_ckpt.core.sinks.files import OWNER_MARKER
from airflow_seatunnel_ckpt.core.storage import LocalStorage, publish
from airflow_seatunnel_ckpt.operators import metrics
from tests.epoch_test_dags import (
    PIPELINE,
    CorePrepareOperator,
    build_epoch_dag,
    load_recovery_dag,
    logical_date,
    published_rows,
    rows_for,
    task_states,
    tree,
    try_numbers,
)

pytestmark = pytest.mark.airflow

@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Any]:
    store = tmp_path / "store"
    target = tmp_path / "table"
    return {"store": store, "target": target, "storage_url": f"file://{store}",
            "target_url": f"file://{target}"}


def pipeline_of(paths: dict[str, Any]) -> Any:
    return CheckpointStore.from_url(paths["storage_url"]).pipeline(PIPELINE)


def expected_rows(*run_ids: str, participant: str = "ingest", count: int = 3) -> list[Any]:
    return [r for run_id in run_ids for r in rows_for(run_id, participant, count)]


def staging_files(paths: dict[str, Any]) -> list[Path]:
    return [p for p in (paths["store"] / PIPELINE / "_staging").rglob("*") if p.is_file()]


# -- happy path ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["poke", "reschedule", "deferrable"])
def test_each_run_commits_its_epoch_exactly_once(run_at: Any, paths: dict[str, Any],
                                                 stats: Any, mode: str) -> None:
    sensor = {"deferrable": True} if mode == "deferrable" else {"mode": mode}
    dag = build_epoch_dag(f"happy_{mode}", paths["storage_url"], paths["target_url"],
                          sensor=sensor)
    runs = [run_at(dag, logical_date(h)) for h in range(3)]

    for run in runs:
        assert run.state == "success"
        assert task_states(run) == {"orders.ingest": "success", "orders.prepared": "success",
                                    "orders.decide": "success", "orders.commit": "success",
                                    "orders.abort": "skipped",
                                    "orders.epoch_or_replay": "success", "orders.replay": "skipped"}
    pipeline = pipeline_of(paths)
    assert [pipeline.state(e) for e in pipeline.epochs()] == [EpochState.COMMITTED] * 3
    assert [pipeline.status(e).run_id for e in pipeline.epochs()] == [r.run_id for r in runs]
    assert published_rows(paths["target"]) == expected_rows(*(r.run_id for r in runs))
    assert staging_files(paths) == []
    assert [c[2] for c in stats.of(metrics.FILES_PUBLISHED)] == [1, 1, 1]
    assert [c[2] for c in stats.of(metrics.ROWS_PUBLISHED)] == [3, 3, 3]
    assert len(stats.of(metrics.EPOCH_DURATION)) == 3
    ours = [c for c in stats.calls if c[1].startswith(metrics.PREFIX + ".")]
    assert {c[3]["pipeline"] for c in ours} == {PIPELINE}


def test_commit_emits_one_asset_event_per_sink(run_at: Any, paths: dict[str, Any]) -> None:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_seatunnel_ckpt.operators.commit import sink_asset

    second = paths["target"].parent / "audit"
    asset_a = sink_asset(PIPELINE, "orders_table", paths["target_url"])
    asset_b = sink_asset(PIPELINE, "audit", f"file://{second}")
    dag = build_epoch_dag(
        "assets", paths["storage_url"], paths["target_url"],
        participants={"ingest": {"sinks": {"orders_table": paths["target_url"],
                                           "audit": f"file://{second}"}}},
        commit={"sink_assets": {"orders_table": asset_a, "audit": asset_b}})
    run = run_at(dag, logical_date(0))

    assert run.state == "success"
    with create_session() as session:
        events = session.execute(
            select(AssetModel.uri, AssetEvent.extra).join(AssetEvent.asset)
            .where(AssetEvent.source_dag_id == "assets",
                   AssetEvent.source_run_id == run.run_id)).all()
    extras: dict[str, Any] = dict(events)
    assert set(extras) == {paths["target_url"], f"file://{second}"}
    for sink, extra in (("orders_table", extras[paths["target_url"]]),
                        ("audit", extras[f"file://{second}"])):
        assert extra["epoch"] == 1 and extra["sink"] == sink
        assert extra["files"] == 1 and extra["rows"] == 3 and extra["replayed"] is False


# -- failures before the decision -> abort ---------------------------------------------

def test_failing_stage_takes_the_abort_path_and_publishes_nothing(
        run_at: Any, paths: dict[str, Any], stats: Any) -> None:
    failing = build_epoch_dag("failing", paths["storage_url"], paths["target_url"],
                              participants={"ingest": {"fail": True}})
    run = run_at(failing, logical_date(0))

    assert run.state == "failed"
    assert task_states(run) == {"orders.ingest": "failed", "orders.prepared": "upstream_failed",
                                "orders.decide": "upstream_failed",
                                "orders.commit": "upstream_failed", "orders.abort": "success",
                                "orders.epoch_or_replay": "success", "orders.replay": "skipped"}
    pipeline = pipeline_of(paths)
    status = pipeline.status(1)
    assert status.state is EpochState.ABORTED
    assert "orders.ingest (failed)" in status.decision.reason
    assert not paths["target"].exists()
    assert staging_files(paths) == []
    assert len(stats.of(metrics.EPOCHS_ABORTED)) == 1

    # The stage is fixed and the failed run is cleared from the UI: same run id, and the
    # run gets a fresh epoch (its aborted one stays aborted), which commits.
    fixed = build_epoch_dag("failing", paths["storage_url"], paths["target_url"])
    rerun = run_at(fixed, logical_date(0))
    assert rerun.run_id == run.run_id and rerun.state == "success"
    assert pipeline.state(1) is EpochState.ABORTED
    assert pipeline.state(2) is EpochState.COMMITTED
    assert published_rows(paths["target"]) == expected_rows(run.run_id)


def test_a_stage_retried_after_dying_mid_way_commits_only_the_retry(
        run_at: Any, paths: dict[str, Any]) -> None:
    dag = build_epoch_dag("stage_retry", paths["storage_url"], paths["target_url"],
                          participants={"ingest": {"fail_tries": 1, "retries": 1}})
    run = run_at(dag, logical_date(0))

    assert run.state == "success"
    assert try_numbers(run)["orders.ingest"] == 2
    status = pipeline_of(paths).status(1)
    assert status.state is EpochState.COMMITTED
    assert status.decision.participants == {"ingest": 2}
    assert published_rows(paths["target"]) == expected_rows(run.run_id)
    assert staging_files(paths) == []  # attempt 1's half-written staging is gone too


@pytest.mark.parametrize("mode", ["poke", "reschedule", "deferrable"])
def test_sensor_timeout_aborts_and_a_late_prepare_is_fenced(
        run_at: Any, paths: dict[str, Any], mode: str) -> None:
    sensor: dict[str, Any] = {"timeout": 1.0, "poke_interval": 0.3}
    sensor.update({"deferrable": True} if mode == "deferrable" else {"mode": mode})
    dag = build_epoch_dag(f"timeout_{mode}", paths["storage_url"], paths["target_url"],
                          participants={"ingest": {}, "slow": {"skip_prepare": True}},
                          sensor=sensor)
    run = run_at(dag, logical_date(0))

    states = task_states(run)
    assert states["orders.prepared"] == "failed"
    assert states["orders.abort"] == "success"
    assert states["orders.commit"] == "upstream_failed"
    pipeline = pipeline_of(paths)
    assert pipeline.state(1) is EpochState.ABORTED
    assert "orders.prepared (failed)" in pipeline.status(1).decision.reason

    # The slow participant finally finishes: its prepare is refused, nothing leaks out.
    with pytest.raises(FencedAttemptError):
        pipeline.prepare(1, "slow", 1, run_id=run.run_id, sinks=[])
    assert "slow" not in pipeline.status(1).prepared
    assert not paths["target"].exists()
    assert staging_files(paths) == []


def test_corrupt_prepared_output_fails_the_sensor_with_the_file_named(
        run_at: Any, paths: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    dag = build_epoch_dag("corrupt", paths["storage_url"], paths["target_url"],
                          sensor={"timeout": 10})
    original = CorePrepareOperator.execute

    def execute_then_damage(self: Any, context: Any) -> Any:
        result = original(self, context)
        for staged in staging_files(paths):
            staged.write_text("truncated")  # a bit-rotted staged file
        return result

    monkeypatch.setattr(CorePrepareOperator, "execute", execute_then_damage)
    run = run_at(dag, logical_date(0))

    states = task_states(run)
    assert states["orders.prepared"] == "failed"
    assert states["orders.abort"] == "success"
    status = pipeline_of(paths).status(1)
    assert status.state is EpochState.ABORTED
    assert not paths["target"].exists()


def test_a_failed_row_check_aborts_and_routes_to_the_fallback(
        run_at: Any, paths: dict[str, Any]) -> None:
    dag = build_epoch_dag("checks", paths["storage_url"], paths["target_url"],
                          branch={"min_rows": 100}, fallback=True)
    run = run_at(dag, logical_date(0))

    # The fallback runs; the abort task fails once the epoch is aborted (its input is held back).
    assert task_states(run) == {"orders.ingest": "success", "orders.prepared": "success",
                                "orders.decide": "success", "orders.commit": "skipped",
                                "orders.abort": "failed", "quarantine": "success",
                                "orders.epoch_or_replay": "success", "orders.replay": "skipped"}
    status = pipeline_of(paths).status(1)
    assert status.state is EpochState.ABORTED
    assert status.decision.reason == ("check failed: 3 rows staged over all sinks (orders_table=3), fewer than "
                                      "the minimum 100")
    assert not paths["target"].exists()


def test_the_commit_reason_counts_the_rows_of_each_sink_once(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.operators.branch import CommitBranchOperator
    from tests.core.epochs import Participant, prepare_participant

    store_url = f"file://{tmp_path}/store"
    p = CheckpointStore.from_url(store_url).pipeline("orders")
    # One stage writes each of its 3 rows to both sinks.
    prepare_participant(p, "run-1", Participant(sinks={"orders_files": [b"a", b"b", b"c"],
                                                       "orders_table": [b"a", b"b", b"c"]}))
    branch = CommitBranchOperator(task_id="decide", pipeline="orders", storage_url=store_url,
                                  commit_task_id="commit", abort_task_id="abort")

    verdict = branch.evaluate(p.status(1))

    assert verdict.reason == "ingest prepared and verified; rows staged per sink: orders_files=3, orders_table=3"


def test_a_user_check_callable_can_veto_the_commit(run_at: Any, paths: dict[str, Any]) -> None:
    def no_orders_from_the_future(status: Any) -> str | None:
        return "order ids look wrong" if status.prepared["ingest"].rows == 3 else None

    dag = build_epoch_dag("callable_check", paths["storage_url"], paths["target_url"],
                          branch={"check": no_orders_from_the_future})
    run_at(dag, logical_date(0))

    decision = pipeline_of(paths).status(1).decision
    assert decision.decision.value == "abort"
    assert decision.reason == "check failed: no_orders_from_the_future: order ids look wrong"


# -- failures after the decision -> roll forward ---------------------------------------

def _fail_first(monkeypatch: pytest.MonkeyPatch, times: int, when: Any) -> list[str]:
    """Make ``LocalStorage.write_atomic`` fail the first ``times`` calls matching ``when``."""
    failures: list[str] = []
    original = LocalStorage.write_atomic

    def flaky(self: Any, path: str, data: Any) -> int:
        if when(path) and len(failures) < times:
            failures.append(path)
            raise StorageError(f"injected failure writing {path}")
        return original(self, path, data)

    monkeypatch.setattr(LocalStorage, "write_atomic", flaky)
    return failures


def test_commit_that_fails_twice_is_retried_and_publishes_once(
        run_at: Any, paths: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # The data files are already moved into place when the _SUCCESS marker fails: the
    # retries must recognise them instead of publishing a second copy.
    failures = _fail_first(monkeypatch, 2, lambda path: path.endswith("_SUCCESS"))
    # max_retries=0: the core's own in-call retries would absorb the failures; here the
    # Airflow task retries (with exponential backoff) are under test.
    dag = build_epoch_dag("flaky_commit", paths["storage_url"], paths["target_url"],
                          store_config={"max_retries": 0})
    run = run_at(dag, logical_date(0))

    assert len(failures) == 2
    assert run.state == "success"
    assert try_numbers(run)["orders.commit"] == 3
    assert pipeline_of(paths).state(1) is EpochState.COMMITTED
    assert published_rows(paths["target"]) == expected_rows(run.run_id)
    assert sorted(p.name for p in (paths["target"] / "epoch=1").iterdir()) == [
        "_SUCCESS", "part-ingest.jsonl"]


def _crash_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit task's worker dies right after the decision, before publishing."""

    def killed(self: Any, *args: Any, **kwargs: Any) -> str:
        raise StorageError("worker killed before publishing")

    monkeypatch.setattr(publish, "publish_files", killed)


def test_run_killed_between_decision_and_publish_is_finished_by_the_recovery_dag(
        run_at: Any, paths: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    dag = build_epoch_dag("killed", paths["storage_url"], paths["target_url"],
                          commit={"retries": 0})
    with monkeypatch.context() as crash:
        _crash_publish(crash)
        killed = run_at(dag, logical_date(0))
    assert task_states(killed)["orders.commit"] == "failed"
    assert task_states(killed)["orders.abort"] == "skipped"  # the branch chose commit
    pipeline = pipeline_of(paths)
    assert pipeline.state(1) is EpochState.COMMITTING
    # Nothing published: the target holds only its owner marker, claimed before the decision.
    assert [p.name for p in paths["target"].iterdir()] == [OWNER_MARKER]

    # While epoch 1 is unresolved no later epoch can begin: it would restore from the
    # last COMMITTED checkpoint and read epoch 1's input again.
    blocked = run_at(dag, logical_date(1))
    assert task_states(blocked)["orders.ingest"] == "failed"
    assert task_states(blocked)["orders.abort"] == "success"  # found no epoch to abort
    assert pipeline.epochs() == [1]

    recovery = load_recovery_dag(paths["storage_url"], monkeypatch)
    recovered = run_at(recovery, logical_date(1))
    assert recovered.state == "success"
    assert task_states(recovered) == {"list_pipelines": "success", "recover[0]": "success",
                                      "retain[0]": "success"}
    assert pipeline.state(1) is EpochState.COMMITTED
    assert published_rows(paths["target"]) == expected_rows(killed.run_id)

    # The blocked run, cleared, gets epoch 2; a second recovery run finds nothing to do.
    following = run_at(dag, logical_date(1))
    assert following.run_id == blocked.run_id and following.state == "success"
    assert published_rows(paths["target"]) == expected_rows(killed.run_id, following.run_id)
    assert run_at(recovery, logical_date(2)).state == "success"
    assert published_rows(paths["target"]) == expected_rows(killed.run_id, following.run_id)


def test_abort_after_a_branch_killed_past_its_commit_decision_rolls_forward(
        run_at: Any, paths: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.core import Pipeline

    original = Pipeline.decide

    def decide_then_die(self: Any, *args: Any, **kwargs: Any) -> Any:
        original(self, *args, **kwargs)
        raise StorageError("worker killed after writing the decision")

    dag = build_epoch_dag("abort_after_commit", paths["storage_url"], paths["target_url"])
    with monkeypatch.context() as crash:
        crash.setattr(Pipeline, "decide", decide_then_die)
        run = run_at(dag, logical_date(0))

    states = task_states(run)
    assert states["orders.decide"] == "failed"
    assert states["orders.commit"] == "upstream_failed"
    assert states["orders.abort"] == "success"  # ran, found COMMIT, published instead
    pipeline = pipeline_of(paths)
    assert pipeline.status(1).decision.decision.value == "commit"
    assert pipeline.state(1) is EpochState.COMMITTED
    assert published_rows(paths["target"]) == expected_rows(run.run_id)


# -- clearing any task at any time is safe ---------------------------------------------

@pytest.mark.parametrize("cleared", [
    ["orders.commit"],
    ["orders.decide", "orders.commit", "orders.abort"],
    ["orders.prepared"],
    ["orders.ingest"],
])
def test_clearing_tasks_of_a_committed_run_changes_nothing(
        run_at: Any, clear_and_rerun: Any, paths: dict[str, Any], cleared: list[str]) -> None:
    dag = build_epoch_dag("clear_" + cleared[0].split(".")[1], paths["storage_url"],
                          paths["target_url"])
    run = run_at(dag, logical_date(0))
    assert run.state == "success"
    before_table, before_store = tree(paths["target"]), tree(paths["store"])

    rerun = clear_and_rerun(dag, run.run_id, cleared)

    assert rerun.state == "success"
    assert all(try_numbers(rerun)[t] == 2 for t in cleared if t != "orders.abort")
    assert tree(paths["target"]) == before_table
    assert tree(paths["store"]) == before_store
    assert published_rows(paths["target"]) == expected_rows(run.run_id)


def test_rerunning_a_whole_committed_run_changes_nothing(run_at: Any,
                                                         paths: dict[str, Any]) -> None:
    dag = build_epoch_dag("rerun_whole", paths["storage_url"], paths["target_url"])
    first = run_at(dag, logical_date(0))
    before_table, before_store = tree(paths["target"]), tree(paths["store"])

    again = run_at(dag, logical_date(0))

    assert again.run_id == first.run_id and again.state == "success"
    assert tree(paths["target"]) == before_table
    assert tree(paths["store"]) == before_store
    assert pipeline_of(paths).epochs() == [1]
