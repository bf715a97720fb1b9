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
    assert cli.run("pipelines") == (0, "(none)\n", "")
    assert cli.json("pipelines") == []


def test_epochs_lists_states_participants_and_decisions(cli: Cli) -> None:
    committed_history(cli.spec)

    code, out, err = cli.run("epochs", "clicks")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["EPOCH", "STATE", "RUN_ID", "PARTICIPANTS", "ROWS", "DECISION"]
    assert lines[1].split() == ["1", "COMMITTED", "c-1", "ingest@1", "1", "commit:", "all", "prepared"]
    assert lines[2].split() == ["2", "PREPARED", "c-2", "ingest@1", "1", "-"]
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


def test_epochs_of_a_pipeline_without_a_log_lists_none(cli: Cli) -> None:
    committed_history(cli.spec)
    assert cli.run("epochs", "nothing-here") == (0, "(none)\n", "")


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
    assert cli.json("verify", "orders", "--last", "1") == [{"epoch": 3, "ok": True, "problems": []}]
    assert cli.json("verify", "orders", "2") == [{"epoch": 2, "ok": True, "problems": []}]


def test_verify_without_committed_checkpoints_says_so(cli: Cli) -> None:
    assert cli.run("verify", "orders") == (0, "no committed checkpoints\n", "")


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
    problems = lines[3:]
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
    assert report["removed_files"] == 0
    assert snapshot(cli.spec.storage()) == before
    assert all(p.checkpoints.has_metadata(e) for e in (1, 2, 3, 4))
    code, out, _ = cli.run("gc", "orders", "--keep", "2", "--dry-run")
    assert code == 0
    assert "would remove 0 parts" in out
    assert snapshot(cli.spec.storage()) == before


def test_gc_removes_old_checkpoints_and_restore_still_works(cli: Cli) -> None:
    p = four_incremental_epochs(cli.spec)
    outputs = published(p, "orders")

    code, out, err = cli.run("gc", "orders", "--keep", "2")

    assert (code, err) == (0, "")
    assert out.startswith("kept [3, 4]; removed checkpoints [1, 2] (")
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
    assert cli.json("verify", "orders") == [{"epoch": 3, "ok": True, "problems": []},
                                            {"epoch": 4, "ok": True, "problems": []}]

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

    assert (code, out) == (2, "")
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
