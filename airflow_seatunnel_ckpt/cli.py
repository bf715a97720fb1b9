"""``seatunnel-ckpt``: the operator's console for a checkpoint store.

Human-readable tables by default, ``--json`` for scripts. Exit codes: 0 success,
1 a problem was found (corruption, failed recovery action), 2 bad usage or input.

    seatunnel-ckpt --store file:///var/ckpt pipelines
    seatunnel-ckpt epochs orders
    seatunnel-ckpt show orders 12
    seatunnel-ckpt verify orders            # every committed checkpoint; non-zero on damage
    seatunnel-ckpt recover orders           # dry run: what would be done
    seatunnel-ckpt recover --all --apply
    seatunnel-ckpt commit orders 12 | abort orders 12 --reason "bad input"
    seatunnel-ckpt gc orders --keep 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision
from airflow_seatunnel_ckpt.core.config import default_storage_url
from airflow_seatunnel_ckpt.core.errors import CheckpointError, CorruptCheckpointError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))
    body = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join([line.rstrip(), *body])


def _store(args: argparse.Namespace) -> CheckpointStore:
    options: dict[str, Any] = {}
    raw = args.storage_options or os.environ.get("SEATUNNEL_CKPT_STORAGE_OPTIONS")
    if raw:
        try:
            options = json.loads(raw)
        except ValueError as exc:
            raise CheckpointError(f"--storage-options is not valid JSON: {exc}") from exc
        if not isinstance(options, dict):
            raise CheckpointError("--storage-options must be a JSON object")
    settings: dict[str, Any] = {"storage_url": args.store or default_storage_url(), "storage_options": options}
    if getattr(args, "timeout", None) is not None:
        settings["prepared_timeout_s"] = args.timeout
    return CheckpointStore(CheckpointConfig.from_mapping(settings))


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str) if args.json else text)


def cmd_pipelines(args: argparse.Namespace) -> int:
    store = _store(args)
    rows = []
    for name in store.list_pipelines():
        p = store.pipeline(name)
        epochs = p.epochs()
        rows.append({"pipeline": name, "epochs": len(epochs), "last_committed": p.last_committed_epoch() or "-",
                     "newest": epochs[-1] if epochs else "-",
                     "newest_state": p.state(epochs[-1]).value if epochs else "-"})
    _emit(args, rows, _table(rows, ["pipeline", "epochs", "last_committed", "newest", "newest_state"]))
    return 0


def cmd_epochs(args: argparse.Namespace) -> int:
    p = _store(args).pipeline(args.pipeline)
    statuses = p.list_epochs()
    statuses = statuses[-args.last:] if args.last else statuses
    rows = []
    for s in statuses:
        rows.append({"epoch": s.epoch, "state": s.state.value, "run_id": s.run_id,
                     "participants": ",".join(f"{k}@{v.attempt}" for k, v in sorted(s.prepared.items())) or "-",
                     "rows": sum(v.rows for v in s.prepared.values()),
                     "decision": f"{s.decision.decision.value}: {s.decision.reason}" if s.decision else "-"})
    _emit(args, [s.to_dict() for s in statuses], _table(rows, ["epoch", "state", "run_id", "participants", "rows",
                                                               "decision"]))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    p = _store(args).pipeline(args.pipeline)
    status = p.status(args.epoch)
    data: dict[str, Any] = {"status": status.to_dict()}
    lines = [f"pipeline {p.name} epoch {args.epoch}: {status.state.value} (run {status.run_id})"]
    if p.checkpoints.has_metadata(args.epoch):
        try:
            meta = p.checkpoints.read_metadata(args.epoch)
            data["checkpoint"] = meta.to_dict()
            parts = meta.parts()
            lines.append(f"checkpoint: base epoch {meta.base_epoch}, {len(parts)} parts, "
                         f"{sum(x.size for x in parts)} bytes, participants {meta.participants}")
            for name, op in sorted(meta.operators.items()):
                deltas = sum(1 for x in op.parts() if x.kind == "delta")
                lines.append(f"  operator {name}: {op.key_groups} key groups, {len(op.parts())} parts "
                             f"({deltas} delta), keys {op.key_columns}")
            for name, src in sorted(meta.sources.items()):
                lines.append(f"  source {name}: chain of {len(src.chain)} parts, this epoch {src.offsets}")
            for name, ref in sorted(meta.sinks.items()):
                lines.append(f"  sink {name}: marker {ref.path}")
        except CorruptCheckpointError as exc:
            data["checkpoint_error"] = str(exc)
            lines.append(f"checkpoint: DAMAGED: {exc}")
    elif p.txlog.is_retired(args.epoch):
        data["checkpoint_retired"] = True
        lines.append("checkpoint: removed by retention (retired); parts newer checkpoints reference are kept")
    else:
        lines.append("checkpoint: not completed (no _metadata)")
    for pub in status.published:
        lines.append(f"  published {pub.sink}: {pub.rows} rows, {pub.files} files -> {pub.target_url}/{pub.epoch_dir}")
    _emit(args, data, "\n".join(lines))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    p = _store(args).pipeline(args.pipeline)
    # Checkpoints retention retired on purpose are not damage; everything else committed is.
    epochs = [args.epoch] if args.epoch is not None else [e for e in p.committed_epochs() if not p.txlog.is_retired(e)]
    epochs = epochs[-args.last:] if args.last else epochs
    results = []
    for epoch in epochs:
        problems = p.checkpoints.verify(epoch, deep=True)
        results.append({"epoch": epoch, "ok": not problems, "problems": [str(x) for x in problems]})
    lines = [f"epoch {r['epoch']}: {'ok' if r['ok'] else 'DAMAGED'}" for r in results]
    lines += [f"  {x}" for r in results for x in r["problems"]]
    _emit(args, results, "\n".join(lines) or "no committed checkpoints")
    return 0 if all(r["ok"] for r in results) else 1


def cmd_recover(args: argparse.Namespace) -> int:
    store = _store(args)
    names = store.list_pipelines() if args.all else [args.pipeline]
    if not args.all and args.pipeline is None:
        raise CheckpointError("name a pipeline or pass --all")
    reports = [store.pipeline(n).recover(dry_run=not args.apply) for n in names]
    rows = [{"pipeline": r.pipeline, **a.to_dict()} for r in reports for a in r.actions]
    text = _table(rows, ["pipeline", "epoch", "action", "reason", "done", "error"])
    if not args.apply:
        text += "\n(dry run: nothing changed; pass --apply to carry it out)"
    _emit(args, [r.to_dict() for r in reports], text)
    return 1 if any(r.errors for r in reports) else 0


def cmd_commit(args: argparse.Namespace) -> int:
    p = _store(args).pipeline(args.pipeline)
    decision = p.decide(args.epoch, Decision.COMMIT, args.reason, by="cli")
    if decision.decision is not Decision.COMMIT:
        raise CheckpointError(f"epoch {args.epoch} was already decided abort: {decision.reason}")
    result = p.commit(args.epoch)
    _emit(args, result.to_dict(), "\n".join(
        f"committed epoch {result.epoch}: {s.sink} {s.rows} rows, {s.files} files -> {s.target_url}/{s.epoch_dir}"
        for s in result.sinks) or f"committed epoch {result.epoch} (no sinks)")
    return 0


def cmd_abort(args: argparse.Namespace) -> int:
    p = _store(args).pipeline(args.pipeline)
    record = p.abort(args.epoch, args.reason, by="cli")
    _emit(args, record.to_dict(), f"aborted epoch {args.epoch}: {record.reason}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    p = _store(args).pipeline(args.pipeline)
    report = p.retain(max_retain=args.keep, dry_run=args.dry_run)
    text = (f"kept {report.kept}; removed checkpoints {report.removed_checkpoints} "
            f"({report.removed_files} files, {report.kept_for_reference} parts kept for incremental bases); "
            f"{'would remove' if report.dry_run else 'removed'} {len(report.removed_unreferenced)} "
            "parts of losing attempts from kept checkpoints")
    if report.note:
        text += f"\nnote: {report.note}"
    _emit(args, report.to_dict(), text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    def common(p: argparse.ArgumentParser, default: Any) -> argparse.ArgumentParser:
        # Accepted before or after the subcommand; SUPPRESS keeps a subcommand from
        # overwriting a value given before it.
        p.add_argument("--store", default=default,
                       help="store URL (default: $SEATUNNEL_CKPT_STORE or ./.seatunnel-ckpt)")
        p.add_argument("--storage-options", default=default,
                       help="fsspec storage options as JSON (default: $SEATUNNEL_CKPT_STORAGE_OPTIONS)")
        p.add_argument("--json", action="store_true", default=default if default is not None else False,
                       help="machine-readable output")
        return p

    parser = common(argparse.ArgumentParser(prog="seatunnel-ckpt", description=__doc__,
                                            formatter_class=argparse.RawDescriptionHelpFormatter), None)
    shared = common(argparse.ArgumentParser(add_help=False), argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    _add = sub.add_parser

    def add_parser(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return _add(name, parents=[shared], **kwargs)

    sub.add_parser = add_parser  # type: ignore[method-assign]

    sub.add_parser("pipelines", help="list pipelines").set_defaults(fn=cmd_pipelines)
    sp = sub.add_parser("epochs", help="list a pipeline's epochs with their states")
    sp.add_argument("pipeline")
    sp.add_argument("--last", type=_positive_int, default=0, help="only the newest N")
    sp.set_defaults(fn=cmd_epochs)
    sp = sub.add_parser("show", help="show an epoch and its checkpoint")
    sp.add_argument("pipeline")
    sp.add_argument("epoch", type=int)
    sp.set_defaults(fn=cmd_show)
    sp = sub.add_parser("verify", help="verify committed checkpoints (exit 1 on damage)")
    sp.add_argument("pipeline")
    sp.add_argument("epoch", type=int, nargs="?")
    sp.add_argument("--last", type=_positive_int, default=0, help="only the newest N committed (default all)")
    sp.set_defaults(fn=cmd_verify)
    sp = sub.add_parser("recover", help="resolve unfinished epochs (dry run unless --apply)")
    sp.add_argument("pipeline", nargs="?")
    sp.add_argument("--all", action="store_true", help="every pipeline in the store")
    sp.add_argument("--apply", action="store_true", help="carry the actions out")
    sp.add_argument("--timeout", type=float, help="prepared timeout in seconds (default from config)")
    sp.set_defaults(fn=cmd_recover)
    sp = sub.add_parser("commit", help="decide commit (if undecided) and publish an epoch")
    sp.add_argument("pipeline")
    sp.add_argument("epoch", type=int)
    sp.add_argument("--reason", default="committed from the command line")
    sp.set_defaults(fn=cmd_commit)
    sp = sub.add_parser("abort", help="abort an undecided epoch")
    sp.add_argument("pipeline")
    sp.add_argument("epoch", type=int)
    sp.add_argument("--reason", default="aborted from the command line")
    sp.set_defaults(fn=cmd_abort)
    sp = sub.add_parser("gc", help="retention: delete old checkpoints, keeping incremental bases")
    sp.add_argument("pipeline")
    sp.add_argument("--keep", type=int, help="how many committed checkpoints to keep (default max_retain)")
    sp.add_argument("--dry-run", action="store_true")
    sp.set_defaults(fn=cmd_gc)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except CorruptCheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
