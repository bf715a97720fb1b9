"""A TaskGroup wiring the standard shape of one checkpointed epoch.

::

    epoch_or_replay ──▶ stage(s) ──▶ prepared ──▶ decide ──▶ commit
          │                 │            │           ├─────▶ abort      (trigger rule all_done)
          │                 └────────────┴───────────┘ └───▶ fallback   (optional, on a failed check)
          └──▶ replay       (only a run triggered with conf {"replay": {...}})

A run triggered with ``conf={"replay": {"from_epoch": N, "to_epoch": M, "reason": "..."}}``
replays epochs ``N..M`` with the participants' own stages instead of running an epoch
(docs/REPLAY.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from airflow.sdk import BaseOperator, TaskGroup, XComArg
from airflow.sdk.definitions.xcom_arg import PlainXComArg

from airflow_seatunnel_ckpt.core.protocol.descriptor import ParticipantDescriptor
from airflow_seatunnel_ckpt.operators.abort import AbortEpochOperator
from airflow_seatunnel_ckpt.operators.branch import CommitBranchOperator
from airflow_seatunnel_ckpt.operators.commit import CommitEpochOperator, sink_asset
from airflow_seatunnel_ckpt.operators.replay import STAGE_ARGS, EpochOrReplayBranch, EpochReplayOperator
from airflow_seatunnel_ckpt.operators.stage import SparkStageOperator
from airflow_seatunnel_ckpt.pipeline_task import BasePipelineOperator
from airflow_seatunnel_ckpt.sensors.prepared import EpochPreparedSensor

#: Task ids the group uses itself; a participant may not take one of them.
RESERVED_TASK_IDS = ("prepared", "decide", "commit", "abort", "replay", "epoch_or_replay")


def _assets_for(pipeline: str, stages: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One asset per sink, named by the sink's target URL; a templated sink gets none (its target is
    known only when the task runs)."""
    from airflow_seatunnel_ckpt.spark.declaration import is_templated
    from airflow_seatunnel_ckpt.spark.registry import SINKS

    assets = {}
    for options in stages.values():
        for sink, sink_options in (options.get("sinks") or {}).items():
            if is_templated(sink_options):
                continue
            target = SINKS.build(sink, sink_options).target_url
            if "://" in target:
                assets[sink] = sink_asset(pipeline, sink, target)
    return assets


def checkpointed_epoch(
    group_id: str,
    *,
    pipeline: str,
    stages: Mapping[str, Mapping[str, Any]],
    store_conn_id: str | None = None,
    storage_url: str | None = None,
    store_config: Mapping[str, Any] | None = None,
    sensor: Mapping[str, Any] | None = None,
    branch: Mapping[str, Any] | None = None,
    commit: Mapping[str, Any] | None = None,
    abort: Mapping[str, Any] | None = None,
    fallback: BaseOperator | XComArg | None = None,
    on_refusal: Literal["fail", "succeed"] = "fail",
    replay: Mapping[str, Any] | None = None,
    emit_assets: bool = True,
    stage_class: type[BaseOperator] = SparkStageOperator,
    tooltip: str = "",
) -> TaskGroup:
    """Build the TaskGroup for one epoch of ``pipeline`` (call inside a DAG context).

    :param stages: participant name -> keyword arguments of the stage operator; every
        participant must prepare before the epoch can commit (the descriptor records them).
    :param sensor: extra arguments of the ``prepared`` task (:class:`EpochPreparedSensor`); likewise
        ``branch`` (:class:`CommitBranchOperator`: ``min_rows``, ``check`` ...), ``commit`` and ``abort``.
    :param fallback: task (or ``@task`` call) the branch also follows when a user check
        fails, e.g. a quarantine or notification task.
    :param on_refusal: :class:`AbortEpochOperator`'s: ``"fail"`` (default) or ``"succeed"``.
    :param replay: extra :class:`EpochReplayOperator` arguments of the ``replay`` task (see
        the module docs).
    :param emit_assets: give the commit task one asset per sink with a literal URL.
    :param stage_class: operator class of the stages (any operator that prepares the
        run's epoch as a participant and accepts ``pipeline`` and the store arguments).
    :return: the TaskGroup; use it with ``>>`` like any task.
    """
    if not stages:
        raise ValueError(f"checkpointed_epoch({group_id!r}): at least one stage is needed")
    clash = sorted(set(stages) & set(RESERVED_TASK_IDS))
    if clash:
        raise ValueError(f"checkpointed_epoch({group_id!r}): participant names {clash} are "
                         f"reserved for the group's own tasks {RESERVED_TASK_IDS}")
    fallback_task: Any = fallback.operator if isinstance(fallback, PlainXComArg) else fallback
    store: dict[str, Any] = {"pipeline": pipeline, "store_conn_id": store_conn_id,
                             "storage_url": storage_url, "store_config": store_config}
    participants = list(stages)
    # The shape as written in the DAG (templates unrendered): it changes only when the DAG does.
    shapes = {name: ParticipantDescriptor.from_spec(options.get("sources"), options.get("sinks"))
              for name, options in stages.items()}
    with TaskGroup(group_id, tooltip=tooltip or f"epoch of pipeline {pipeline}") as group:
        stage_tasks = [
            stage_class(task_id=name, participant=name, **store, **dict(options))
            for name, options in stages.items()
        ]
        prepared = EpochPreparedSensor(task_id="prepared", participants=participants,
                                       **store, **dict(sensor or {}))
        commit_kwargs = dict(commit or {})
        if emit_assets:
            commit_kwargs.setdefault("sink_assets", _assets_for(pipeline, stages))
        commit_task = CommitEpochOperator(task_id="commit", **store, **commit_kwargs)
        abort_task = AbortEpochOperator(task_id="abort", **store, **{"on_refusal": on_refusal, **dict(abort or {})})
        decide = CommitBranchOperator(task_id="decide", participants=participants, commit_task_id=commit_task.task_id,
                                      abort_task_id=abort_task.task_id,
                                      fallback_task_id=fallback_task.task_id if fallback_task is not None else None,
                                      **store, **dict(branch or {}))
        for name, task in zip(stages, stage_tasks, strict=True):
            if isinstance(task, BasePipelineOperator):
                task.declared_participant = (name, shapes[name])
        for task in (*stage_tasks, prepared, commit_task, abort_task, decide):
            if isinstance(task, BasePipelineOperator):
                task.declared_pipeline = shapes
        stage_tasks >> prepared >> decide >> [commit_task, abort_task]
        [*stage_tasks, prepared] >> abort_task
        if fallback_task is not None:
            decide >> fallback_task
        replay_task = EpochReplayOperator(
            task_id="replay", **store, **dict(replay or {}),
            stages={name: {key: getattr(task, key, options.get(key)) for key in STAGE_ARGS}
                    for (name, options), task in zip(stages.items(), stage_tasks, strict=True)},
            stage_callables={name: task.stage_callable for name, task in zip(stages, stage_tasks, strict=True)
                             if getattr(task, "stage_callable", None) is not None})
        route = EpochOrReplayBranch(task_id="epoch_or_replay", replay_task_id=replay_task.task_id,
                                    epoch_task_ids=[t.task_id for t in (*stage_tasks, abort_task)])
        route >> [*stage_tasks, abort_task, replay_task]
    return group
