"""Typed connector options: an entry is checked once, with errors that name the way out."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.options import Options, keyed, option_table, parse


class _Table(Options):
    type: Literal["table"] = "table"
    table: str
    """The table, ``schema.name``."""
    mode: Literal["append", "upsert"] = "append"
    """How each epoch's rows land."""
    merge_keys: list[str] = Field(default_factory=list)


MODELS = keyed(_Table)


def test_an_entry_becomes_its_typed_model_with_defaults() -> None:
    got = parse("sink", "out", {"type": "table", "table": "s.t"}, MODELS)
    assert isinstance(got, _Table) and (got.table, got.mode, got.merge_keys) == ("s.t", "append", [])
    assert got.to_dict() == {"type": "table", "table": "s.t", "mode": "append", "merge_keys": []}


def test_an_unknown_option_is_refused_with_the_nearest_name_and_a_missing_one_named() -> None:
    with pytest.raises(ConfigError, match=r"sink 'out' \(type 'table'\): missing required option 'table'; "
                                          r"unknown option 'tabel' \(did you mean 'table'\?\)"):
        parse("sink", "out", {"type": "table", "tabel": "s.t"}, MODELS)


def test_an_unknown_type_and_a_bad_value_are_refused_naming_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"unknown type 'tabel'; known types: \['table'\]"):
        parse("sink", "out", {"type": "tabel"}, MODELS)
    with pytest.raises(ConfigError, match=r"option 'mode': input should be 'append' or 'upsert' \(found 'merge'\)"):
        parse("sink", "out", {"type": "table", "table": "s.t", "mode": "merge"}, MODELS)


def test_the_reference_table_comes_from_the_model() -> None:
    table = option_table(_Table)
    assert "| `table` | str | required | The table, ``schema.name``. |" in table
    assert '| `mode` | `"append"` \\| `"upsert"` | `\'append\'` | How each epoch\'s rows land. |' in table
