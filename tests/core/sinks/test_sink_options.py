"""Typed sink options: one model per type, one mode vocabulary."""

from __future__ import annotations

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import SinkManifest, SinkMode
from airflow_seatunnel_ckpt.core.options import option_table, parse
from airflow_seatunnel_ckpt.core.sinks.options import SINK_OPTIONS


@pytest.mark.parametrize(("options", "problem"), [
    ({"type": "file", "path": "/out", "mode": "upsert"}, "option 'mode': input should be 'append' or 'snapshot'"),
    ({"type": "postgres", "table": "t", "conninfo": "host=db", "mode": "snapshot"},
     "option 'mode': input should be 'append' or 'upsert'"),
    ({"type": "delta", "path": "/t", "mode": "upsert"}, "mode 'upsert' needs merge_keys"),
    ({"type": "iceberg", "table": "lake.t", "mode": "append", "merge_keys": ["k"]},
     "merge_keys ['k'] with mode 'append'"),
    ({"type": "delta", "path": "/t", "merge_key": ["k"]}, "unknown option 'merge_key' (did you mean 'merge_keys'?)"),
    ({"type": "iceberg", "table": "orders"}, "'<namespace>.<name>'"),
], ids=["file-upsert", "postgres-snapshot", "upsert-without-keys", "keys-on-append", "near-name", "iceberg-name"])
def test_sink_options_are_refused_when_declared_naming_the_sink_and_the_problem(options: dict[str, object],
                                                                                 problem: str) -> None:
    with pytest.raises(ConfigError, match="sink 'out'") as refused:
        parse("sink", "out", options, SINK_OPTIONS)
    assert problem in str(refused.value)


def test_one_mode_vocabulary_and_merge_keys_without_a_mode_are_an_upsert() -> None:
    with pytest.raises(ConfigError, match="option 'mode'"):
        parse("sink", "o", {"path": "/out", "mode": "changes"}, SINK_OPTIONS)
    upsert = parse("sink", "o", {"type": "iceberg", "table": "lake.t", "merge_keys": "k"}, SINK_OPTIONS)
    assert (upsert.mode, upsert.merge_keys) == ("upsert", ["k"])  # type: ignore[attr-defined]
    assert [m.value for m in SinkMode] == ["append", "upsert", "snapshot"]


def test_every_sink_option_has_a_description_for_the_reference() -> None:
    for model in SINK_OPTIONS.values():
        table = option_table(model)
        undocumented = [line for line in table.splitlines()[2:] if line.endswith("|  |")]
        assert undocumented == [], f"{model.__name__}: {undocumented}"


def test_a_stage_spec_upsert_on_a_delta_sink_records_typed_options_without_expectations() -> None:
    options = parse("sink", "o", {"type": "delta", "path": "/t", "mode": "upsert", "merge_keys": ["k"],
                                  "expectations": {"positive": "k > 0"}}, SINK_OPTIONS)
    manifest = SinkManifest("o", "file:///t", "s", [], 0, mode=SinkMode.UPSERT,
                            table=options.recorded())  # type: ignore[attr-defined]
    stored = manifest.to_dict()
    assert stored["mode"] == "upsert" and stored["table"]["expectations"] is None
    assert SinkManifest.from_dict(stored) == manifest
