"""Stored records decode strictly: a record that does not fit its model is refused naming the file."""

from __future__ import annotations

import pytest

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.errors import ConfigError, CorruptCheckpointError, IncompatibleFormatError
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, run_epoch


def rewrite(spec: StoreSpec, path: str, **changes: object) -> None:
    """Replace the stored JSON record at ``path`` with its fields updated by ``changes``."""
    storage = spec.pipeline().storage
    data = codec.decode_json(storage.read(path))
    storage.delete(path)
    storage.create_exclusive(path, codec.encode_json({**data, **changes}))


def test_a_prepared_record_with_an_unknown_field_is_refused_naming_the_file_and_the_field(
        fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = run_epoch(p, "run-1", Participant(sources={"orders": {"files": ["a"]}}))
    path = layout.record_path(epoch, "prepared-ingest")
    rewrite(fast_spec, path, attempts=2)

    with pytest.raises(CorruptCheckpointError, match=r"prepared-ingest: not a valid PreparedRecord record: "
                                                     r"attempts: unexpected keyword argument") as info:
        fast_spec.pipeline().txlog.read_prepared(epoch, "ingest")
    assert info.value.path == p.storage.describe_path(path)


def test_a_part_reference_of_the_wrong_type_in_metadata_is_refused_naming_its_place(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = run_epoch(p, "run-1", Participant(sources={"orders": {"files": ["a"]}}))
    path = layout.metadata_path(epoch)
    meta = codec.decode_json(p.storage.read(path))
    meta["sinks"]["orders"]["size"] = True  # a bool is not a number
    rewrite(fast_spec, path, sinks=meta["sinks"])

    with pytest.raises(CorruptCheckpointError, match=r"_metadata: not a valid CheckpointMetadata record: "
                                                     r"sinks\.orders\.size: input should be a valid integer"):
        fast_spec.pipeline().checkpoints.read_metadata(epoch)


def test_metadata_of_another_format_version_is_refused_for_a_migration(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = run_epoch(p, "run-1", Participant(sources={"orders": {"files": ["a"]}}))
    rewrite(fast_spec, layout.metadata_path(epoch), format_version=2)

    with pytest.raises(IncompatibleFormatError, match=r"_metadata: format version 2 is not supported "
                                                      r"\(this release reads 1\)"):
        fast_spec.pipeline().checkpoints.read_metadata(epoch)


def test_a_config_built_with_an_unknown_option_names_it_and_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown checkpoint config keys \['max_retian'\]; known keys: .*max_retain"):
        CheckpointConfig(storage_url="memory://x", max_retian=3)  # type: ignore[call-arg]
