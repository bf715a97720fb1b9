"""Which column type changes of a stored keyed state are compatible: widening a value column only."""

from __future__ import annotations

import pytest

from airflow_seatunnel_ckpt.core.protocol.descriptor import StateDescriptor, state_changes, widens


@pytest.mark.parametrize(("old", "new", "wider"), [
    ("int", "bigint", True), ("tinyint", "int", True), ("smallint", "bigint", True),
    ("float", "double", True), ("int", "double", True), ("decimal(10,2)", "decimal(12,2)", True),
    ("decimal(10,2)", "decimal(12,4)", True),
    ("bigint", "int", False), ("double", "float", False), ("double", "bigint", False), ("bigint", "double", False),
    ("decimal(10,2)", "decimal(10,4)", False), ("decimal(12,2)", "decimal(10,2)", False), ("int", "int", False),
    ("int", "string", False), ("date", "timestamp", False),
])
def test_widens_only_to_a_type_that_holds_every_value_exactly(old: str, new: str, wider: bool) -> None:
    assert widens(old, new) is wider


def _totals(top: str, customer: str = "string") -> StateDescriptor:
    return StateDescriptor("key_value", ["customer"], 4, {"top": ["max", "amount"]},
                           [{"name": "customer", "type": customer}, {"name": "top", "type": top}])


def test_a_widened_value_column_is_compatible_and_a_narrowed_or_key_column_change_is_refused() -> None:
    widened = state_changes(_totals("int"), _totals("bigint"))
    assert (widened.refused, widened.compatible) == ([], ["column 'top' widened int -> bigint"])
    assert state_changes(_totals("bigint"), _totals("int")).refused == ["column 'top' type bigint -> int"]
    key = StateDescriptor("key_value", ["id"], 4, {"top": ["max", "amount"]},
                          [{"name": "id", "type": "int"}, {"name": "top", "type": "int"}])
    wider_key = StateDescriptor("key_value", ["id"], 4, {"top": ["max", "amount"]},
                                [{"name": "id", "type": "bigint"}, {"name": "top", "type": "int"}])
    assert state_changes(key, wider_key).refused == ["column 'id' type int -> bigint"]
