"""seatunnel-ckpt: the operator's console for a checkpoint store.

Human-readable tables by default, --json for scripts (errors too: a JSON object on
stdout). Exit codes: 0 success, 1 a problem was found (corruption, failed recovery
action), 2 bad usage or input (unknown store, pipeline or epoch), 141 the output's
reader went away (e.g. piped into head).

    seatunnel-ckpt --store file:///var/ckpt pipelines
    seatunnel-ckpt epochs orders
    seatunnel-ckpt recover --all --apply    # without --apply: a dry run of what would be done
    seatunnel-ckpt cat s3://bucket/ckpt/orders/checkpoint_12/_metadata --json
    seatunnel-ckpt replay orders --from-epoch 1 --reason "full refresh" --stage dags.orders:stage
                                            # (never wipe the store to start over)
"""

# One short function per command, declared in one table (_commands), each calling one core
# function; the state/rescale commands live in cli_state, replay in cli_replay, and what
# they all share (arguments, store, output) in cli_common.

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from airflow_seatunnel_ckpt.cli_common import (
    BY,
    EPOCH,
    PIPELINE,
    REASON,
    Command,
    arg,
    by_whom,
    emit,
    open_pipeline,
    open_store,
    positive_int,
    storage_options,
)
from airflow_seatunnel_ckpt.core import Decision, EpochState, codec, layout
from airflow_seatunnel_ckpt.core.errors import CheckpointError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import CommitResult, PreparedRecord, PublishedSink
from airflow_seatunnel_ckpt.core.protocol import epoch_index
from airflow_seatunnel_ckpt.core.protocol.epoch_index import EpochSummary
from airflow_seatunnel_ckpt.core.protocol.expectations import describe as describe_expectation
from airflow_seatunnel_ckpt.core.protocol.expectations import summary as expectation_summary
from airflow_seatunnel_ckpt.core.sources.postgres_cdc import describe as describe_cdc_input
from airflow_seatunnel_ckpt.core.storage import Storage, open_storage
from airflow_seatunnel_ckpt.core.store import StoredPipeline

EXIT_BROKEN_PIPE = 141  # the reader of the output went away (``| head``), as a shell reports SIGPIPE
TEXT_WIDTH = 100


def _table(rows: list[dict[str, Any]], columns: list[str], below: Sequence[str] = ()) -> str:
    """Rows as aligned columns; the ``below`` fields (long sentences) follow their row,
    indented and wrapped, instead of widening every row to the longest of them."""
    if not rows:
        return "(none)"
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))
    body: list[str] = []
    for row, cell in zip(rows, cells, strict=True):
        body.append("  ".join(v.ljust(w) for v, w in zip(cell, widths, strict=True)).rstrip())
        for name in below:
            if row.get(name) not in (None, ""):
                body += textwrap.wrap(f"{name}: {row[name]}", TEXT_WIDTH, initial_indent="    ",
                                      subsequent_indent="      ", break_on_hyphens=False)
    return "\n".join([line.rstrip(), *body])


def _published_where(pub: PublishedSink) -> str:
    """Where a sink's epoch was published, readably: a file sink's ``<target>/epoch=<e>``, a table's
    location, or a database table's name and database (docs/REFERENCE.md, "The pieces")."""
    if layout.parse_staging_epoch(pub.epoch_dir) is not None:
        return f"{pub.target_url}/{pub.epoch_dir}"
    if not pub.epoch_dir:
        return pub.target_url
    if "://" in pub.epoch_dir or pub.epoch_dir.startswith("/"):
        return pub.epoch_dir
    scheme, _, rest = pub.target_url.partition("://")
    if scheme != "postgres" or not rest:
        return f"{pub.epoch_dir} ({pub.target_url})"
    server, _, path = rest.partition("/")
    database = path.split("/", 1)[0]
    host, _, port = server.rpartition(":")
    if database == "default" and port == "5432":  # an Airflow connection: the URL names it as host
        return f"{pub.epoch_dir} (conn {host})"
    return f"{pub.epoch_dir} ({server}/{database})"


def _published(pub: PublishedSink) -> str:
    """What one sink's epoch published, and where, for the console's lines."""
    if not pub.published:
        return f"nothing published ({pub.how.replace('_', ' ')})"
    return f"{pub.rows} rows, {pub.files} files -> {_published_where(pub)}"


def pipeline_summary(p: StoredPipeline) -> dict[str, Any]:
    """One pipeline as ``pipelines`` and the Checkpoints page list it: its epoch count, newest committed
    epoch and the newest epoch's state (None: there is none)."""
    epochs = p.newest_epochs(1)  # epochs are numbered 1, 2, ...: the newest is also the count
    try:
        last_committed: Any = p.last_committed_epoch()
        newest_state = p.state(epochs[-1]).value if epochs else None
    except CorruptCheckpointError:
        # One damaged record must not hide the other pipelines; `verify` names the file.
        last_committed, newest_state = "?", "DAMAGED"
    return {"pipeline": p.name, "epochs": epochs[-1] if epochs else 0, "last_committed": last_committed,
            "newest": epochs[-1] if epochs else None, "newest_state": newest_state}


def cmd_pipelines(args: argparse.Namespace) -> int:
    """List the pipelines in the store: how many epochs each has, the newest committed one and the
    state of the newest."""
    store = open_store(args)
    rows = [{k: "-" if v is None else v for k, v in pipeline_summary(store.pipeline(name)).items()}
            for name in store.list_pipelines()]
    emit(args, rows, _table(rows, ["pipeline", "epochs", "last_committed", "newest", "newest_state"]))
    return 0


def _state_if_readable(p: StoredPipeline, epoch: int) -> str:
    """``epoch``'s state, or UNKNOWN when the record it depends on (its decision) is damaged."""
    try:
        return p.state(epoch).value
    except CorruptCheckpointError:
        return "UNKNOWN"


def source_input(prepared: Iterable[PreparedRecord]) -> dict[str, str]:
    """Per source, what the epoch read, for people: a CDC source's LSN range, its changes by
    operation and the slot's lag (sources whose offsets say nothing readable are left out)."""
    out: dict[str, str] = {}
    for record in prepared:
        for name, source in sorted(record.sources.items()):
            text = describe_cdc_input(source.offsets)
            if text is not None:
                out[name] = text
    return out


def epoch_entry(p: StoredPipeline, epoch: int,
                summary: EpochSummary | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """One epoch's ``--json`` entry and table row, from the epoch index's ``summary`` of it or its
    records; a damaged record makes a DAMAGED row, not an error."""
    try:
        s = summary.status() if summary is not None else p.status(epoch)
    except CorruptCheckpointError as exc:
        state = _state_if_readable(p, epoch)
        where = exc.path or str(exc)
        return ({"epoch": epoch, "state": state, "damaged": str(exc)},
                {"epoch": epoch, "state": state, "logical_date": "?", "run_id": "?", "participants": "?",
                 "rows": "?", "decision": f"DAMAGED record {where}"})
    logical_date = s.begin.logical_date if s.begin else ""
    rows = s.rows_per_sink()
    data = {**s.to_dict(), "logical_date": logical_date or None, "rows": rows,
            "expectations": expectation_summary(s.prepared.values()), "input": source_input(s.prepared.values())}
    row = {"epoch": s.epoch, "state": s.state.value, "logical_date": logical_date or "-", "run_id": s.run_id,
           "participants": ",".join(f"{k}@{v.attempt}" for k, v in sorted(s.prepared.items())) or "-",
           "rows": ",".join(f"{sink}={n}" for sink, n in rows.items()) or "-",
           "decision": f"{s.decision.decision.value}: {s.decision.reason}" if s.decision else "-"}
    return data, row


def cmd_epochs(args: argparse.Namespace) -> int:
    """List a pipeline's epochs: state, the Airflow logical date and run id of the DAG run that
    processed it, participants with their winning attempt, rows per sink (published once committed,
    staged before) and the decision. An epoch with a damaged log record is shown as DAMAGED; the
    others are listed as usual."""
    p = open_pipeline(args)
    epochs, held = epoch_index.newest(p, args.last) if args.last else (p.epochs(), {})
    entries = [epoch_entry(p, e, held.get(e)) for e in epochs]
    text = _table([row for _, row in entries],
                  ["epoch", "state", "logical_date", "run_id", "participants", "rows", "decision"])
    damaged = [data["epoch"] for data, _ in entries if "damaged" in data]
    if damaged:
        text += (f"\nnote: epochs {damaged} have a damaged log record (named above); "
                 f"`seatunnel-ckpt verify {p.name}` checks every record and checkpoint")
    held = p.held_back(newest=max(epochs, default=0) if args.last else None,
                       known={data["epoch"]: data["state"] for data, _ in entries})
    if held is not None:
        text += f"\n{held.describe()}"
    emit(args, [data for data, _ in entries], text)
    return 0


def _damaged_status(p: StoredPipeline, epoch: int, damage: CorruptCheckpointError) -> tuple[dict[str, Any], list[str]]:
    """What ``show`` can still say of an epoch one of whose log records is damaged: each
    record, readable or not (the damaged ones named with what is wrong)."""
    state = _state_if_readable(p, epoch)
    damaged = {exc.path.rsplit("/", 1)[-1]: str(exc) for exc in p.txlog.damaged_records(epoch) if exc.path}
    if not damaged:  # (only the error at hand names no file)
        damaged = {"?": str(damage)}
    names = sorted({*p.storage.list_dir(layout.txlog_dir(epoch)), *damaged} - {"?"}) + (["?"] if "?" in damaged else [])
    records = {name: ("DAMAGED: " + damaged[name]) if name in damaged else "ok" for name in names}
    lines = [f"pipeline {p.name} epoch {epoch}: {state}, a log record is DAMAGED"]
    lines += [f"  record {name}: {verdict}" for name, verdict in records.items()]
    return {"epoch": epoch, "state": state, "records": records}, lines


def cmd_show(args: argparse.Namespace) -> int:
    """Show one epoch: its state, its checkpoint (parts, key groups, sources, sink markers) and what
    it published."""
    p = open_pipeline(args)
    damaged = False
    try:
        status = p.status(args.epoch)
    except CorruptCheckpointError as exc:  # show every other record and the checkpoint
        damaged, published = True, []
        summary, lines = _damaged_status(p, args.epoch, exc)
        data: dict[str, Any] = {"status": summary, "damaged": True}
    else:
        published = status.published
        rules = expectation_summary(status.prepared.values())
        read = source_input(status.prepared.values())
        data = {"status": status.to_dict(), "expectations": rules, "input": read}
        lines = [f"pipeline {p.name} epoch {args.epoch}: {status.state.value} (run {status.run_id})"]
        lines += [f"  input {name}: {text}" for name, text in read.items()]
        lines += [f"  expectation {describe_expectation(rule)}" for rule in rules]
        actions = p.txlog.actions(args.epoch)  # the audit trail: skip-sink, replay ...
        data["actions"] = [{"name": a.name, **a.record.to_dict(),
                            "outcome": a.outcome.to_dict() if a.outcome else None} for a in actions]
        for a in actions:
            details = ", ".join(f"{k}={v}" for k, v in sorted(a.record.details.items()) if v not in (None, ""))
            lines.append(f"  action {a.record.action} by {a.record.by}: {a.record.reason}"
                         + (f" ({details})" if details else "")
                         + (f" -> {a.outcome.outcome.value}: {a.outcome.detail}" if a.outcome else ""))
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
    for pub in published:
        lines.append(f"  {'published ' if pub.published else ''}{pub.sink}: {_published(pub)}")
    if damaged:
        lines.append(f"note: `seatunnel-ckpt verify {p.name} {args.epoch}` checks every record and the checkpoint; "
                     "docs/RELIABILITY.md (Corruption) says how to repair a record from a backup")
    emit(args, data, "\n".join(lines))
    return 0  # as for a damaged checkpoint: show describes, verify judges (exit 1)


_VERDICTS = {
    EpochState.COMMITTED: "ok",
    EpochState.COMMITTING: "in progress (COMMITTING: decided commit, publishing)",
    EpochState.PREPARED: "in progress (PREPARED: its checkpoint is completed when it is decided commit)",
    EpochState.OPEN: "in progress (OPEN: its stage runs; its checkpoint is completed when it is decided commit)",
    EpochState.ABORTING: "aborted (ABORTING: no checkpoint to verify)",
    EpochState.ABORTED: "aborted (no checkpoint to verify)",
}


def verify_epoch(p: StoredPipeline, epoch: int) -> dict[str, Any]:
    """The log records of ``epoch`` and, once the epoch is decided commit, its checkpoint."""
    problems = [str(exc) for exc in p.txlog.damaged_records(epoch)]
    try:
        state: EpochState | None = p.state(epoch)
    except CorruptCheckpointError:
        state = None  # the damaged decision is among the problems already
    retired = state is EpochState.COMMITTED and p.txlog.is_retired(epoch)
    # A COMMITTING epoch's _metadata exists (the decision wrote it first): it must verify too.
    if state in (EpochState.COMMITTED, EpochState.COMMITTING) and not retired:
        problems += [str(x) for x in p.checkpoints.verify(epoch, deep=True)]
    if problems:
        verdict = "DAMAGED"
    elif retired:
        verdict = "ok (checkpoint removed by retention; log records intact)"
    else:
        verdict = _VERDICTS[state] if state is not None else "DAMAGED"
    return {"epoch": epoch, "state": state.value if state is not None else "UNKNOWN", "ok": not problems,
            "verdict": verdict, "problems": problems}


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every log record of each epoch and, once an epoch is decided commit, every part of its
    checkpoint (sizes and checksums). Exit 1 if anything is damaged; epochs still in flight are
    reported as in progress, checkpoints retention removed as such."""
    p = open_pipeline(args)
    if args.epoch is not None:
        p.state(args.epoch)  # EpochNotFoundError names the pipeline and the epoch
        epochs = [args.epoch]
    else:
        epochs = p.newest_epochs(args.last) if args.last else p.epochs()
    results = [verify_epoch(p, epoch) for epoch in epochs]
    lines = [f"epoch {r['epoch']}: {r['verdict']}" for r in results]
    lines += [f"  {x}" for r in results for x in r["problems"]]
    # The settled watermark is a summary (readers fall back past a damaged version), but a
    # damaged file in the store is damage all the same: name it.
    for exc in p.txlog.settled.damaged():
        results.append({"settled_record": exc.path, "ok": False, "verdict": "DAMAGED", "problems": [str(exc)]})
        lines.append(f"settled record {exc.path}: DAMAGED\n  {exc}")
    if not all(r["ok"] for r in results):
        lines.append(f"damaged files are named above; `seatunnel-ckpt recover {p.name}` shows how recovery "
                     "resolves them, `seatunnel-ckpt cat <path>` shows a file")
    emit(args, results, "\n".join(lines) or f"pipeline {p.name} has no epochs yet")
    return 0 if all(r["ok"] for r in results) else 1


def cmd_recover(args: argparse.Namespace) -> int:
    """Resolve unfinished epochs: finish publishing decided commits, abort dead epochs, remove
    garbage. A dry run unless --apply is given."""
    if not args.all and args.pipeline is None:
        raise CheckpointError("name a pipeline or pass --all")
    store = open_store(args)
    names = store.list_pipelines() if args.all else [args.pipeline]
    # --timeout wins over the pipeline's own setting (from its descriptor), which wins over the store's.
    overrides = {"prepared_timeout_s": args.timeout} if args.timeout is not None else None
    reports = [open_pipeline(args, n, store, overrides=overrides).recover(dry_run=not args.apply) for n in names]
    rows = [{"pipeline": r.pipeline, **a.to_dict()} for r in reports for a in r.actions]
    text = _table(rows, ["pipeline", "epoch", "action", "done"], below=["reason", "error"])
    if not args.apply:
        text += "\n(dry run: nothing changed; pass --apply to carry it out)"
    emit(args, [r.to_dict() for r in reports], text)
    return 1 if any(r.errors for r in reports) else 0


def _committed(args: argparse.Namespace, result: CommitResult) -> int:
    """Report a commit: what each sink published, and where."""
    emit(args, result.to_dict(), "\n".join(f"committed epoch {result.epoch}: {s.sink} {_published(s)}"
                                            for s in result.sinks) or f"committed epoch {result.epoch} (no sinks)")
    return 0


def cmd_commit(args: argparse.Namespace) -> int:
    """Decide commit for an epoch (if it is still undecided) and publish its staged output."""
    p = open_pipeline(args)
    decision = p.decide(args.epoch, Decision.COMMIT, args.reason, by="cli")
    if decision.decision is not Decision.COMMIT:
        raise CheckpointError(f"epoch {args.epoch} was already decided abort: {decision.reason}")
    return _committed(args, p.commit(args.epoch))


def cmd_abort(args: argparse.Namespace) -> int:
    """Abort an undecided epoch: its staged output and unfinished checkpoint are removed. An epoch
    decided commit is never aborted; commit rolls it forward."""
    p = open_pipeline(args)
    record = p.abort(args.epoch, args.reason, by="cli")
    emit(args, record.to_dict(), f"aborted epoch {args.epoch}: {record.reason}")
    return 0


def cmd_resolve(args: argparse.Namespace) -> int:
    """The way on for an epoch decided commit whose table sink refuses it after the decision (the
    table was altered in between, so every commit fails at once): writes a skip-sink action naming
    who and why to the transaction log, then commits the epoch without that sink. The sink misses
    the epoch's rows; the state and the other sinks commit. Only a COMMITTING epoch qualifies."""
    p = open_pipeline(args)
    return _committed(args, p.skip_sink(args.epoch, args.skip_sink, args.reason, by=by_whom(args)))


def cmd_retain(args: argparse.Namespace) -> int:
    """Retention: delete old checkpoints, keeping the newest --keep committed ones and every older
    part they chain onto. --dry-run reports exactly what the real run will do. Also accepted as gc,
    its earlier name."""
    p = open_pipeline(args)
    report = p.retain(max_retain=args.keep, dry_run=args.dry_run)
    # A dry run says exactly what the real run will report, with "would" in front.
    verb, keep = ("would remove", "would keep") if report.dry_run else ("removed", "kept")
    whole = [e for e in report.removed_checkpoints if e not in report.partly_kept]
    said = [f"{keep} checkpoints {report.kept}"]
    if whole:
        said.append(f"{verb} checkpoints {whole} (their directories)")
    if report.partly_kept:
        said.append(f"{verb} the files of checkpoints {report.partly_kept} except parts that kept incremental "
                    "checkpoints chain onto (those directories stay)")
    said.append(f"{verb} {len(report.removed_unreferenced)} parts of losing attempts from kept checkpoints")
    text = "; ".join(said) + (f"\n{report.removed_files} files {'would be removed' if report.dry_run else 'removed'}; "
                              f"{report.kept_for_reference} parts of older checkpoints kept for incremental bases")
    if report.dry_run:
        text += "\n(dry run: nothing changed; run it without --dry-run to carry it out)"
    if report.note:
        text += f"\nnote: {report.note}"
    emit(args, report.to_dict(), text)
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    """Show the pipeline's descriptor: owner DAG, settings and the declared participants with their
    sources, sinks and keyed states."""
    from airflow_seatunnel_ckpt.core.protocol.descriptor import transfer_ownership

    p = open_pipeline(args)
    if args.transfer_to:
        transfer_ownership(p, args.transfer_to)
    descriptor = p.descriptor(refresh=True)
    if descriptor is None:
        emit(args, None, f"pipeline {p.name} has no descriptor (it is used from the core alone, or no stage "
                         "task has run it yet): recovery uses the store's settings and a commit needs every "
                         "participant that prepared")
        return 0
    lines = [f"pipeline {p.name}: descriptor version {descriptor.version}, owner DAG {descriptor.owner_dag_id}"
             + (f", store connection {descriptor.store_conn_id}" if descriptor.store_conn_id else "")]
    lines += [f"  {k} = {v}" for k, v in sorted(descriptor.config.items())]
    for name, shape in sorted(descriptor.participants.items()):
        lines.append(f"  participant {name}")
        lines += [f"    source {n}: {e.type} {e.options}" for n, e in sorted(shape.sources.items())]
        lines += [f"    sink {n}: {e.type} {e.options}" for n, e in sorted(shape.sinks.items())]
        lines += [f"    state {n}: {st.kind} keyed by {st.key_columns}"
                  + (f", aggregate {st.aggregate}" if st.aggregate else "")
                  + (f", schema {', '.join(c['name'] + ' ' + c['type'] for c in st.schema)}" if st.schema else "")
                  for n, st in sorted(shape.states.items())]
    emit(args, descriptor.to_dict(), "\n".join(lines))
    return 0


def _locate(args: argparse.Namespace) -> tuple[Storage, str]:
    """The storage holding ``args.path`` and the file's path in it."""
    if "://" in args.path:
        parent, _, name = args.path.rstrip("/").rpartition("/")
        if not name or parent.endswith(":/"):
            raise CheckpointError(f"{args.path!r} does not name a file; give the URL of one file in the store")
        return open_storage(parent, storage_options(args)), name
    return open_store(args).storage, args.path.strip("/")


def decode_file(data: bytes, where: str, rows: int = 20) -> dict[str, Any]:
    """What ``cat`` shows of one stored file: its frame header and its payload as data."""
    if not data.startswith(codec.MAGIC):
        try:
            return {"file": where, "frame": None, "json": json.loads(data) if data.strip() else None}
        except (ValueError, UnicodeDecodeError):
            raise CorruptCheckpointError(f"{where}: neither a framed store file nor JSON ({len(data)} bytes)",
                                         where) from None
    header, payload = codec.decode(data, where)
    out: dict[str, Any] = {"file": where, "frame": {
        "version": header.version, "kind": header.kind.name.lower(), "codec": header.codec.name.lower(),
        "delta": header.delta, "epoch": header.epoch, "base_epoch": header.base_epoch, "bytes": len(data)}}
    if header.kind is codec.PayloadKind.JSON:
        try:
            out["json"] = json.loads(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptCheckpointError(f"{where}: payload is not valid JSON: {exc}", where) from exc
    elif header.kind is codec.PayloadKind.ARROW:
        table = codec.read_arrow(payload, where)
        out["schema"] = [f"{f.name}: {f.type}" for f in table.schema]
        out["num_rows"] = table.num_rows
        out["rows"] = table.slice(0, rows).to_pylist()
    else:
        out["payload_bytes"] = len(payload)
    return out


def cmd_cat(args: argparse.Namespace) -> int:
    """Print one file of the store decoded: framed JSON records (transaction log, _metadata,
    markers) and JSON parts as JSON, Arrow parts as their schema and rows."""
    storage, path = _locate(args)
    where = storage.describe_path(path)
    try:
        data = storage.read(path)
    except FileNotFoundError:
        raise CheckpointError(f"{where}: no such file; `seatunnel-ckpt show <pipeline> <epoch>` names an "
                              "epoch's files") from None
    doc = decode_file(data, where, args.rows)
    frame = doc["frame"]
    lines = [f"{where}: " + (f"{frame['kind']} frame v{frame['version']}, epoch {frame['epoch']}"
                             f"{' (delta on ' + str(frame['base_epoch']) + ')' if frame['delta'] else ''}, "
                             f"{frame['codec']}, {frame['bytes']} bytes" if frame else "plain file")]
    if "json" in doc:
        lines.append(json.dumps(doc["json"], indent=2, sort_keys=True))
    elif "schema" in doc:
        lines.append("schema: " + ", ".join(doc["schema"]))
        lines.append(f"{doc['num_rows']} rows" + (f" (first {len(doc['rows'])})" if doc["num_rows"] > len(doc["rows"])
                                                  else ""))
        columns = [c.split(":", 1)[0] for c in doc["schema"]]
        lines.append(_table(doc["rows"], columns))
    else:
        lines.append(f"{doc['payload_bytes']} payload bytes")
    emit(args, doc, "\n".join(lines))
    return 0


class _UsageError(Exception):
    """Bad command-line usage, raised by the parser instead of exiting (so ``--json`` can answer)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class ConsoleParser(argparse.ArgumentParser):
    """An argument parser whose errors :func:`main` reports (as JSON with ``--json``)."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


def _commands() -> tuple[Command, ...]:
    from airflow_seatunnel_ckpt import cli_replay, cli_state  # (they build on this module)

    last = "only the newest N"
    return (
        Command("pipelines", cmd_pipelines, "list pipelines"),
        Command("epochs", cmd_epochs, "list a pipeline's epochs with their states",
                (PIPELINE, arg("--last", type=positive_int, default=0, help=last))),
        Command("show", cmd_show, "show an epoch and its checkpoint", (PIPELINE, EPOCH)),
        Command("verify", cmd_verify, "verify log records and committed checkpoints (exit 1 on damage)",
                (PIPELINE, arg("epoch", type=int, nargs="?"),
                 arg("--last", type=positive_int, default=0, help=f"{last} epochs (default all)"))),
        Command("recover", cmd_recover, "resolve unfinished epochs (dry run unless --apply)",
                (arg("pipeline", nargs="?"), arg("--all", action="store_true", help="every pipeline in the store"),
                 arg("--apply", action="store_true", help="carry the actions out"),
                 arg("--timeout", type=float, help="prepared timeout in seconds (default from config)"))),
        Command("commit", cmd_commit, "decide commit (if undecided) and publish an epoch",
                (PIPELINE, EPOCH, arg("--reason", default="committed from the command line"))),
        Command("abort", cmd_abort, "abort an undecided epoch",
                (PIPELINE, EPOCH, arg("--reason", default="aborted from the command line"))),
        Command("resolve", cmd_resolve, "commit a COMMITTING epoch without a sink whose table refuses it",
                (PIPELINE, EPOCH, arg("--skip-sink", required=True, metavar="SINK",
                                      help="the sink to publish nothing for"), REASON, BY)),
        Command("retain", cmd_retain, "retention: delete old checkpoints, keeping incremental bases",
                (PIPELINE, arg("--keep", type=int, help="how many committed checkpoints to keep (default max_retain)"),
                 arg("--dry-run", action="store_true", help="report what would be removed; change nothing")),
                aliases=("gc",)),
        Command("cat", cmd_cat, "print any file of the store decoded (records, _metadata, parts)",
                (arg("path", help="path inside the store (e.g. orders/checkpoint_3/_metadata) or a full URL"),
                 arg("--rows", type=positive_int, default=20, help="Arrow parts: rows to show (default 20)"))),
        Command("describe", cmd_describe, "show the pipeline's descriptor (owner DAG, settings, participants)",
                (PIPELINE, arg("--transfer-to", metavar="DAG_ID",
                               help="give the pipeline to another DAG (e.g. after renaming the DAG)"))),
        *cli_state.COMMANDS,
        cli_replay.COMMAND,
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    def common(p: argparse.ArgumentParser, default: Any) -> argparse.ArgumentParser:
        # Accepted before or after the subcommand; SUPPRESS keeps a subcommand from
        # overwriting a value given before it.
        p.add_argument("--store", default=default,
                       help="store URL (default: $SEATUNNEL_CKPT_STORE or $AIRFLOW_HOME/seatunnel-ckpt)")
        p.add_argument("--storage-options", default=default,
                       help="fsspec storage options as JSON (default: $SEATUNNEL_CKPT_STORAGE_OPTIONS)")
        p.add_argument("--json", action="store_true", default=default if default is not None else False,
                       help="machine-readable output")
        return p

    shared = common(argparse.ArgumentParser(add_help=False), argparse.SUPPRESS)

    def add(parser: argparse.ArgumentParser, commands: Sequence[Command], dest: str, metavar: str) -> None:
        sub = parser.add_subparsers(dest=dest, required=True, metavar=metavar)
        for c in commands:
            sp = sub.add_parser(c.name, aliases=list(c.aliases), help=c.help, parents=[shared],
                                description=(inspect.getdoc(c.fn) if c.fn else None) or c.help)
            for flags, kwargs in c.args:
                sp.add_argument(*flags, **kwargs)
            if c.subcommands:
                add(sp, c.subcommands, f"{c.name}_command", "ACTION")
            else:
                sp.set_defaults(fn=c.fn)

    parser = common(ConsoleParser(prog="seatunnel-ckpt", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter), None)
    add(parser, _commands(), "command", "COMMAND")
    return parser


def _report_error(exc: BaseException, code: int, as_json: bool) -> int:
    """One line on stderr and, with ``--json``, ``{"error": ...}`` on stdout; returns ``code``."""
    print(f"error: {exc}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": {"type": type(exc).__name__, "message": str(exc), "exit_code": code}},
                         indent=2, sort_keys=True))
    return code


def _run(argv: list[str]) -> int:
    parser = build_parser()
    # Known before parsing, so that a usage error can already answer in JSON.
    as_json = "--json" in argv
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        exc.parser.print_usage(sys.stderr)
        _report_error(exc, 2, as_json)
        raise SystemExit(2) from None
    try:
        return int(args.fn(args))
    except CorruptCheckpointError as exc:
        return _report_error(exc, 1, args.json)
    except CheckpointError as exc:
        return _report_error(exc, 2, args.json)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    try:
        code = _run(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader (``| head``) has gone: stop quietly. Point stdout at /dev/null so that
        # the interpreter's final flush does not report the broken pipe either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
