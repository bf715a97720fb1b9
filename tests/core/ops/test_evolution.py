"""Evolution commands: rename, drop, reset and rescale keyed state through an audited epoch."""

from __future__ import annotations

import json

import pytest

from airflow_seatunnel_ckpt.core import Pipeline
from airflow_seatunnel_ckpt.core.models import EpochState
from airflow_seatunnel_ckpt.core.ops.evolution import (
    EvolutionError,
    drop_state,
    rename_state,
    rescale,
    reset_state,
)
from airflow_seatunnel_ckpt.core.protocol.descriptor import (
    ParticipantDescriptor,
    StateDescriptor,
    ensure_descriptor,
    read_descriptor,
    record_states,
)
from airflow_seatunnel_ckpt.core.state.key_groups import key_groups_of
from tests.core.conftest import StoreSpec
from tests.core.epochs import OPERATOR, Participant, prepare_participant, restored_state, run_epoch

VALUES = {1: 10, 2: 20, 3: 30, 4: 40, 5: 50, 17: 170}


def _pipeline_with_state(spec: StoreSpec) -> Pipeline:
    pipeline = spec.pipeline()
    ensure_descriptor(pipeline, dag_id="orders_dag", participants={"ingest": ParticipantDescriptor()})
    record_states(pipeline, "ingest", {OPERATOR: StateDescriptor("key_value", ["k"], 4, {"v": ["sum", "x"]},
                                                                 [{"name": "k", "type": "bigint"},
                                                                  {"name": "v", "type": "bigint"}])})
    run_epoch(pipeline, "run-1", Participant(changes={1: 10, 2: 20, 3: 30},
                                             sources={"orders": {"files": ["a"]}}))
    run_epoch(pipeline, "run-2", Participant(changes={4: 40, 5: 50, 17: 170},
                                             sources={"orders": {"files": ["b"]}}))
    return pipeline


def test_rename_keeps_every_value_under_the_new_name_in_an_audited_epoch(local_spec: StoreSpec) -> None:
    pipeline = _pipeline_with_state(local_spec)

    result = rename_state(pipeline, OPERATOR, "totals", reason="clearer name", by="alice")

    point = pipeline.restore_point()
    assert point.epoch == result.epoch == 3
    assert OPERATOR not in point.operators
    assert restored_state(point, "totals") == VALUES
    # Every new part lives under the new name (no reference into the old state's folder).
    assert all("/operators/totals/" in p.path for p in point.operators["totals"].parts())
    status = pipeline.status(result.epoch)
    assert status.state is EpochState.COMMITTED
    assert status.run_id is not None and status.run_id.startswith("evolution__rename__")
    assert status.decision is not None and status.decision.by == "alice"
    assert "clearer name" in status.decision.reason
    # The source's consumed history is carried through the evolution epoch.
    assert [e["offsets"] for e in point.source_entries("orders")] == [{"files": ["a"]}, {"files": ["b"]}]
    descriptor = read_descriptor(pipeline.storage)
    assert descriptor is not None
    assert set(descriptor.participants["ingest"].states) == {"totals"}
    # A stage epoch after the rename continues from the renamed state.
    next_epoch = pipeline.begin("run-4").epoch
    record = prepare_participant(pipeline, "run-4", Participant(changes={6: 60}), epoch=next_epoch)
    assert record.base_epoch == result.epoch


def test_drop_and_reset_remove_the_state_and_its_shape(local_spec: StoreSpec) -> None:
    pipeline = _pipeline_with_state(local_spec)

    reset = reset_state(pipeline, OPERATOR)
    assert restored_state(pipeline.restore_point()) == {}
    assert pipeline.status(reset.epoch).decision.reason.startswith("reset:")  # type: ignore[union-attr]
    descriptor = read_descriptor(pipeline.storage)
    assert descriptor is not None and OPERATOR not in descriptor.participants["ingest"].states

    with pytest.raises(EvolutionError, match=r"has no keyed state 'seen' to drop .*seatunnel-ckpt describe"):
        drop_state(pipeline, OPERATOR)


def test_rescale_places_every_row_in_the_key_group_sparks_hash_gives(local_spec: StoreSpec) -> None:
    pipeline = _pipeline_with_state(local_spec)

    result = rescale(pipeline, 7)

    point = pipeline.restore_point()
    op = point.operators[OPERATOR]
    assert op.key_groups == 7 and point.epoch == result.epoch
    assert restored_state(point) == VALUES
    from airflow_seatunnel_ckpt.core.state.checkpoint import read_chain
    for group, chain in op.chains.items():
        table = read_chain(pipeline.storage, chain, ["k"])
        assert set(key_groups_of(table, ["k"], 7)) == {group}
    descriptor = read_descriptor(pipeline.storage)
    assert descriptor is not None and descriptor.participants["ingest"].states[OPERATOR].key_groups == 7
    with pytest.raises(EvolutionError, match="already has 7 key groups"):
        rescale(pipeline, 7)


def test_an_evolution_command_refuses_while_an_epoch_is_in_flight(local_spec: StoreSpec) -> None:
    pipeline = _pipeline_with_state(local_spec)
    prepare_participant(pipeline, "run-3", Participant(changes={9: 90}))

    with pytest.raises(EvolutionError, match=r"cannot rename while epoch 3 is PREPARED .*recover orders --apply"):
        rename_state(pipeline, OPERATOR, "totals")
    assert pipeline.epochs() == [1, 2, 3]


def test_rename_refuses_an_existing_target_and_leaves_nothing_in_flight(local_spec: StoreSpec) -> None:
    pipeline = _pipeline_with_state(local_spec)
    with pytest.raises(EvolutionError, match="already exists"):
        rename_state(pipeline, OPERATOR, OPERATOR)
    assert pipeline.epochs() == [1, 2]


def test_the_cli_renames_resets_and_rescales_with_who_and_why_in_the_log(
        local_spec: StoreSpec, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_seatunnel_ckpt.cli import main

    pipeline = _pipeline_with_state(local_spec)
    store = ["--store", local_spec.sub_url("store")]

    assert main([*store, "state", "rename", "orders", OPERATOR, "totals", "--reason", "clearer", "--by", "bob"]) == 0
    assert "rename committed as evolution epoch 3" in capsys.readouterr().out
    assert main(["rescale", "orders", "--key-groups", "2", *store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["states"] == {"totals": "4 -> 2 key groups"}
    assert restored_state(pipeline.restore_point(), "totals") == VALUES

    assert main([*store, "state", "drop", "orders", "nope"]) == 2
    err = capsys.readouterr().err
    assert "has no keyed state 'nope' to drop" in err and "seatunnel-ckpt describe orders" in err
    decision = pipeline.status(3).decision
    assert decision is not None and (decision.by, decision.reason) == ("bob", "rename: clearer")
    assert pipeline.epochs() == [1, 2, 3, 4]


def test_a_command_that_fails_half_way_aborts_its_epoch_and_changes_nothing(local_spec: StoreSpec) -> None:
    import decimal

    import pyarrow as pa

    from airflow_seatunnel_ckpt.core import Decision, OperatorState, layout
    from airflow_seatunnel_ckpt.core.state.checkpoint import write_arrow_part
    from airflow_seatunnel_ckpt.core.state.key_groups import UnsupportedKeyTypeError

    pipeline = local_spec.pipeline()
    epoch = pipeline.begin("run-1").epoch
    table = pa.table({"k": pa.array([decimal.Decimal("1.5")], pa.decimal128(10, 2)), "v": pa.array([1])})
    ref = write_arrow_part(pipeline.storage, layout.part_path(epoch, "operators", "prices", 0, 1), table,
                           epoch=epoch, key_group=0)
    pipeline.prepare(epoch, "ingest", 1, run_id="run-1", sinks=[],
                     operators={"prices": OperatorState(1, ["k"], {0: [ref]}, "key_value")})
    pipeline.decide(epoch, Decision.COMMIT, "test", "test")
    pipeline.commit(epoch)

    with pytest.raises(UnsupportedKeyTypeError, match=r"key column 'k' has type decimal128\(10, 2\)"):
        rescale(pipeline, 4)

    assert pipeline.state(2) is EpochState.ABORTED  # nothing left in flight
    point = pipeline.restore_point()
    assert point.epoch == 1 and point.operators["prices"].key_groups == 1


def test_state_changes_lists_what_would_misread_stored_values() -> None:
    from airflow_seatunnel_ckpt.core.protocol.descriptor import state_changes

    schema = [{"name": "c", "type": "string"}, {"name": "total", "type": "double"}]
    recorded = StateDescriptor("key_value", ["c"], 4, {"total": ["sum", "amount"]}, schema)
    same = state_changes(recorded, recorded)
    assert (same.refused, same.compatible) == ([], [])
    changed = state_changes(recorded, StateDescriptor(
        "key_value", ["c"], 4, {"total": ["max", "amount"], "n": ["count", "*"]},
        [*schema[:1], {"name": "total", "type": "bigint"}, {"name": "n", "type": "bigint"}]))
    assert changed.refused == ["aggregate column 'total': sum(amount) -> max(amount)",
                               "column 'total' type double -> bigint"]
    assert changed.compatible == ["new aggregate column 'n' (count of *), empty for stored keys"]
    removed = state_changes(recorded, StateDescriptor("key_value", ["d"], 4, {"n": ["count", "*"]}, None))
    assert removed.refused == ["key columns ['c'] -> ['d']", "aggregate column 'total' (sum of amount) removed"]
