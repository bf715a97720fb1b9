"""``seatunnel-ckpt replay``: process epochs N..M again with the stage's current code (also: full refresh).

The replay runs on local Spark in this process with ``--spec`` (a stage spec as JSON) or
``--stage`` and the sources and sinks the pipeline's descriptor records (docs/REPLAY.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from airflow_seatunnel_ckpt.cli_common import BY, PIPELINE, REASON, Command, arg, by_whom, emit, open_store
from airflow_seatunnel_ckpt.core.errors import ConfigError


def _spec(args: argparse.Namespace, store: Any) -> Any:
    """The stage spec to replay with: --spec, or --stage with the descriptor's sources and sinks."""
    from airflow_seatunnel_ckpt.spark.spec import StageSpec

    settings = {"storage_url": store.storage.url, "storage_options": dict(store.storage.storage_options)}
    if args.spec:
        spec = StageSpec.from_json(Path(args.spec).read_text())
        return StageSpec.from_dict({**spec.to_dict(), "store": {**dict(spec.store), **settings}})
    if not args.stage:
        raise ConfigError("replay needs the stage: --stage package.module:function (sources and sinks from the "
                          "pipeline's descriptor) or --spec stage.json")
    pipeline = store.pipeline(args.pipeline)
    descriptor = pipeline.descriptor()
    if descriptor is None or len(descriptor.participants) != 1:
        raise ConfigError(f"pipeline {args.pipeline!r} has no descriptor naming one participant; give the whole "
                          "stage with --spec stage.json")
    (participant, shape), = descriptor.participants.items()
    key_groups = {s.key_groups for s in shape.states.values() if s.key_groups}
    return StageSpec(pipeline=args.pipeline, participant=participant, run_id="replay", attempt=1, stage=args.stage,
                     sources={n: {"type": e.type, **e.options} for n, e in shape.sources.items()},
                     sinks={n: {"type": e.type, **e.options} for n, e in shape.sinks.items()},
                     store={**descriptor.config, **settings},
                     **({"key_groups": key_groups.pop()} if len(key_groups) == 1 else {}))


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay (and full refresh): restore the keyed state as of the epoch before --from-epoch, run each
    epoch up to --to-epoch (default: the newest) again with the input it read (pinned in the
    transaction log) through the stage's current code, and replace those epochs' rows in each table
    sink with one commit per table, in each file sink with one swap of its _EPOCHS pointer (readers
    see the old rows or the new ones). A full refresh is --from-epoch 1. The replay is recorded in the
    transaction log (who, why, which epochs, which code) and shown by `epochs` and `show`. Never wipe
    the store to start over: the input already consumed would be read again or lost. Refused (nothing
    changed) for merge (upsert) sinks, for snapshot sinks with --to-epoch before the newest epoch,
    while an epoch is in flight, and, unless --force, when another writer committed to a table after
    the first replayed epoch."""
    from airflow_seatunnel_ckpt.spark.replay import replay_stage

    result = replay_stage(_spec(args, open_store(args)), args.from_epoch, args.to_epoch, reason=args.reason,
                          by=by_whom(args), force=args.force)
    if result.resumed:
        text = (f"pipeline {result.pipeline}: a replay decided before a crash was committed (epoch "
                f"{result.epoch}); nothing else was run. Run the replay again if it is still needed")
    else:
        text = (f"pipeline {result.pipeline}: epochs {result.replayed} replayed as epoch {result.epoch} "
                f"(run {result.run_id}); output of epochs {result.replaced} replaced")
    emit(args, result.to_dict(), text)
    return 0


COMMAND = Command("replay", cmd_replay, "process epochs again with the current stage code (full refresh: "
                                        "--from-epoch 1)", (
    PIPELINE,
    arg("--from-epoch", type=int, required=True, help="the first epoch to replay (1: full refresh)"),
    arg("--to-epoch", type=int, help="the last epoch to replay (default: the newest committed)"),
    REASON, BY,
    arg("--force", action="store_true", help="replace the epochs' rows even if another writer committed to a "
                                             "table since; that writer's changes to those rows are lost"),
    arg("--stage", help="the stage function, package.module:function (sources and sinks: the pipeline's "
                        "descriptor)"),
    arg("--spec", help="a stage spec as JSON (instead of --stage)")))
