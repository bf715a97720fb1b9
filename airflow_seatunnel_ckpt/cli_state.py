"""``seatunnel-ckpt state rename|drop|reset`` and ``seatunnel-ckpt rescale``: evolving keyed state.

Each command writes an audited evolution epoch (:mod:`core.ops.evolution`; docs/OPERATIONS.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from airflow_seatunnel_ckpt.cli_common import PIPELINE, Command, arg, by_whom, emit, open_pipeline
from airflow_seatunnel_ckpt.core.ops import evolution


def _run(action: Callable[..., evolution.EvolutionResult], *names: str) -> Callable[[argparse.Namespace], int]:
    """The command calling ``action`` on the pipeline with the arguments ``names``, then reporting it."""

    def command(args: argparse.Namespace) -> int:
        result = action(open_pipeline(args), *(getattr(args, n) for n in names), reason=args.reason,
                        by=by_whom(args))
        lines = [f"pipeline {result.pipeline}: {result.action} committed as evolution epoch {result.epoch} "
                 f"(run {result.run_id})"]
        lines += [f"  {state}: {what}" for state, what in sorted(result.states.items())]
        if result.descriptor_version is not None:
            lines.append(f"  descriptor version {result.descriptor_version}")
        emit(args, result.to_dict(), "\n".join(lines))
        return 0

    return command


AUDITED = (PIPELINE, arg("--reason", default="", help="why (recorded in the evolution epoch's decision)"),
           arg("--by", default="", help="who (default: cli and the user name)"))
STATE = arg("state")

COMMANDS = (
    Command("state", None, "rename, drop or reset a keyed state (an audited evolution epoch)", subcommands=(
        Command("rename", _run(evolution.rename_state, "state", "new_name"),
                "rename a keyed state, keeping its values", (*AUDITED, STATE, arg("new_name"))),
        Command("drop", _run(evolution.drop_state, "state"),
                "remove a keyed state the stage no longer uses", (*AUDITED, STATE)),
        Command("reset", _run(evolution.reset_state, "state"),
                "restart a keyed state empty (to change its aggregate, keys or column types)", (*AUDITED, STATE)),
    )),
    Command("rescale", _run(evolution.rescale, "key_groups"),
            "re-partition every keyed state into a new number of key groups",
            (*AUDITED, arg("--key-groups", type=int, required=True, help="the new number of key groups"))),
)
