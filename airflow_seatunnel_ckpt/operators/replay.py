"""ReplayOperator: replay (or fully refresh) a pipeline's epochs from the Airflow UI.

Trigger the DAG holding it with a ``conf``::

    {"replay": {"from_epoch": 6, "to_epoch": 10, "reason": "amount was x10 (fixed in #123)", "force": false}}

(``to_epoch`` and ``force`` optional; ``from_epoch`` 1 is a full refresh). The task runs
:func:`spark.replay.replay_stage` on local Spark or through Spark Connect; in a
:func:`task_group.checkpointed_epoch` DAG, :class:`EpochOrReplayBranch` routes such a run
to :class:`EpochReplayOperator`. See docs/REPLAY.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseBranchOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_seatunnel_ckpt.pipeline_task import PIPELINE_TEMPLATE_FIELDS, BasePipelineOperator, refusals_fail_at_once

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_seatunnel_ckpt.hooks.stage_submit import StageSubmitHook

CONF_KEY = "replay"
REQUIRED_KEYS = ("from_epoch", "reason")
OPTIONAL_KEYS = ("to_epoch", "force")
_EXAMPLE = '{"replay": {"from_epoch": 6, "to_epoch": 10, "reason": "why", "force": false}}'


def _epoch_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def replay_conf(conf: Mapping[str, Any] | None, where: str) -> dict[str, Any] | None:
    """The replay a DAG run's ``conf`` asks for, checked; None when it asks for none.

    Any other key, a missing one or a wrong type raises ``AirflowFailException`` (no
    retries) naming the key, ``where`` (the task) and the expected form.
    """
    if not conf or conf.get(CONF_KEY) is None:
        return None
    asked = conf[CONF_KEY]

    def refuse(what: str) -> AirflowFailException:
        return AirflowFailException(f"{where}: conf[{CONF_KEY!r}] {what}; trigger the DAG with conf {_EXAMPLE} "
                                    "(to_epoch and force optional; from_epoch 1 is a full refresh)")

    if not isinstance(asked, Mapping):
        raise refuse(f"must be an object, got {asked!r}")
    unknown = sorted(set(asked) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise refuse(f"has unknown key(s) {unknown} (known: {[*REQUIRED_KEYS, *OPTIONAL_KEYS]})")
    missing = [key for key in REQUIRED_KEYS if key not in asked]
    if missing:
        raise refuse(f"misses {missing}")
    if not _epoch_number(asked["from_epoch"]):
        raise refuse(f"key 'from_epoch' must be an epoch number (an integer >= 1), got {asked['from_epoch']!r}")
    to_epoch = asked.get("to_epoch")
    if to_epoch is not None and not _epoch_number(to_epoch):
        raise refuse(f"key 'to_epoch' must be an epoch number (an integer >= 1) or null, got {to_epoch!r}")
    if not isinstance(asked["reason"], str) or not asked["reason"].strip():
        raise refuse(f"key 'reason' must be a non-empty string saying why, got {asked['reason']!r}")
    force = asked.get("force", False)
    if not isinstance(force, bool):
        raise refuse(f"key 'force' must be true or false, got {force!r}")
    return {"from_epoch": asked["from_epoch"], "to_epoch": to_epoch, "reason": asked["reason"], "force": force}


class ReplayOperator(BasePipelineOperator):
    """Replay epochs of ``pipeline`` with the current ``stage`` (see the module docs).

    ``participant``, ``stage``, ``sources``, ``sinks``, ``key_groups``, ``spark_conf``,
    ``conn_id`` (only a ``spark_connect`` one counts) and ``spark_remote``: as the stage task's.
    ``from_epoch``, ``to_epoch`` (default: the newest committed), ``reason`` and ``force``
    (replace epochs of a table another writer committed to since): default the run's conf's.
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "from_epoch", "to_epoch", "reason")
    ui_color = "#fdebd0"

    def __init__(self, *, participant: str, stage: str, sources: Mapping[str, Mapping[str, Any]],
                 sinks: Mapping[str, Mapping[str, Any]], key_groups: int | None = None,
                 spark_conf: Mapping[str, Any] | None = None, from_epoch: int | str | None = None,
                 to_epoch: int | str | None = None, reason: str | None = None, force: bool | None = None,
                 conn_id: str | None = None, spark_remote: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.participant = participant
        self.stage = stage
        self.sources = {name: dict(opts) for name, opts in sources.items()}
        self.sinks = {name: dict(opts) for name, opts in sinks.items()}
        self.key_groups = key_groups
        self.spark_conf = dict(spark_conf or {})
        self.from_epoch = from_epoch
        self.to_epoch = to_epoch
        self.reason = reason
        self.force = force
        self.conn_id = conn_id
        self.spark_remote = spark_remote

    def _asked(self, context: Context) -> dict[str, Any]:
        """From epoch, to epoch, reason and force: the arguments, else the run's ``conf``."""
        dag_run = context.get("dag_run")
        conf: Mapping[str, Any] = replay_conf(getattr(dag_run, "conf", None), self.where) or {}
        asked = {"from_epoch": self.from_epoch if self.from_epoch not in (None, "") else conf.get("from_epoch"),
                 "to_epoch": self.to_epoch if self.to_epoch not in (None, "") else conf.get("to_epoch"),
                 "reason": self.reason or conf.get("reason"),
                 "force": bool(self.force if self.force is not None else conf.get("force", False))}
        if asked["from_epoch"] is None or not asked["reason"]:
            raise AirflowFailException(
                f"{self.where}: nothing to replay: trigger the DAG with conf "
                '{"replay": {"from_epoch": 6, "to_epoch": 10, "reason": "why"}} (to_epoch optional; from_epoch 1 '
                "is a full refresh)")
        try:
            asked["from_epoch"] = int(asked["from_epoch"])
            asked["to_epoch"] = None if asked["to_epoch"] in (None, "") else int(asked["to_epoch"])
        except (TypeError, ValueError):
            raise AirflowFailException(f"{self.where}: from_epoch and to_epoch must be epoch numbers, got "
                                       f"{asked['from_epoch']!r} and {asked['to_epoch']!r}") from None
        return asked

    def execute(self, context: Context) -> dict[str, Any]:
        """Run the replay; its result (epochs replayed and replaced, what each sink published)."""
        return self._replay(context, self._asked(context))

    def _replay(self, context: Context, asked: Mapping[str, Any],
                stage_fn: Callable[..., Any] | None = None) -> dict[str, Any]:
        """Replay as ``asked`` with this task's participant, stage, sources and sinks."""
        from airflow_seatunnel_ckpt.hooks.stage_runtime import Runtime, choose_runtime
        from airflow_seatunnel_ckpt.hooks.stage_submit import attempt_for_try
        from airflow_seatunnel_ckpt.spark.context import AirflowContext
        from airflow_seatunnel_ckpt.spark.replay import replay_stage
        from airflow_seatunnel_ckpt.spark.spec import DEFAULT_KEY_GROUPS, StageSpec

        runtime = choose_runtime(self.conn_id, self.spark_remote, self.where)
        ti = context.get("ti")
        # The try makes the replay (its Connect session derives from it: a later try finds the killed one's).
        spec = StageSpec(pipeline=self.pipeline, participant=self.participant, run_id=context["run_id"],
                         attempt=attempt_for_try(getattr(ti, "try_number", 1)), stage=self.stage,
                         sources=self.sources, sinks=self.sinks,
                         store=self.hook.config.to_mapping(include_secrets=True), spark_conf=self.spark_conf,
                         airflow_context=AirflowContext.of_task(context, self.task_id).to_dict(),
                         remote=runtime.remote if runtime.runtime is Runtime.CONNECT else None,
                         key_groups=DEFAULT_KEY_GROUPS if self.key_groups is None else self.key_groups)
        dag_id = getattr(context.get("dag"), "dag_id", "")
        by = f"airflow: DAG {dag_id!r} run {context['run_id']!r}"
        details = {"dag_version_id": str(getattr(ti, "dag_version_id", "") or "")}
        self.log.info("pipeline %s: replaying epochs %s..%s (%s)", self.pipeline, asked["from_epoch"],
                      asked["to_epoch"] or "newest", asked["reason"])
        with refusals_fail_at_once():
            result = replay_stage(spec, asked["from_epoch"], asked["to_epoch"], reason=str(asked["reason"]), by=by,
                                  force=asked["force"], details=details, stage_fn=stage_fn,
                                  on_connect=partial(setattr, self.connect_hook, "connect"))
        self.log.info("pipeline %s: epochs %s replayed as epoch %s; output of epochs %s replaced", self.pipeline,
                      result.replayed, result.epoch, result.replaced)
        return result.to_dict()

    @cached_property
    def connect_hook(self) -> StageSubmitHook:
        """The stage's hook, holding the replay's Connect attempt and session while they run (for :meth:`on_kill`)."""
        from airflow_seatunnel_ckpt.hooks.stage_submit import StageSubmitHook

        return StageSubmitHook(self.store_pipeline, self.participant, by=f"replay {self.where}")

    def on_kill(self) -> None:
        """Airflow terminates this task (SIGTERM): a replay through Spark Connect is interrupted as a stage's
        (:meth:`StageSubmitHook.on_kill`); on local Spark the task's process ends with its session."""
        if "connect_hook" in self.__dict__ and self.connect_hook.connect is not None:
            self.connect_hook.on_kill()


class EpochOrReplayBranch(BaseBranchOperator):
    """First task of :func:`task_group.checkpointed_epoch`: a normal epoch, or the replay its ``conf`` asks for.

    A replay run follows ``replay_task_id`` only; any other run follows ``epoch_task_ids``
    (the stages, and the abort task, whose ``all_done`` rule would otherwise run it).
    """

    ui_color = "#fdebd0"

    def __init__(self, *, epoch_task_ids: Sequence[str], replay_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.epoch_task_ids = list(epoch_task_ids)
        self.replay_task_id = replay_task_id

    def choose_branch(self, context: Context) -> str | list[str]:
        """The replay task when the run's ``conf`` asks for a replay, else the epoch's tasks."""
        dag_id = getattr(self, "dag_id", None)
        where = f"DAG {dag_id!r}, task {self.task_id!r}" if dag_id else f"task {self.task_id!r}"
        asked = replay_conf(getattr(context.get("dag_run"), "conf", None), where)
        if asked is None:
            return self.epoch_task_ids
        self.log.info("conf asks for a replay of epochs %s..%s (%s): the normal epoch of this run is skipped",
                      asked["from_epoch"], asked["to_epoch"] or "newest", asked["reason"])
        return self.replay_task_id


STAGE_ARGS = ("stage", "sources", "sinks", "key_groups", "spark_conf", "conn_id", "spark_remote")


class EpochReplayOperator(ReplayOperator):
    """The ``replay`` task of :func:`task_group.checkpointed_epoch`: a replay with the participants' own stages.

    It runs what the run's ``conf["replay"]`` asks with the stage of the participant that
    wrote the replayed epochs (a replay has one participant).

    :param stages: participant -> its stage task's arguments (:data:`STAGE_ARGS`).
    :param stage_callables: participant -> its stage function, when the DAG passed one.
    """

    def __init__(self, *, stages: Mapping[str, Mapping[str, Any]],
                 stage_callables: Mapping[str, Callable[..., Any]] | None = None, **kwargs: Any) -> None:
        if not stages:
            raise ValueError("EpochReplayOperator: at least one stage is needed")
        # Kept as given: checked when a replay runs (a run without one never needs them).
        self.stages = {name: {k: options[k] for k in STAGE_ARGS if options.get(k) is not None}
                       for name, options in stages.items()}
        self.stage_callables = dict(stage_callables or {})
        super().__init__(participant=next(iter(self.stages)), stage="", sources={}, sinks={}, **kwargs)

    def execute(self, context: Context) -> dict[str, Any]:
        """Run the replay the run's ``conf`` asks for with the stage of the epochs' participant."""
        asked = self._asked(context)
        participant = self._participant_of(asked)
        options = self.stages[participant]
        stage, sources, sinks = options.get("stage"), options.get("sources", {}), options.get("sinks", {})
        if not isinstance(stage, str) or not stage:
            raise AirflowFailException(f"{self.where}: the stage task of participant {participant!r} gives no stage "
                                       "function as 'package.module:function'; a replay runs that function")
        if not (isinstance(sources, Mapping) and isinstance(sinks, Mapping)
                and all(isinstance(o, Mapping) for o in (*sources.values(), *sinks.values()))):
            raise AirflowFailException(f"{self.where}: the stage task of participant {participant!r} does not give its "
                                       "sources and sinks as name -> options mappings; a replay needs them")
        self.participant, self.stage = participant, stage
        self.sources = {name: dict(opts) for name, opts in sources.items()}
        self.sinks = {name: dict(opts) for name, opts in sinks.items()}
        self.key_groups, self.spark_conf = options.get("key_groups"), dict(options.get("spark_conf") or {})
        self.conn_id, self.spark_remote = options.get("conn_id"), options.get("spark_remote")
        return self._replay(context, asked, self.stage_callables.get(participant))

    def _participant_of(self, asked: Mapping[str, Any]) -> str:
        """The participant whose epochs are replayed (the only one, else the one the plan names)."""
        from airflow_seatunnel_ckpt.core.ops.replay import ReplayError, plan_replay

        if len(self.stages) == 1:
            return next(iter(self.stages))
        try:
            participant = plan_replay(self.store_pipeline, asked["from_epoch"], asked["to_epoch"]).participant
        except ReplayError:  # the replay itself refuses (or resumes) it, naming why
            return next(iter(self.stages))
        if participant not in self.stages:
            raise AirflowFailException(
                f"{self.where}: epochs {asked['from_epoch']}..{asked['to_epoch'] or 'newest'} of pipeline "
                f"{self.pipeline!r} were written by participant {participant!r}, which this DAG does not declare "
                f"(it declares {sorted(self.stages)}); replay with the DAG that runs that stage")
        return participant
