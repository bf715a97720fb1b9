"""ReplayOperator: replay (or fully refresh) a pipeline's epochs from the Airflow UI.

Trigger the DAG holding it with a ``conf``::

    {"replay": {"from_epoch": 6, "to_epoch": 10, "reason": "amount was x10 (fixed in #123)", "force": false}}

(``to_epoch`` and ``force`` optional; ``from_epoch`` 1 is a full refresh). The task runs
:func:`spark.replay.replay_stage` in-process on local Spark with the stage it is given
(the same ``stage``, ``sources`` and ``sinks`` as the pipeline's stage task): one replay
epoch, recorded in the transaction log with who (the DAG run) and why, whose table commits
swap the replayed epochs' rows. A refusal (an epoch in flight, a merge sink, another
writer's commit) fails the task at once, naming the cause; see docs/REPLAY.md.

Airflow's own backfill and clear never replay: a cleared committed run finds its epoch
committed and publishes nothing again, and a backfill run of an already processed logical
date is a new epoch that reads only input no epoch consumed yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_seatunnel_ckpt.operators.base import PIPELINE_TEMPLATE_FIELDS, BasePipelineOperator, refusals_fail_at_once

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The key of a DAG run's ``conf`` that asks for a replay.
CONF_KEY = "replay"


class ReplayOperator(BasePipelineOperator):
    """Replay epochs of ``pipeline`` with the current ``stage`` (see the module docs).

    :param participant: the pipeline's participant (its stage task's name in the epoch).
    :param stage: the stage function as ``"package.module:function"``.
    :param sources: the stage's sources, as the stage task declares them.
    :param sinks: the stage's sinks, as the stage task declares them.
    :param key_groups: the keyed state's key groups (default: the runtime's).
    :param spark_conf: Spark configuration of the in-process session.
    :param from_epoch: the first epoch to replay; default ``dag_run.conf["replay"]["from_epoch"]``.
    :param to_epoch: the last one; default the conf's, else the newest committed epoch.
    :param reason: why; default the conf's (required one way or the other).
    :param force: replace epochs of a table another writer committed to since; default the conf's.
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "from_epoch", "to_epoch", "reason")
    ui_color = "#fdebd0"

    def __init__(self, *, participant: str, stage: str, sources: Mapping[str, Mapping[str, Any]],
                 sinks: Mapping[str, Mapping[str, Any]], key_groups: int | None = None,
                 spark_conf: Mapping[str, Any] | None = None, from_epoch: int | str | None = None,
                 to_epoch: int | str | None = None, reason: str | None = None, force: bool | None = None,
                 **kwargs: Any) -> None:
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

    def _asked(self, context: Context) -> dict[str, Any]:
        """From epoch, to epoch, reason and force: the arguments, else the run's ``conf``."""
        dag_run = context.get("dag_run")
        conf = (getattr(dag_run, "conf", None) or {}).get(CONF_KEY) or {}
        if not isinstance(conf, Mapping):
            raise AirflowFailException(f"{self.where}: conf[{CONF_KEY!r}] must be an object such as "
                                       '{"from_epoch": 6, "reason": "..."}, got ' + repr(conf))
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
        from airflow_seatunnel_ckpt.spark.context import AirflowContext
        from airflow_seatunnel_ckpt.spark.replay import replay_stage
        from airflow_seatunnel_ckpt.spark.spec import DEFAULT_KEY_GROUPS, StageSpec

        asked = self._asked(context)
        spec = StageSpec(pipeline=self.pipeline, participant=self.participant, run_id=context["run_id"], attempt=1,
                         stage=self.stage, sources=self.sources, sinks=self.sinks,
                         store=self.hook.config.to_mapping(include_secrets=True), spark_conf=self.spark_conf,
                         airflow_context=AirflowContext.of_task(context, self.task_id).to_dict(),
                         key_groups=DEFAULT_KEY_GROUPS if self.key_groups is None else self.key_groups)
        dag_id = getattr(context.get("dag"), "dag_id", "")
        ti = context.get("ti")
        by = f"airflow: DAG {dag_id!r} run {context['run_id']!r}"
        details = {"dag_version_id": str(getattr(ti, "dag_version_id", "") or "")}
        self.log.info("pipeline %s: replaying epochs %s..%s (%s)", self.pipeline, asked["from_epoch"],
                      asked["to_epoch"] or "newest", asked["reason"])
        with refusals_fail_at_once():
            result = replay_stage(spec, asked["from_epoch"], asked["to_epoch"], reason=str(asked["reason"]), by=by,
                                  force=asked["force"], details=details)
        self.log.info("pipeline %s: epochs %s replayed as epoch %s; output of epochs %s replaced", self.pipeline,
                      result.replayed, result.epoch, result.replaced)
        return result.to_dict()
