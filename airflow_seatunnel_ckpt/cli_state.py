"""``seatunnel-ckpt state rename|drop|reset`` and ``seatunnel-ckpt rescale``: evolving keyed state.

Each command writes an audited evolution epoch (see :mod:`core.ops.evolution`): its own
begin/prepared/decision/committed records, ``--by`` and ``--reason`` in the decision,
nothing published. They refuse while an epoch is in flight.

    seatunnel-ckpt state rename orders customer_totals totals_by_customer --reason "clearer name"
    seatunnel-ckpt state reset orders customer_totals --reason "sum -> max"
    seatunnel-ckpt state drop orders seen_orders
    seatunnel-ckpt rescale orders --key-groups 64
"""

from __future__ import annotations

import argparse
import getpass
from collections.abc import Callable
from typing import Any

from airflow_seatunnel_ckpt.core.ops import evolution

#: What the CLI needs of its host module: the store opener and the output function.
Store = Callable[[argparse.Namespace], Any]
Emit = Callable[[argparse.Namespace, Any, str], None]


def _who(args: argparse.Namespace) -> str:
    if args.by:
        return str(args.by)
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in this environment
        return "cli"


def _report(args: argparse.Namespace, emit: Emit, result: evolution.EvolutionResult) -> int:
    lines = [f"pipeline {result.pipeline}: {result.action} committed as evolution epoch {result.epoch} "
             f"(run {result.run_id})"]
    lines += [f"  {state}: {what}" for state, what in sorted(result.states.items())]
    if result.descriptor_version is not None:
        lines.append(f"  descriptor version {result.descriptor_version}")
    emit(args, result.to_dict(), "\n".join(lines))
    return 0


def register(sub: Any, store: Store, emit: Emit, parents: list[argparse.ArgumentParser] | None = None) -> None:
    """Add the ``state`` and ``rescale`` subcommands to the CLI's subparsers ``sub``.

    ``parents`` are the options every subcommand accepts (``--store`` ...), given again to
    the ``state`` actions so they are accepted after the action too.
    """

    def run(action: Callable[..., evolution.EvolutionResult], *names: str) -> Callable[[argparse.Namespace], int]:
        def command(args: argparse.Namespace) -> int:
            pipeline = store(args).pipeline(args.pipeline)
            result = action(pipeline, *(getattr(args, n) for n in names), reason=args.reason, by=_who(args))
            return _report(args, emit, result)
        return command

    def audited(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("pipeline")
        p.add_argument("--reason", default="", help="why (recorded in the evolution epoch's decision)")
        p.add_argument("--by", default="", help="who (default: cli:<user>)")
        return p

    inherit = {"parents": parents or []}
    state = sub.add_parser("state", help="rename, drop or reset a keyed state (an audited evolution epoch)")
    actions = state.add_subparsers(dest="state_command", required=True, metavar="ACTION")
    sp = audited(actions.add_parser("rename", **inherit, help="rename a keyed state, keeping its values"))
    sp.add_argument("state")
    sp.add_argument("new_name")
    sp.set_defaults(fn=run(evolution.rename_state, "state", "new_name"))
    sp = audited(actions.add_parser("drop", **inherit, help="remove a keyed state the stage no longer uses"))
    sp.add_argument("state")
    sp.set_defaults(fn=run(evolution.drop_state, "state"))
    sp = audited(actions.add_parser("reset", **inherit, help="restart a keyed state empty (to change its "
                                                              "aggregate, keys or column types)"))
    sp.add_argument("state")
    sp.set_defaults(fn=run(evolution.reset_state, "state"))
    sp = audited(sub.add_parser("rescale", help="re-partition every keyed state into a new number of key groups"))
    sp.add_argument("--key-groups", type=int, required=True, help="the new number of key groups")
    sp.set_defaults(fn=run(evolution.rescale, "key_groups"))
