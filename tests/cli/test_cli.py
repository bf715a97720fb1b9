"""The ``seatunnel-ckpt`` console: every subcommand against a real local store.

The CLI runs in-process through :func:`airflow_seatunnel_ckpt.cli.main` (output captured
with ``capsys``); its effects are checked in the store through the Pipeline API, and one
test runs the installed console script as a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.cli import main
from airflow_seatunnel_ckpt.core import Decision, EpochState, Pipeline, layout
from airflow_seatunnel_ckpt.core.protocol.descriptor import ParticipantDescriptor, ensure_descriptor
from tests.core.conftest import StoreSpec
from tests.core.epochs import (
    Participant,
    expected_files,
    flip_byte,
    prepare_participant,
    published,
    restored_state,
    run_epoch,
    snapshot,
    staging_left,
)

ORDERS = [b"o1", b"o22"]
#: A password that must never be printed, wherever it was given.
SECRET = "hunter2-Sup3rSecret"


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability syncs are irrelevant to what these tests prove and cost most of their time."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


@pytest.fixture(autouse=True)
def no_cli_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's environment defaults must not leak in from the developer's shell."""
    monkeypatch.delenv("SEATUNNEL_CKPT_STORE", raising=False)
    monkeypatch.delenv("SEATUNNEL_CKPT_STORAGE_OPTIONS", raising=False)


class Cli:
    """Runs ``seatunnel-ckpt --store <the test's store> ...`` in-process."""

    def __init__(self, spec: StoreSpec, capsys: pytest.CaptureFixture[str]) -> None:
        self.spec = spec
        self.url = spec.sub_url("store")
        self._capsys = capsys

    def run(self, *args: str, store: str | None = None) -> tuple[int, str, str]:
        """Exit code, stdout and stderr of one invocation."""
        self._capsys.readouterr()
        code = main(["--store", store or self.url, *args])
        out, err = self._capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        """The parsed ``--json`` output of an invocation that must succeed."""
        code, out, err = self.run("--json", *args)
        assert code == 0, err
        assert err == ""
        return json.loads(out)


@pytest.fixture
def cli(local_spec: StoreSpec, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(local_spec, capsys)


def make_empty_store(cli: Cli) -> None:
    """Create the store's (empty) root directory: a store nothing has written to yet."""
    Path(cli.url.removeprefix("file://")).mkdir(parents=True)


def operator_part(p: Pipeline, epoch: int) -> str:
    """The one keyed-state part ``epoch`` wrote itself (relative to the pipeline root)."""
    meta = p.checkpoints.read_metadata(epoch)
    own = [ref.path for op in meta.operators.values() for ref in op.parts() if ref.epoch == epoch]
    assert len(own) == 1, own
    return own[0]


def committed_history(spec: StoreSpec) -> Pipeline:
    """``orders``: three committed epochs, each changing a different key group (incremental
    checkpoints, so epoch 3's checkpoint references the parts of epochs 1 and 2);
    ``clicks``: one committed epoch and one still prepared."""
    p = spec.pipeline("orders")
    for epoch, key in enumerate([1, 2, 3], start=1):
        assert run_epoch(p, f"run-{epoch}", Participant(changes={key: 10 * key})) == epoch
    clicks = spec.pipeline("clicks")
    run_epoch(clicks, "c-1", Participant(sinks={"clicks": [b"c1"]}))
    prepare_participant(clicks, "c-2", Participant(sinks={"clicks": [b"c2"]}))
    return p


# -- reading: pipelines, epochs, show -------------------------------------------------------


def test_pipelines_lists_every_pipeline_with_its_newest_epoch(cli: Cli) -> None:
    committed_history(cli.spec)

    code, out, err = cli.run("pipelines")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["PIPELINE", "EPOCHS", "LAST_COMMITTED", "NEWEST", "NEWEST_STATE"]
    assert sorted(line.split() for line in lines[1:]) == [
        ["clicks", "2", "1", "2", "PREPARED"],
        ["orders", "3", "3", "3", "COMMITTED"],
    ]
    rows = cli.json("pipelines")
    assert sorted(rows, key=lambda r: r["pipeline"]) == [
        {"pipeline": "clicks", "epochs": 2, "last_committed": 1, "newest": 2, "newest_state": "PREPARED"},
        {"pipeline": "orders", "epochs": 3, "last_committed": 3, "newest": 3, "newest_state": "COMMITTED"},
    ]


def test_pipelines_on_an_empty_store_lists_none(cli: Cli) -> None:
    make_empty_store(cli)
    assert cli.run("pipelines") == (0, "(none)\n", "")
    assert cli.json("pipelines") == []


def test_epochs_lists_states_participants_and_decisions(cli: Cli) -> None:
    committed_history(cli.spec)

    code, out, err = cli.run("epochs", "clicks")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["EPOCH", "STATE", "LOGICAL_DATE", "RUN_ID", "PARTICIPANTS", "ROWS", "DECISION"]
    assert lines[1].split() == ["1", "COMMITTED", "-", "c-1", "ingest@1", "clicks=1", "commit:", "all", "prepared"]
    assert lines[2].split() == ["2", "PREPARED", "-", "c-2", "ingest@1", "clicks=1", "-"]
    assert len(lines) == 3

    statuses = cli.json("epochs", "orders")
    assert [(s["epoch"], s["state"], s["run_id"]) for s in statuses] == [
        (1, "COMMITTED", "run-1"), (2, "COMMITTED", "run-2"), (3, "COMMITTED", "run-3")]
    assert statuses[0]["participants"] == {"ingest": {"attempt": 1, "rows": 2, "sinks": ["orders"]}}
    assert statuses[2]["decision"]["decision"] == "commit"
    assert [p["epoch_dir"] for p in statuses[2]["published"]] == ["epoch=3"]


def test_epochs_last_limits_the_table_and_the_json_alike(cli: Cli) -> None:
    committed_history(cli.spec)

    code, out, _ = cli.run("epochs", "orders", "--last", "2")

    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["2", "3"]
    assert [s["epoch"] for s in cli.json("epochs", "orders", "--last", "2")] == [2, 3]


def test_epochs_says_since_when_input_is_held_back_by_refusals(cli: Cli) -> None:
    p = cli.spec.pipeline("orders")
    run_epoch(p, "run-1", Participant())
    for run in ("run-2", "run-3"):
        epoch = prepare_participant(p, run, Participant()).epoch
        p.decide(epoch, Decision.ABORT, "check failed: 3 rows staged over all sinks (orders=3), fewer than the "
                                        "minimum 100")

    code, out, _ = cli.run("epochs", "orders", "--last", "1")

    assert code == 0
    assert out.splitlines()[-1] == ("input held back since epoch 2 (2 runs); epoch 3: check failed: 3 rows staged "
                                    "over all sinks (orders=3), fewer than the minimum 100")


def test_epochs_of_a_pipeline_without_a_log_lists_none(cli: Cli) -> None:
    # A pipeline that exists (its stage task recorded a descriptor) but has begun no epoch yet.
    ensure_descriptor(cli.spec.pipeline("fresh"), dag_id="fresh_dag", participants={
        "ingest": ParticipantDescriptor.from_spec({}, {})})
    assert cli.run("epochs", "fresh") == (0, "(none)\n", "")
    assert cli.run("verify", "fresh") == (0, "pipeline fresh has no epochs yet\n", "")


def test_show_describes_the_checkpoint_and_what_was_published(cli: Cli) -> None:
    p = committed_history(cli.spec)

    code, out, err = cli.run("show", "orders", "2")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "pipeline orders epoch 2: COMMITTED (run run-2)"
    assert lines[1].startswith("checkpoint: base epoch 1, 3 parts, ")
    assert "participants {'ingest': 1}" in lines[1]
    assert "  operator seen: 4 key groups, 2 parts (0 delta), keys ['k']" in lines
    assert "  sink orders: marker checkpoint_2/sinks/orders/_prepared" in lines
    target = cli.spec.sub_url("targets/orders/orders")
    assert lines[-1] == f"  published orders: 2 rows, 2 files -> {target}/epoch=2"

    data = cli.json("show", "orders", "2")
    assert data["status"]["state"] == "COMMITTED"
    assert data["checkpoint"] == p.checkpoints.read_metadata(2).to_dict()
    assert data["checkpoint"]["base_epoch"] == 1
    assert data["checkpoint"]["participants"] == {"ingest": 1}
    assert "checkpoint_error" not in data


def test_show_names_a_postgres_sinks_table_and_the_database_it_is_in_readably(cli: Cli, postgres_db: str) -> None:
    import dataclasses
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_seatunnel_ckpt.core.models import PublishedSink
    from airflow_seatunnel_ckpt.core.options import checked
    from airflow_seatunnel_ckpt.core.sinks.options import PostgresSinkOptions

    p = cli.spec.pipeline("totals")
    epoch = p.begin("run-1").epoch
    buf = io.BytesIO()
    pq.write_table(pa.table({"customer": ["c1", "c2"], "total": [1.5, 2.5]}), buf)
    p.storage.write_atomic(f"{p.staging_path(epoch, 1, 'customer_totals')}/part-00000.parquet", buf.getvalue())
    options = {"type": "postgres", "table": "public.customer_totals", "conninfo": postgres_db, "create_table": True}
    target = checked(PostgresSinkOptions, options, "sink").target_url()
    manifest = dataclasses.replace(p.manifest_for_staged(epoch, 1, "customer_totals", target, 2), table=options)
    p.prepare(epoch, "ingest", 1, run_id="run-1", sinks=[manifest])
    assert p.decide(epoch, Decision.COMMIT, "ok", by="test").decision is Decision.COMMIT
    p.commit(epoch)

    code, out, err = cli.run("show", "totals", str(epoch))

    assert (code, err) == (0, "")
    server, database = target.removeprefix("postgres://").split("/")[:2]
    assert out.splitlines()[-1] == (f"  published customer_totals: 2 rows, 1 files -> postgres table "
                                    f"public.customer_totals ({server}/{database})")
    # With an Airflow connection, its id stands for the host in the target URL (database "default").
    from airflow_seatunnel_ckpt.cli import _published_where

    by_conn = PublishedSink("customer_totals", "postgres://warehouse:5432/default/public/customer_totals",
                            "postgres table public.customer_totals", 1, 2, 10, "committed")
    assert _published_where(by_conn) == "postgres table public.customer_totals (conn warehouse)"


def test_show_an_undecided_epoch_says_its_checkpoint_is_not_complete(cli: Cli) -> None:
    committed_history(cli.spec)

    code, out, _ = cli.run("show", "clicks", "2")

    assert code == 0
    assert out.splitlines() == ["pipeline clicks epoch 2: PREPARED (run c-2)",
                                "checkpoint: not completed (no _metadata)"]
    data = cli.json("show", "clicks", "2")
    assert data["status"]["state"] == "PREPARED"
    assert "checkpoint" not in data


def test_show_reports_damaged_metadata_instead_of_failing(cli: Cli) -> None:
    p = committed_history(cli.spec)
    flip_byte(p.storage, layout.metadata_path(2))

    code, out, _ = cli.run("show", "orders", "2")

    assert code == 0
    assert "checkpoint: DAMAGED: " in out
    assert "checkpoint_2/_metadata" in out
    data = cli.json("show", "orders", "2")
    assert "checkpoint" not in data
    assert "checkpoint_2/_metadata" in data["checkpoint_error"]


@pytest.mark.parametrize("record", ["prepared-ingest", "decision", "begin", "committed"])
def test_show_names_a_damaged_record_and_still_shows_the_others_and_the_checkpoint(cli: Cli, record: str) -> None:
    p = committed_history(cli.spec)
    damaged = layout.record_path(2, record)
    flip_byte(p.storage, damaged)

    code, out, err = cli.run("show", "orders", "2")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("pipeline orders epoch 2: ") and lines[0].endswith("a log record is DAMAGED")
    verdicts = dict(line.strip()[len("record "):].split(": ", 1) for line in lines if line.startswith("  record "))
    assert verdicts[record].startswith("DAMAGED: ") and damaged in verdicts[record]
    assert {name: v for name, v in verdicts.items() if name != record} == {
        name: "ok" for name in ["begin", "fence-ingest-a1", "prepared-ingest", "decision", "committed"]
        if name != record}
    assert any(line.startswith("checkpoint: base epoch ") for line in lines)  # the checkpoint is still shown
    assert lines[-1].startswith("note: `seatunnel-ckpt verify orders 2` checks every record")
    data = cli.json("show", "orders", "2")
    assert data["damaged"] is True and data["status"]["records"][record].startswith("DAMAGED")
    assert "checkpoint" in data


def test_show_an_epoch_the_log_does_not_have_exits_2(cli: Cli) -> None:
    committed_history(cli.spec)

    code, out, err = cli.run("show", "orders", "9")

    assert (code, out) == (2, "")
    assert err == "error: pipeline 'orders' has no epoch 9\n"


# -- verify ----------------------------------------------------------------------------------


def test_verify_a_clean_store_exits_0(cli: Cli) -> None:
    committed_history(cli.spec)

    code, out, err = cli.run("verify", "orders")

    assert (code, err) == (0, "")
    assert out.splitlines() == ["epoch 1: ok", "epoch 2: ok", "epoch 3: ok"]
    ok = {"state": "COMMITTED", "ok": True, "verdict": "ok", "problems": []}
    assert cli.json("verify", "orders", "--last", "1") == [{"epoch": 3, **ok}]
    assert cli.json("verify", "orders", "2") == [{"epoch": 2, **ok}]


def test_verify_without_committed_checkpoints_says_so(cli: Cli) -> None:
    prepare_participant(cli.spec.pipeline("orders"), "run-1", Participant(sinks={"orders": ORDERS}))
    assert cli.run("verify", "orders") == (
        0, "epoch 1: in progress (PREPARED: its checkpoint is completed when it is decided commit)\n", "")


def test_verify_names_a_damaged_part_and_exits_1(cli: Cli) -> None:
    p = committed_history(cli.spec)
    damaged = operator_part(p, 2)
    size = p.storage.size(damaged)
    flip_byte(p.storage, damaged)
    assert p.storage.size(damaged) == size

    code, out, err = cli.run("verify", "orders")

    assert (code, err) == (1, "")
    lines = out.splitlines()
    # Epoch 3's incremental checkpoint references epoch 2's part: both are damaged.
    assert lines[:3] == ["epoch 1: ok", "epoch 2: DAMAGED", "epoch 3: DAMAGED"]
    problems = lines[3:-1]
    assert lines[-1].startswith("damaged files are named above; `seatunnel-ckpt recover orders` shows")
    assert len(problems) == 2
    assert all(damaged in line for line in problems), problems

    code, out, _ = cli.run("--json", "verify", "orders")
    assert code == 1
    results = {r["epoch"]: r for r in json.loads(out)}
    assert [results[e]["ok"] for e in (1, 2, 3)] == [True, False, False]
    assert results[1]["problems"] == []
    assert any(damaged in x for x in results[2]["problems"])

    # The undamaged checkpoint alone still verifies.
    assert cli.run("verify", "orders", "1")[0] == 0


# -- recover ---------------------------------------------------------------------------------


def unfinished_epochs(spec: StoreSpec) -> tuple[Pipeline, Pipeline]:
    """``orders`` epoch 2 is COMMITTING (decided commit, not published); ``clicks`` epoch 1
    is PREPARED and undecided."""
    orders = spec.pipeline("orders")
    run_epoch(orders, "run-1")
    epoch = prepare_participant(orders, "run-2", Participant(sinks={"orders": ORDERS})).epoch
    orders.decide(epoch, Decision.COMMIT, "all prepared", by="test")
    clicks = spec.pipeline("clicks")
    prepare_participant(clicks, "c-1", Participant(sinks={"clicks": [b"c1"]}))
    assert (orders.state(2), clicks.state(1)) == (EpochState.COMMITTING, EpochState.PREPARED)
    return orders, clicks


def test_recover_dry_run_reports_the_actions_and_changes_nothing(cli: Cli) -> None:
    orders, clicks = unfinished_epochs(cli.spec)
    before = snapshot(cli.spec.storage())

    code, out, err = cli.run("recover", "--all", "--timeout", "0.000001")

    assert (code, err) == (0, "")
    assert "finish-commit" in out and "abort-timeout" in out
    assert out.splitlines()[-1] == "(dry run: nothing changed; pass --apply to carry it out)"
    reports = {r["pipeline"]: r for r in cli.json("recover", "--all", "--timeout", "0.000001")}
    assert reports["orders"]["dry_run"] is True
    assert [(a["epoch"], a["action"], a["done"]) for a in reports["orders"]["actions"]] == [
        (2, "finish-commit", False)]
    assert [(a["epoch"], a["action"], a["done"]) for a in reports["clicks"]["actions"]] == [
        (1, "abort-timeout", False)]
    assert snapshot(cli.spec.storage()) == before
    assert (orders.state(2), clicks.state(1)) == (EpochState.COMMITTING, EpochState.PREPARED)


def test_recover_dry_run_prints_each_reason_below_its_row_so_the_table_stays_narrow(cli: Cli) -> None:
    unfinished_epochs(cli.spec)

    code, out, _ = cli.run("recover", "--all", "--timeout", "0.000001")

    lines = out.splitlines()
    assert code == 0 and max(len(line) for line in lines) <= 100, out
    assert lines[0].split() == ["PIPELINE", "EPOCH", "ACTION", "DONE"]
    assert lines[1].split() == ["clicks", "1", "abort-timeout", "False"]
    reason = " ".join(line.strip() for line in lines[2:lines.index(next(x for x in lines if x.startswith("orders")))])
    assert reason.startswith("reason: epoch 1 (PREPARED, run 'c-1') is DEAD: prepared ")
    assert lines[-2:] == ["    reason: decided commit, publish not acknowledged",
                          "(dry run: nothing changed; pass --apply to carry it out)"]


def test_show_and_commit_name_a_table_sinks_table_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.core.sinks.test_iceberg_sink import Lake, orders

    lake = Lake(tmp_path)
    epoch = lake.run_epoch("r1", {"region=eu": orders([1, 2], "eu")})
    location = lake.table().metadata.location.rstrip("/")

    assert main(["--store", f"file://{tmp_path}/store", "show", "orders", str(epoch)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"  published orders: 2 rows, 1 files -> {location}"
    assert out.count(location) == 1


def test_describe_shows_a_sinks_merge_keys(cli: Cli) -> None:
    p = cli.spec.pipeline("orders")
    run_epoch(p, "run-1")
    sinks = {"totals": {"type": "delta", "path": "file:///lake/totals", "merge_keys": ["customer"],
                        "secret_key": "hunter22"}}
    ensure_descriptor(p, dag_id="orders_dag", participants={"ingest": ParticipantDescriptor.from_spec({}, sinks)})

    code, out, _ = cli.run("describe", "orders")

    assert code == 0
    assert "    sink totals: delta {'merge_keys': ['customer'], 'path': 'file:///lake/totals'}" in out.splitlines()
    assert "hunter22" not in out  # a credential-named option still stays out


def test_recover_apply_finishes_the_commit_and_aborts_the_timed_out_epoch(cli: Cli) -> None:
    orders, clicks = unfinished_epochs(cli.spec)

    reports = {r["pipeline"]: r for r in cli.json("recover", "--all", "--apply", "--timeout", "0.000001")}

    assert [(a["epoch"], a["action"], a["done"], a["error"]) for a in reports["orders"]["actions"]] == [
        (2, "finish-commit", True, "")]
    assert [(a["epoch"], a["action"], a["done"], a["error"]) for a in reports["clicks"]["actions"]] == [
        (1, "abort-timeout", True, "")]
    assert orders.state(2) is EpochState.COMMITTED
    assert published(orders, "orders") == {1: expected_files(ORDERS), 2: expected_files(ORDERS)}
    assert clicks.state(1) is EpochState.ABORTED
    assert published(clicks, "clicks") == {}
    assert staging_left(orders) == staging_left(clicks) == []
    # Nothing is left to do.
    assert cli.json("recover", "--all", "--apply", "--timeout", "0.000001") == [
        {"pipeline": "clicks", "dry_run": False, "actions": []},
        {"pipeline": "orders", "dry_run": False, "actions": []},
    ]


def test_recover_waits_for_a_prepared_epoch_within_the_configured_timeout(cli: Cli) -> None:
    orders, clicks = unfinished_epochs(cli.spec)

    code, out, _ = cli.run("recover", "clicks", "--apply")

    assert code == 0
    assert "wait" in out and "within timeout" in out
    assert clicks.state(1) is EpochState.PREPARED
    assert orders.state(2) is EpochState.COMMITTING  # only the named pipeline was recovered


def test_recover_refuses_a_timeout_of_zero(cli: Cli) -> None:
    # CheckpointConfig accepts prepared timeouts in (0, 604800] only; the CLI passes
    # --timeout through, so 0 ("abort every undecided epoch now") is bad input.
    _, clicks = unfinished_epochs(cli.spec)
    before = snapshot(cli.spec.storage())

    code, out, err = cli.run("recover", "--all", "--apply", "--timeout", "0")

    assert (code, out) == (2, "")
    assert err.startswith("error: prepared_timeout_s must be a number of seconds in (0, 604800], got 0")
    assert clicks.state(1) is EpochState.PREPARED
    assert snapshot(cli.spec.storage()) == before


def test_recover_all_on_an_empty_store_has_nothing_to_do(cli: Cli) -> None:
    make_empty_store(cli)
    assert cli.run("recover", "--all", "--apply") == (0, "(none)\n", "")
    assert cli.json("recover", "--all") == []


# -- commit and abort ------------------------------------------------------------------------


def test_commit_of_a_prepared_epoch_decides_and_publishes_it(cli: Cli) -> None:
    p = cli.spec.pipeline("orders")
    run_epoch(p, "run-1")
    epoch = prepare_participant(p, "run-2", Participant(sinks={"orders": [b"x", b"yy", b"zzz"]})).epoch

    result = cli.json("commit", "orders", str(epoch), "--reason", "operator says go")

    assert result["epoch"] == epoch
    assert result["already_committed"] is False
    assert [(s["sink"], s["rows"], s["files"], s["epoch_dir"]) for s in result["sinks"]] == [
        ("orders", 3, 3, f"epoch={epoch}")]
    assert p.state(epoch) is EpochState.COMMITTED
    decision = p.txlog.read_decision(epoch)
    assert decision is not None
    assert (decision.decision, decision.reason, decision.by) == (Decision.COMMIT, "operator says go", "cli")
    assert published(p, "orders")[epoch] == expected_files([b"x", b"yy", b"zzz"])
    assert staging_left(p) == []
    assert p.checkpoints.verify(epoch, deep=True) == []

    # Repeating it is harmless and says so.
    code, out, _ = cli.run("commit", "orders", str(epoch))
    assert code == 0
    target = cli.spec.sub_url("targets/orders/orders")
    assert out == f"committed epoch {epoch}: orders 3 rows, 3 files -> {target}/epoch={epoch}\n"
    assert cli.json("commit", "orders", str(epoch))["already_committed"] is True


def test_commit_of_an_epoch_nothing_prepared_exits_2_and_decides_nothing(cli: Cli) -> None:
    p = cli.spec.pipeline("orders")
    epoch = p.begin("run-1").epoch

    code, out, err = cli.run("commit", "orders", str(epoch))

    assert (code, out) == (2, "")
    assert err.startswith(f"error: pipeline 'orders' epoch {epoch}: cannot commit, not prepared")
    assert p.state(epoch) is EpochState.OPEN
    assert p.txlog.read_decision(epoch) is None


def test_abort_of_an_undecided_epoch_aborts_it(cli: Cli) -> None:
    p = cli.spec.pipeline("orders")
    run_epoch(p, "run-1")
    epoch = prepare_participant(p, "run-2", Participant(changes={1: 1})).epoch
    assert staging_left(p) != []

    code, out, err = cli.run("abort", "orders", str(epoch), "--reason", "bad input")

    assert (code, err) == (0, "")
    assert out == f"aborted epoch {epoch}: bad input\n"
    assert p.state(epoch) is EpochState.ABORTED
    decision = p.txlog.read_decision(epoch)
    assert decision is not None
    assert (decision.decision, decision.reason, decision.by) == (Decision.ABORT, "bad input", "cli")
    assert staging_left(p) == []
    assert not p.storage.exists(layout.checkpoint_dir(epoch))
    assert set(published(p, "orders")) == {1}

    # An aborted epoch can no longer be committed.
    code, out, err = cli.run("commit", "orders", str(epoch))
    assert (code, out) == (2, "")
    assert err == f"error: epoch {epoch} was already decided abort: bad input\n"
    assert p.state(epoch) is EpochState.ABORTED


def test_abort_of_a_commit_decided_epoch_is_refused_with_exit_2(cli: Cli) -> None:
    p = cli.spec.pipeline("orders")
    epoch = prepare_participant(p, "run-1", Participant(sinks={"orders": ORDERS})).epoch
    p.decide(epoch, Decision.COMMIT, "all prepared", by="test")

    code, out, err = cli.run("abort", "orders", str(epoch))

    assert (code, out) == (2, "")
    assert err == (f"error: pipeline 'orders' epoch {epoch} is already decided commit (all prepared); "
                   "it will not be aborted -- commit rolls it forward\n")
    assert p.state(epoch) is EpochState.COMMITTING
    assert staging_left(p) != []
    assert published(p, "orders") == {}

    # The way forward: commit rolls it forward.
    assert cli.run("commit", "orders", str(epoch))[0] == 0
    assert p.state(epoch) is EpochState.COMMITTED
    assert published(p, "orders") == {epoch: expected_files(ORDERS)}


# -- gc --------------------------------------------------------------------------------------


def four_incremental_epochs(spec: StoreSpec) -> Pipeline:
    """Epoch 4's checkpoint chains onto parts of epochs 1, 2 and 3."""
    p = spec.pipeline("orders")
    for epoch, changes in enumerate([{1: 10}, {2: 20}, {1: 11}, {3: 30}], start=1):
        assert run_epoch(p, f"run-{epoch}", Participant(changes=changes)) == epoch
    return p


def test_gc_dry_run_reports_and_removes_nothing(cli: Cli) -> None:
    p = four_incremental_epochs(cli.spec)
    before = snapshot(cli.spec.storage())

    report = cli.json("gc", "orders", "--keep", "2", "--dry-run")

    assert report["dry_run"] is True
    assert report["kept"] == [3, 4]
    assert report["removed_checkpoints"] == [1, 2]
    assert report["removed_files"] == 4  # what the real run removes (the next test)
    assert snapshot(cli.spec.storage()) == before
    assert all(p.checkpoints.has_metadata(e) for e in (1, 2, 3, 4))
    code, out, _ = cli.run("gc", "orders", "--keep", "2", "--dry-run")
    assert code == 0
    assert "would remove 0 parts of losing attempts" in out
    assert out.splitlines()[-1] == "(dry run: nothing changed; run it without --dry-run to carry it out)"
    assert snapshot(cli.spec.storage()) == before


def test_gc_removes_old_checkpoints_and_restore_still_works(cli: Cli) -> None:
    p = four_incremental_epochs(cli.spec)
    outputs = published(p, "orders")

    code, out, err = cli.run("gc", "orders", "--keep", "2")

    assert (code, err) == (0, "")
    # Epoch 4 chains onto parts of 1 and 2: their directories stay, and the message says so.
    assert out.startswith("kept checkpoints [3, 4]; removed the files of checkpoints [1, 2] except parts that "
                          "kept incremental checkpoints chain onto (those directories stay); ")
    assert "4 files removed" in out
    assert not p.checkpoints.has_metadata(1)
    assert not p.checkpoints.has_metadata(2)
    assert p.checkpoints.has_metadata(3) and p.checkpoints.has_metadata(4)
    assert p.txlog.is_retired(1) and p.txlog.is_retired(2)
    # Parts the kept incremental checkpoints still chain onto survived.
    for ref in p.checkpoints.read_metadata(4).parts():
        assert p.storage.exists(ref.path), ref.path
    point = p.restore_point()
    assert (point.epoch, point.how) == (4, "primary")
    assert restored_state(point) == {1: 11, 2: 20, 3: 30}
    assert published(p, "orders") == outputs  # retention never touches published output
    # Retired checkpoints are not damage.
    retired = {"state": "COMMITTED", "ok": True, "problems": [],
               "verdict": "ok (checkpoint removed by retention; log records intact)"}
    ok = {"state": "COMMITTED", "ok": True, "verdict": "ok", "problems": []}
    assert cli.json("verify", "orders") == [{"epoch": 1, **retired}, {"epoch": 2, **retired},
                                            {"epoch": 3, **ok}, {"epoch": 4, **ok}]

    # Keeping one: epoch 3 goes too, and the new epoch restores from 4.
    report = cli.json("gc", "orders", "--keep", "1")
    assert report["kept"] == [4]
    # 1 and 2 were retired by the first run; they are listed again only if something
    # they still hold is no longer referenced now that 3 goes too.
    assert 3 in report["removed_checkpoints"]
    assert report["removed_files"] > 0
    assert not p.checkpoints.has_metadata(3)
    assert cli.json("gc", "orders", "--keep", "1")["removed_checkpoints"] == [], "a repeated gc has nothing to do"
    code, out, _ = cli.run("show", "orders", "3")
    assert code == 0 and "removed by retention (retired)" in out
    run_epoch(p, "run-5", Participant(changes={2: 21}))
    assert restored_state(p.restore_point()) == {1: 11, 2: 21, 3: 30}


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["epochs", "../orders"], "error: pipeline name '../orders' is not allowed"),
        (["show", "a/b", "1"], "error: pipeline name 'a/b' is not allowed"),
        (["recover", "..", "--apply"], "error: pipeline name '..' is not allowed"),
        (["show", "orders", "-1"], "error: epoch -1 is out of range"),
        (["abort", "orders", "-2"], "error: epoch -2 is out of range"),
        (["verify", "orders", "0"], "error: epoch 0 is out of range"),
        (["--storage-options", "{not json", "pipelines"], "error: --storage-options is not valid JSON"),
        (["--storage-options", "[1, 2]", "pipelines"], "error: --storage-options must be a JSON object"),
        (["gc", "orders", "--keep", "0"], "error: max_retain must be an integer >= 1"),
        (["recover"], "error: name a pipeline or pass --all"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message_and_changes_nothing(
    cli: Cli, args: list[str], message: str
) -> None:
    p = cli.spec.pipeline("orders")
    run_epoch(p, "run-1")
    prepare_participant(p, "run-2", Participant())
    before = snapshot(cli.spec.storage())

    code, out, err = cli.run(*args)

    assert (code, out) == (2, "")
    assert err.startswith(message), err
    assert err.count("\n") == 1  # one line, no traceback
    assert snapshot(cli.spec.storage()) == before


def test_storage_options_json_errors_do_not_echo_the_options(cli: Cli) -> None:
    code, out, err = cli.run("--storage-options", f'{{"secret": "{SECRET}"', "pipelines")

    assert (code, out) == (2, "")
    assert err.startswith("error: --storage-options is not valid JSON")
    assert SECRET not in err


def test_storage_options_from_the_environment_are_used(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    make_empty_store(cli)
    monkeypatch.setenv("SEATUNNEL_CKPT_STORAGE_OPTIONS", "not json")
    code, _, err = cli.run("pipelines")
    assert code == 2
    assert err.startswith("error: --storage-options is not valid JSON")
    # An explicit flag wins over the environment.
    assert cli.run("--storage-options", "{}", "pipelines") == (0, "(none)\n", "")


@pytest.mark.parametrize(
    "url",
    [
        f"file://operator:{SECRET}@/var/ckpt",
        f"s3://AKIAEXAMPLE:{SECRET}@bucket/ckpt",
        f"memory://user:{SECRET}@root/ckpt",
    ],
)
@pytest.mark.parametrize("args", [["pipelines"], ["--json", "epochs", "orders"], ["recover", "--all", "--apply"]])
def test_a_store_url_with_a_password_is_refused_and_redacted(cli: Cli, url: str, args: list[str]) -> None:
    code, out, err = cli.run(*args, store=url)

    assert code == 2
    if "--json" in args:  # errors are JSON on stdout too
        assert "carries a password" in json.loads(out)["error"]["message"]
    else:
        assert out == ""
    assert "carries a password" in err
    assert "://***@" in err
    assert SECRET not in out + err


def test_bad_usage_is_rejected_by_the_argument_parser(cli: Cli) -> None:
    for args in (["show", "orders", "twelve"], ["frobnicate"], [], ["epochs", "orders", "--last", "-1"],
                 ["verify", "orders", "--last", "0"], ["epochs", "orders", "--last", "x"]):
        with pytest.raises(SystemExit) as exc:
            main(["--store", cli.url, *args])
        assert exc.value.code == 2, args
    assert "must be at least 1, got -1" in cli._capsys.readouterr().err


def test_common_options_are_accepted_after_the_subcommand(cli: Cli) -> None:
    committed_history(cli.spec)
    cli._capsys.readouterr()

    code = main(["pipelines", "--store", cli.url, "--json"])

    out, _ = cli._capsys.readouterr()
    assert code == 0
    assert sorted(r["pipeline"] for r in json.loads(out)) == ["clicks", "orders"]


# -- the installed console script ------------------------------------------------------------


def console_script() -> str:
    """``seatunnel-ckpt`` next to the running interpreter (the virtualenv's bin/)."""
    path = Path(sys.executable).parent / "seatunnel-ckpt"
    found = str(path) if path.exists() else shutil.which("seatunnel-ckpt")
    assert found, "the seatunnel-ckpt console script is not installed"
    return found


def test_the_installed_console_script(cli: Cli) -> None:
    p = committed_history(cli.spec)
    flip_byte(p.storage, operator_part(p, 2))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEATUNNEL_CKPT_")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([console_script(), "--store", cli.url, "--json", *args], capture_output=True,
                              text=True, env=env, timeout=60, check=False)

    epochs = run("epochs", "orders")
    assert epochs.returncode == 0, epochs.stderr
    assert [(s["epoch"], s["state"]) for s in json.loads(epochs.stdout)] == [
        (1, "COMMITTED"), (2, "COMMITTED"), (3, "COMMITTED")]

    verify = run("verify", "orders")
    assert verify.returncode == 1, verify.stderr
    assert [r["ok"] for r in json.loads(verify.stdout)] == [True, False, False]


# -- retain (gc) and cat ---------------------------------------------------------------------


def test_retain_is_the_command_and_gc_its_unlisted_alias(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    four_incremental_epochs(cli.spec)
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = capsys.readouterr().out
    commands = [line.split()[0] for line in listing.split("COMMAND\n", 1)[1].split("options:")[0].splitlines()
                if line.startswith("    ") and not line.startswith("     ")]
    assert "retain" in commands and "cat" in commands and "gc" not in commands, commands

    preview = cli.json("retain", "orders", "--keep", "2", "--dry-run")
    assert preview == cli.json("gc", "orders", "--keep", "2", "--dry-run")
    assert cli.json("retain", "orders", "--keep", "2")["removed_checkpoints"] == [1, 2]


def test_cat_prints_a_log_record_and_metadata_as_json(cli: Cli) -> None:
    p = committed_history(cli.spec)

    decision = cli.json("cat", f"orders/{layout.record_path(2, 'decision')}")
    assert decision["json"] == p.txlog.read_decision(2).to_dict()  # type: ignore[union-attr]
    assert decision["frame"]["kind"] == "json"

    meta = cli.json("cat", f"orders/{layout.metadata_path(3)}")
    assert meta["json"] == p.checkpoints.read_metadata(3).to_dict()
    code, out, err = cli.run("cat", f"orders/{layout.metadata_path(3)}")
    assert code == 0 and err == ""
    assert '"type": "checkpoint"' in out and "json frame v1, epoch 0" in out


def test_cat_shows_an_arrow_part_as_schema_and_rows(cli: Cli) -> None:
    p = committed_history(cli.spec)
    part = operator_part(p, 2)

    doc = cli.json("cat", f"orders/{part}")

    assert doc["frame"]["kind"] == "arrow" and doc["frame"]["epoch"] == 2
    assert doc["schema"] == ["k: int64", "v: int64"]
    assert doc["rows"] == [{"k": 2, "v": 20}] and doc["num_rows"] == 1
    code, out, _ = cli.run("cat", f"orders/{part}")
    assert code == 0 and "schema: k: int64, v: int64" in out and "1 rows" in out


def test_cat_takes_a_full_url_and_reads_plain_json_files(cli: Cli) -> None:
    p = committed_history(cli.spec)
    marker = cli.json("cat", p.storage.url_of(layout.sink_marker_path(3, "orders")))
    assert marker["json"]["type"] == "sink_prepared" and marker["json"]["epoch"] == 3

    assert 1 in published(p, "orders")
    success = cli.json("cat", f"{cli.spec.sub_url('store')}/../targets/orders/orders/epoch=1/_SUCCESS")
    assert success["frame"] is None and success["json"]["epoch"] == 1


def test_cat_of_a_missing_or_damaged_file_names_it(cli: Cli) -> None:
    p = committed_history(cli.spec)
    code, _, err = cli.run("cat", "orders/checkpoint_9/_metadata")
    assert code == 2 and "checkpoint_9/_metadata: no such file" in err

    flip_byte(p.storage, layout.metadata_path(2))
    code, _, err = cli.run("cat", f"orders/{layout.metadata_path(2)}")
    assert code == 1 and "checkpoint_2/_metadata" in err


# -- guardrails: unknown names, --json errors, pipes, help -----------------------------------


@pytest.mark.parametrize("args", [["epochs", "nosuch"], ["verify", "nosuch"], ["show", "nosuch", "1"],
                                  ["recover", "nosuch", "--apply"], ["retain", "nosuch"], ["gc", "nosuch"],
                                  ["describe", "nosuch"], ["commit", "nosuch", "1"], ["abort", "nosuch", "1"]])
def test_an_unknown_pipeline_exits_2_and_names_the_pipelines_the_store_has(cli: Cli, args: list[str]) -> None:
    committed_history(cli.spec)
    before = snapshot(cli.spec.storage())

    code, out, err = cli.run(*args)

    assert (code, out) == (2, "")
    assert err == (f"error: pipeline 'nosuch' not found in {cli.url}: it has no transaction log (_txlog) and no "
                   "descriptor (_descriptor). Pipelines in this store: clicks, orders; check the name and --store\n")
    assert snapshot(cli.spec.storage()) == before


@pytest.mark.parametrize("args", [["pipelines"], ["epochs", "orders"], ["verify", "orders"], ["recover", "--all"],
                                  ["cat", "orders/_txlog/epoch-000000000001/begin"]])
def test_a_store_that_does_not_exist_is_an_error_not_an_empty_list(
    cli: Cli, tmp_path: Path, args: list[str]
) -> None:
    missing = tmp_path / "nonexistent"

    code, out, err = cli.run(*args, store=f"file://{missing}")

    assert (code, out) == (2, "")
    assert err.startswith(f"error: no store at file://{missing}: that directory (or bucket prefix) does not "
                          "exist. Check --store"), err
    assert not missing.exists()  # looking did not create it


def test_json_errors_are_a_json_object_on_stdout_with_a_non_zero_exit(cli: Cli) -> None:
    p = committed_history(cli.spec)

    code, out, _ = cli.run("--json", "epochs", "nosuch")
    assert code == 2
    error = json.loads(out)["error"]
    assert (error["type"], error["exit_code"]) == ("PipelineNotFoundError", 2)
    assert error["message"].startswith("pipeline 'nosuch' not found in ")

    flip_byte(p.storage, layout.metadata_path(2))
    code, out, _ = cli.run("cat", f"orders/{layout.metadata_path(2)}", "--json")
    assert code == 1
    error = json.loads(out)["error"]
    assert error["exit_code"] == 1 and "checkpoint_2/_metadata" in error["message"]

    # Usage errors too: argparse's exit code, and JSON for the script that asked for it.
    with pytest.raises(SystemExit) as exc:
        main(["--store", cli.url, "--json", "show", "orders", "twelve"])
    assert exc.value.code == 2
    out, err = cli._capsys.readouterr()
    assert "invalid int value: 'twelve'" in json.loads(out)["error"]["message"]
    assert err.startswith("usage: seatunnel-ckpt show")


def test_output_into_a_closed_pipe_ends_quietly_without_a_traceback(cli: Cli) -> None:
    committed_history(cli.spec)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEATUNNEL_CKPT_")}
    # Like `seatunnel-ckpt epochs orders | head -0`: the reader is gone before the first write.
    proc = subprocess.Popen([console_script(), "--store", cli.url, "--json", "epochs", "orders"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)

    assert err == ""
    assert code == 141


def test_every_command_has_a_description_and_the_help_shows_no_markup(
    cli: Cli, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from airflow_seatunnel_ckpt.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    commands = sorted(sub.choices)
    assert {"pipelines", "epochs", "verify", "retain", "gc", "cat"} <= set(commands)
    for command in [*commands, None]:
        with pytest.raises(SystemExit) as exc:
            main([command, "--help"] if command else ["--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        # After the usage block comes a description, not straight the argument list.
        description = text.split("\n\n")[1]
        assert not description.startswith(("positional arguments", "options")), (command, text)
        assert len(description.split()) >= 5, (command, description)
        for markup in ("``", ":func:", ":class:", ":mod:", ":meth:"):
            assert markup not in text, (command, markup)


# -- guardrails: verify, epochs ---------------------------------------------------------------


def test_verify_of_an_open_epoch_says_in_progress_not_damaged(cli: Cli) -> None:
    p = committed_history(cli.spec)
    epoch = p.begin("run-4").epoch

    code, out, err = cli.run("verify", "orders", str(epoch))

    assert (code, err) == (0, "")
    assert out == (f"epoch {epoch}: in progress (OPEN: its stage runs; its checkpoint is completed when it is "
                   "decided commit)\n")
    assert cli.json("verify", "orders", "--last", "2") == [
        {"epoch": 3, "state": "COMMITTED", "ok": True, "verdict": "ok", "problems": []},
        {"epoch": 4, "state": "OPEN", "ok": True, "problems": [],
         "verdict": "in progress (OPEN: its stage runs; its checkpoint is completed when it is decided commit)"}]


def test_verify_checks_the_transaction_log_records(cli: Cli) -> None:
    p = committed_history(cli.spec)
    damaged = layout.record_path(1, "prepared-ingest")
    flip_byte(p.storage, damaged)

    code, out, err = cli.run("verify", "orders")

    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[:3] == ["epoch 1: DAMAGED", "epoch 2: ok", "epoch 3: ok"]
    assert lines[3].startswith(f"  {p.storage.describe_path(damaged)}: ")
    results = json.loads(cli.run("--json", "verify", "orders", "1")[1])
    assert results[0]["ok"] is False and damaged in results[0]["problems"][0]


@pytest.mark.parametrize("record", ["prepared-ingest", "decision", "begin"])
def test_epochs_shows_one_damaged_record_and_lists_the_other_epochs(cli: Cli, record: str) -> None:
    p = committed_history(cli.spec)
    damaged = layout.record_path(1, record)
    flip_byte(p.storage, damaged)

    code, out, err = cli.run("epochs", "orders")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1].split()[:2] == ["1", "COMMITTED"]
    assert lines[1].endswith(f"DAMAGED record {p.storage.describe_path(damaged)}")
    assert [line.split()[:2] for line in lines[2:4]] == [["2", "COMMITTED"], ["3", "COMMITTED"]]
    assert lines[4] == ("note: epochs [1] have a damaged log record (named above); `seatunnel-ckpt verify orders` "
                        "checks every record and checkpoint")
    entries = cli.json("epochs", "orders")
    assert damaged in entries[0]["damaged"] and entries[0]["state"] == "COMMITTED"
    assert [e["state"] for e in entries[1:]] == ["COMMITTED", "COMMITTED"]


def test_epochs_shows_the_logical_date_and_rows_per_sink(cli: Cli) -> None:
    p = cli.spec.pipeline("orders")
    first = p.begin("scheduled__2026-11-20", logical_date="2026-11-20T00:00:00+00:00")
    assert p.begin("scheduled__2026-11-20", logical_date="2026-11-21T00:00:00+00:00") == first  # first wins
    run_epoch(p, "scheduled__2026-11-20", Participant(sinks={"orders": ORDERS, "clicks": [b"c1"]}))
    prepare_participant(p, "manual__1", Participant(sinks={"orders": [b"x", b"y", b"z"]}))

    code, out, _ = cli.run("epochs", "orders")

    assert code == 0
    lines = out.splitlines()
    assert lines[1].split()[:6] == ["1", "COMMITTED", "2026-11-20T00:00:00+00:00", "scheduled__2026-11-20",
                                    "ingest@1", "clicks=1,orders=2"]
    assert lines[2].split() == ["2", "PREPARED", "-", "manual__1", "ingest@1", "orders=3", "-"]
    entries = cli.json("epochs", "orders")
    assert [(e["logical_date"], e["rows"]) for e in entries] == [
        ("2026-11-20T00:00:00+00:00", {"clicks": 1, "orders": 2}), (None, {"orders": 3})]


def test_the_logical_date_is_optional_in_the_begin_record() -> None:
    from airflow_seatunnel_ckpt.core.models import BeginRecord

    old = {"type": "begin", "epoch": 1, "run_id": "r", "created_at": 1.0, "dag_id": "d"}
    assert BeginRecord.from_dict(old).logical_date == ""
    assert BeginRecord.from_dict(old).to_dict() == old  # written only when set
    dated = BeginRecord(1, "r", 1.0, "d", "2026-11-20T00:00:00+00:00")
    assert BeginRecord.from_dict(dated.to_dict()) == dated


# -- guardrails: retain ------------------------------------------------------------------------


def test_retain_dry_run_reports_exactly_what_the_real_run_does(cli: Cli) -> None:
    p = four_incremental_epochs(cli.spec)
    # A part of a losing attempt in a kept checkpoint: the real run sweeps it.
    losing = f"{layout.checkpoint_dir(4)}/operators/seen/part-0-9"
    p.storage.write_atomic(losing, b"a killed attempt's part")

    dry_code, dry_text, _ = cli.run("retain", "orders", "--keep", "2", "--dry-run")
    dry = cli.json("retain", "orders", "--keep", "2", "--dry-run")
    real_code, real_text, _ = cli.run("retain", "orders", "--keep", "2")

    assert dry["partly_kept"] == [1, 2] and dry["removed_unreferenced"] == [losing]
    assert dry["removed_files"] == 5
    assert (dry_code, real_code) == (0, 0)
    assert dry_text.replace("would keep", "kept").replace("would remove", "removed").replace(
        "would be removed", "removed").removesuffix(
        "(dry run: nothing changed; run it without --dry-run to carry it out)\n") == real_text
    # Their directories stay (epoch 4 chains onto parts in them); the message never said otherwise.
    assert p.storage.exists(layout.checkpoint_dir(1)) and p.storage.exists(layout.checkpoint_dir(2))
    assert "removed checkpoints [1, 2]" not in real_text
    assert not p.storage.exists(losing)


def test_retain_dry_run_json_matches_the_real_run_json(cli: Cli) -> None:
    p = four_incremental_epochs(cli.spec)
    p.storage.write_atomic(f"{layout.checkpoint_dir(4)}/operators/seen/part-0-9", b"a killed attempt's part")

    dry = cli.json("retain", "orders", "--keep", "1", "--dry-run")
    real = cli.json("retain", "orders", "--keep", "1")

    assert dry == real | {"dry_run": True}
    assert real["removed_files"] > 0 and real["partly_kept"]


def test_a_damaged_decision_shows_as_damaged_in_pipelines_epochs_and_verify(cli: Cli) -> None:
    orders, _ = unfinished_epochs(cli.spec)
    damaged = layout.record_path(2, "decision")  # orders epoch 2 is COMMITTING: its state needs it
    flip_byte(orders.storage, damaged)

    code, out, err = cli.run("pipelines")
    assert (code, err) == (0, "")
    assert sorted(line.split() for line in out.splitlines()[1:]) == [
        ["clicks", "1", "-", "1", "PREPARED"], ["orders", "2", "?", "2", "DAMAGED"]]

    code, out, _ = cli.run("epochs", "orders")
    assert code == 0
    assert out.splitlines()[1].split()[:2] == ["1", "COMMITTED"]
    assert out.splitlines()[2].split()[:2] == ["2", "UNKNOWN"]
    assert out.splitlines()[2].endswith(f"DAMAGED record {orders.storage.describe_path(damaged)}")

    code, out, _ = cli.run("verify", "orders")
    assert code == 1
    assert out.splitlines()[:2] == ["epoch 1: ok", "epoch 2: DAMAGED"]
    assert orders.storage.describe_path(damaged) in out.splitlines()[2]


@pytest.mark.spark
def test_show_gives_a_cdc_epochs_lsn_range_its_changes_by_operation_and_the_slots_lag(
        spark: Any, tmp_path: Path, postgres_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.spark.test_postgres_sources import cdc_epochs

    lake = cdc_epochs(spark, tmp_path, postgres_db)
    offsets = lake.store_pipeline().txlog.read_prepared(2, "ingest").sources["db"].offsets
    assert offsets["changes"] == {"insert": 2, "update": 1, "delete": 1}  # counted where the rows were read

    assert main(["--store", lake.store["storage_url"], "show", "db", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (f"  input db: LSN {offsets['lsns']}, 2 inserts, 1 update, 1 delete, "
                        f"slot lag {offsets['lag_bytes']} bytes")
    assert offsets["lsns"].count("/") == 2 and offsets["lag_bytes"] > 0
    assert main(["--store", lake.store["storage_url"], "show", "db", "1"]) == 0
    assert "  input db: LSN " in capsys.readouterr().out.splitlines()[1]
    assert main(["--store", lake.store["storage_url"], "--json", "show", "db", "1"]) == 0
    first = json.loads(capsys.readouterr().out)["input"]["db"]
    assert "with the snapshot, 2 inserts, 0 updates, 0 deletes" in first
