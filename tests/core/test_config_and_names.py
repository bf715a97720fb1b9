"""Configuration validation, safe names and epochs, and credentials never leaking."""

from __future__ import annotations

import importlib.util
import uuid

import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, layout
from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    InvalidEpochError,
    InvalidNameError,
    RecoveryError,
    StorageError,
)
from airflow_seatunnel_ckpt.core.layout import (
    MAX_EPOCH,
    validate_attempt,
    validate_epoch,
    validate_name,
)
from airflow_seatunnel_ckpt.core.storage import open_storage
from tests.core.epochs import Participant, run_epoch

# -- configuration ------------------------------------------------------------------------


def test_the_defaults_are_valid_and_point_at_a_local_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SEATUNNEL_CKPT_STORE", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", "/srv/airflow")
    config = CheckpointConfig()
    assert config.storage_url == "file:///srv/airflow/seatunnel-ckpt"
    assert (config.max_retain, config.incremental, config.compression) == (10, True, "zstd")
    monkeypatch.setenv("SEATUNNEL_CKPT_STORE", "s3://bucket/ckpt")
    assert CheckpointConfig().storage_url == "s3://bucket/ckpt"


def test_from_mapping_names_unknown_keys_and_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        CheckpointConfig.from_mapping({"storage_url": "memory://x", "max_retian": 3})
    assert "max_retian" in str(info.value)
    assert "max_retain" in str(info.value)
    with pytest.raises(ConfigError, match="must be a mapping"):
        CheckpointConfig.from_mapping(["storage_url"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("storage_url", "", "storage_url must be a non-empty fsspec URL"),
        ("storage_url", 5, "storage_url"),
        ("storage_options", "key=secret", "storage_options must be a mapping"),
        ("secondary_url", "", "secondary_url"),
        ("prepared_timeout_s", 0, "prepared_timeout_s"),
        ("prepared_timeout_s", -5, "prepared_timeout_s"),
        ("prepared_timeout_s", float("nan"), "prepared_timeout_s"),
        ("prepared_timeout_s", float("inf"), "prepared_timeout_s"),
        ("prepared_timeout_s", True, "prepared_timeout_s"),
        ("prepared_timeout_s", "600", "prepared_timeout_s"),
        ("max_retain", 0, "max_retain must be an integer >= 1"),
        ("max_retain", "10", "max_retain"),
        ("max_retain", 2.5, "max_retain"),
        ("max_retain", True, "max_retain"),
        ("incremental", "yes", "incremental must be true or false"),
        ("full_checkpoint_interval", 0, "full_checkpoint_interval must be an integer in 1..1000"),
        ("full_checkpoint_interval", 1001, "full_checkpoint_interval"),
        ("compression", "gzip", "compression must be one of"),
        ("compression_level", 23, "compression_level"),
        ("compression_level", "3", "compression_level"),
        ("fallback_enabled", 1, "fallback_enabled must be true or false"),
        ("max_retries", -1, "max_retries"),
        ("max_retries", 101, "max_retries"),
        ("max_chunk_bytes", 1023, "max_chunk_bytes"),
        ("max_chunk_bytes", 2**31 + 1, "max_chunk_bytes"),
    ],
)
def test_each_invalid_setting_is_refused_with_a_message_naming_it(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        CheckpointConfig.from_mapping({"storage_url": "memory://x", field: value})
    assert message in str(info.value)
    assert repr(value) in str(info.value) or field in (
        "storage_url",
        "storage_options",
        "secondary_url",
    )
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, ValueError)


@pytest.mark.skipif(importlib.util.find_spec("lz4") is not None, reason="lz4 is installed")
def test_lz4_without_its_package_is_refused_with_the_install_hint() -> None:
    with pytest.raises(ConfigError, match="pip install lz4"):
        CheckpointConfig(storage_url="memory://x", compression="lz4")


def test_replace_validates_again() -> None:
    config = CheckpointConfig(storage_url="memory://x")
    assert config.replace(max_retain=3).max_retain == 3
    with pytest.raises(ConfigError, match="max_retain"):
        config.replace(max_retain=0)


def test_the_config_never_shows_its_secrets() -> None:
    config = CheckpointConfig(
        storage_url="s3://AKIAEXAMPLE:wJalr/XUtnFEMI+K7MDENG@bucket/ckpt",
        storage_options={"key": "AKIAEXAMPLE", "secret": "wJalrXUtnFEMIK7MDENG"},
        secondary_url="s3://user:pa55word@replica/ckpt",
    )
    shown = [repr(config), str(config), str(config.to_mapping(include_secrets=False))]
    for text in shown:
        for secret in ("wJalr", "XUtnFEMI", "K7MDENG", "pa55word"):
            assert secret not in text
    assert config.to_mapping(include_secrets=True)["storage_options"]["secret"] == "wJalrXUtnFEMIK7MDENG"


# -- credentials in messages --------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("s3://AKIA:supersecret@bucket/path", "supersecret"),
        ("s3://AKIA:wJalr/XUtnFEMI+K7MDENG@bucket/path", "XUtnFEMI"),
        ("s3://AKIA:wJalr/XUtnFEMI+K7MDENG@bucket/path", "K7MDENG"),
        ("s3://user:p@ss@word@bucket/x", "ss@word"),
        ("simplecache::s3://key:hunter2@bucket/x", "hunter2"),
        ("hdfs://alice:hunter2@namenode:8020/ckpt", "hunter2"),
        ("abfs://c@acct.dfs.core.windows.net/p?sv=2024&sig=SIGNATUREVALUE&se=1", "SIGNATUREVALUE"),
        ("https://host/obj?X-Amz-Credential=AKIA123&X-Amz-Signature=deadbeef", "deadbeef"),
        ("https://host/obj?X-Amz-Credential=AKIA123&X-Amz-Signature=deadbeef", "AKIA123"),
        ("gs://bucket/x?access_token=ya29TOKEN", "ya29TOKEN"),
        ("s3://user:pass@host:notaport/x", "pass"),
        ("http://[::1", "::1 is not secret but must not crash"),
    ],
)
def test_redact_url_never_leaks_credentials(url: str, secret: str) -> None:
    redacted = redact_url(url)
    if "not secret" not in secret:
        assert secret not in redacted
    assert isinstance(redacted, str)


@pytest.mark.parametrize("url", ["file:///tmp/a@b/c", "s3://bucket/key:with@sign", "memory://root", "s3://bucket/p"])
def test_redact_url_leaves_urls_without_credentials_alone(url: str) -> None:
    assert redact_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "memory://alice:{secret}@bucket/store",
        "s3://AKIA:{secret}/x+y@bucket/ckpt",
        "file://u:{secret}@/tmp/x",
        "simplecache::s3://AKIA:{secret}@bucket/ckpt",
    ],
)
def test_a_store_url_carrying_a_password_is_refused_without_showing_it(url: str) -> None:
    secret = f"hunter2-{uuid.uuid4().hex[:6]}"
    with pytest.raises(StorageError) as info:
        CheckpointStore.from_url(url.format(secret=secret))
    assert secret not in str(info.value)
    assert "storage options" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "memory://root/a:b@c",
        "hdfs://namenode:8020/data/user@example/ckpt",
        "abfs://container@acct/x",
    ],
)
def test_urls_without_a_password_are_not_mistaken_for_ones_with(url: str) -> None:
    from airflow_seatunnel_ckpt.core.storage import refuse_password

    refuse_password(url)


def test_errors_name_files_by_their_redacted_url() -> None:
    p = CheckpointStore.from_url(f"memory://names-{uuid.uuid4().hex}", fallback_enabled=False).pipeline("o")
    run_epoch(p, "run-1", Participant(changes={1: 1}))
    meta = layout.metadata_path(1)
    data = bytearray(p.storage.read(meta))
    data[len(data) // 2] ^= 0xFF
    p.storage.write_atomic(meta, bytes(data))
    with pytest.raises(CorruptCheckpointError) as corrupt:
        p.checkpoints.read_metadata(1)
    assert corrupt.value.path == p.storage.describe_path(meta) == redact_url(p.storage.url_of(meta))
    with pytest.raises(RecoveryError) as recovery:
        p.restore_point()
    assert p.storage.describe_path(meta) in str(recovery.value)


# -- names --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["orders", "orders_v2", "a.b-c", "A1", "0", "x" * 128])
def test_safe_names_are_accepted_unchanged(name: str) -> None:
    assert validate_name(name, "sink name") == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "../x",
        "x/..",
        "a/b",
        "a\\b",
        "\\",
        "a\x00b",
        "/abs",
        "_txlog",
        "_staging",
        ".hidden",
        "x" * 129,
        "a b",
        "naïve",
        "tab\t",
        "line\n",
        "-flag",
        "a..b",
        "C:",
        "~user",
    ],
)
def test_unsafe_names_are_refused_with_the_kind_of_name(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_name(name, "sink name")
    assert "sink name" in str(info.value)


@pytest.mark.parametrize("name", [None, 5, b"orders", ["orders"]])
def test_names_must_be_strings(name: object) -> None:
    with pytest.raises(InvalidNameError, match="must be a string"):
        validate_name(name, "pipeline name")


def test_unsafe_names_are_refused_wherever_they_enter() -> None:
    store = CheckpointStore.from_url(f"memory://names-{uuid.uuid4().hex}")
    for bad in ("../escape", "a/b", ""):
        with pytest.raises(InvalidNameError):
            store.pipeline(bad)
    p = store.pipeline("orders")
    epoch = p.begin("run-1").epoch
    with pytest.raises(InvalidNameError):
        p.staging_path(epoch, 1, "../../outside")
    with pytest.raises(InvalidNameError):
        p.prepare(epoch, "../p", 1, run_id="run-1", sinks=[])
    with pytest.raises(InvalidNameError):
        p.prepare(epoch, "ingest", 1, run_id="run-1", sinks=[], sources={"a/b": {}})
    with pytest.raises(InvalidNameError):
        layout.part_path(epoch, "operators", "..", 0, 1)
    assert all(".." not in f.path for f in store.storage.walk(""))


def test_run_ids_of_any_shape_map_to_fixed_safe_keys() -> None:
    run_id = "scheduled__2024-01-01T00:00:00+00:00/../../etc"
    key = layout.run_key(run_id)
    assert key == layout.run_key(run_id)
    assert len(key) == 32 and key.isalnum()
    assert layout.run_key("a") != layout.run_key("b")
    for bad in ("", "x\x00y", "x" * 1001, None):
        with pytest.raises(InvalidNameError):
            layout.run_key(bad)  # type: ignore[arg-type]


# -- epochs and attempts ------------------------------------------------------------------


@pytest.mark.parametrize("epoch", [1, 2, 10**6, MAX_EPOCH])
def test_valid_epochs_are_accepted(epoch: int) -> None:
    assert validate_epoch(epoch) == epoch
    assert layout.parse_txlog_dir(layout.txlog_dir(epoch).split("/")[1]) == epoch
    assert layout.parse_checkpoint_dir(layout.checkpoint_dir(epoch)) == epoch


@pytest.mark.parametrize("epoch", [0, -1, MAX_EPOCH + 1, 10**30, True, False, 1.0, "3", None])
def test_invalid_epochs_are_refused(epoch: object) -> None:
    with pytest.raises(InvalidEpochError):
        validate_epoch(epoch)
    with pytest.raises(InvalidEpochError):
        layout.checkpoint_dir(epoch)  # type: ignore[arg-type]


def test_every_valid_epoch_fits_the_zero_padded_log_directory() -> None:
    assert len(str(MAX_EPOCH)) == layout.EPOCH_WIDTH
    names = [layout.txlog_dir(e).split("/")[1] for e in (9, MAX_EPOCH - 1, MAX_EPOCH)]
    assert names == sorted(names)


@pytest.mark.parametrize("attempt", [0, -1, True, 10**7, 1.5, "1"])
def test_invalid_attempts_are_refused(attempt: object) -> None:
    with pytest.raises(InvalidEpochError):
        validate_attempt(attempt)


def test_the_pipeline_api_refuses_invalid_epochs() -> None:
    p = CheckpointStore.from_url(f"memory://epochs-{uuid.uuid4().hex}").pipeline("orders")
    for bad in (0, -3, True):
        with pytest.raises(InvalidEpochError):
            p.state(bad)
        with pytest.raises(InvalidEpochError):
            p.commit(bad)
        with pytest.raises(InvalidEpochError):
            p.decide(bad, Decision.ABORT, "x")
        with pytest.raises(InvalidEpochError):
            p.abort(bad, "x")


def test_open_storage_refuses_a_missing_url() -> None:
    with pytest.raises(CheckpointError):
        open_storage("")
    with pytest.raises(CheckpointError):
        open_storage(None)  # type: ignore[arg-type]
