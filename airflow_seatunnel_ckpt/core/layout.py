"""Where everything lives inside one pipeline's directory of the store (docs/ARCHITECTURE.md,
"On-disk layout"), and the validation of the names and numbers that become parts of paths.
"""

from __future__ import annotations

import hashlib
import re

from airflow_seatunnel_ckpt.core.errors import InvalidEpochError, InvalidNameError

# A name is one path segment: it must never climb out (``..``), split (``/``), hide (leading
# ``.``), collide with reserved directories (leading ``_``) or carry control bytes.
MAX_NAME_LENGTH = 128
#: The largest 12-digit number: the transaction log zero-pads epochs to 12 digits so that a
#: listing is in epoch order.
MAX_EPOCH = 10**12 - 1

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def validate_name(name: object, what: str = "name") -> str:
    """Return ``name`` unchanged if it is a safe single path segment, else raise naming ``what`` it is."""
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidNameError(f"{what} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(f"{what} is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed")
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidNameError(f"{what} {name!r} is not allowed: use letters, digits, '_', '-' and '.', "
                               "start with a letter or digit, and no '..', '/', '\\' or control characters")
    return name


def validate_epoch(epoch: object) -> int:
    """Return ``epoch`` if it is an integer in ``[1, MAX_EPOCH]``, else raise."""
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise InvalidEpochError(f"epoch must be an integer, got {epoch!r}")
    if epoch < 1 or epoch > MAX_EPOCH:
        raise InvalidEpochError(f"epoch {epoch} is out of range: expected 1..{MAX_EPOCH}")
    return epoch


def validate_attempt(attempt: object) -> int:
    """Return ``attempt`` if it is a positive integer (Airflow's try number), else raise."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= 1_000_000:
        raise InvalidEpochError(f"attempt must be an integer in 1..1000000, got {attempt!r}")
    return attempt


TXLOG = "_txlog"
DESCRIPTOR = "_descriptor"
DESCRIPTOR_WIDTH = 6
STAGING = "_staging"
RUNS = f"{TXLOG}/runs"
#: Prefix of the probe an observer writes to read the store's current time (its mtime).
CLOCK_PROBE = f"{TXLOG}/_clock"
LEASE_PREFIX = "lease-"
METADATA = "_metadata"
SUCCESS = "_SUCCESS"
CHECKPOINT_PREFIX = "checkpoint_"
#: A replay stages each replayed epoch's output of a sink below ``<sink staging>/replayed-<epoch>/``.
REPLAYED_DIR = "replayed-"
EPOCH_WIDTH = 12

# Only the canonical spelling of a valid epoch: "checkpoint_007" or "epoch=0" is something
# else's directory, and acting on it as epoch 7 or 0 would touch the wrong files.
_CHECKPOINT_DIR = re.compile(r"checkpoint_([1-9]\d{0,11})")
_TXLOG_DIR = re.compile(r"epoch-(\d{12})")
_STAGING_EPOCH = re.compile(r"epoch=([1-9]\d{0,11})")


def checkpoint_dir(epoch: int) -> str:
    """``checkpoint_<epoch>`` (relative to the pipeline root)."""
    return f"{CHECKPOINT_PREFIX}{validate_epoch(epoch)}"


def metadata_path(epoch: int) -> str:
    """The checkpoint's ``_metadata`` file."""
    return f"{checkpoint_dir(epoch)}/{METADATA}"


def part_path(epoch: int, kind: str, name: str, key_group: int, attempt: int, token: str | None = None) -> str:
    """``checkpoint_<e>/<kind>/<name>/part-<k>-<attempt>[-<token>]``.

    The token separates repeated evaluations of one task within an attempt (Spark retries).
    """
    if token is not None and not (isinstance(token, str) and token.isalnum() and len(token) <= 32):
        raise ValueError(f"part token must be 1-32 letters or digits, got {token!r}")
    if kind not in ("sources", "operators"):
        raise ValueError(f"part kind must be 'sources' or 'operators', got {kind!r}")
    if isinstance(key_group, bool) or not isinstance(key_group, int) or not 0 <= key_group < 1 << 20:
        raise ValueError(f"key group must be an integer in 0..2**20, got {key_group!r}")
    return (f"{checkpoint_dir(epoch)}/{kind}/{validate_name(name, 'state name')}"
            f"/part-{key_group}-{validate_attempt(attempt)}" + (f"-{token}" if token else ""))


def source_meta_path(epoch: int, source: str) -> str:
    """``checkpoint_<e>/sources/<source>/_meta``."""
    return f"{checkpoint_dir(epoch)}/sources/{validate_name(source, 'source name')}/_meta"


def sink_marker_path(epoch: int, sink: str) -> str:
    """``checkpoint_<e>/sinks/<sink>/_prepared``: the sink's pre-commit manifest."""
    return f"{checkpoint_dir(epoch)}/sinks/{validate_name(sink, 'sink name')}/_prepared"


def txlog_dir(epoch: int) -> str:
    """``_txlog/epoch-<zero padded epoch>``."""
    return f"{TXLOG}/epoch-{validate_epoch(epoch):0{EPOCH_WIDTH}d}"


def replayed_epoch(staged_path: str) -> int | None:
    """The replayed epoch of a replay's staged file ``replayed-<epoch>/...`` (None: not a replayed epoch's)."""
    head = staged_path.split("/", 1)[0]
    digits = head[len(REPLAYED_DIR):]
    return int(digits) if head.startswith(REPLAYED_DIR) and digits.isdigit() else None


def record_path(epoch: int, record: str) -> str:
    """A write-once record of the epoch (``begin``, ``decision``, ``prepared-<p>``...)."""
    return f"{txlog_dir(epoch)}/{record}"


def lease_path(epoch: int, participant: str) -> str:
    """``_txlog/epoch-<e>/lease-<participant>``: the lease of the attempt running the stage."""
    return f"{txlog_dir(epoch)}/{LEASE_PREFIX}{validate_name(participant, 'participant name')}"


def attempt_record_name(prefix: str, participant: str, attempt: int) -> str:
    """``<prefix><participant>-a<attempt>``: the name of a record of one attempt of a participant."""
    return f"{prefix}{validate_name(participant, 'participant name')}-a{validate_attempt(attempt)}"


def run_key(run_id: str, dag_id: str = "") -> str:
    """A path-safe, fixed-length key for the run ``run_id`` of DAG ``dag_id`` (run ids are unique per DAG only)."""
    if not isinstance(run_id, str) or not run_id or len(run_id) > 1000 or "\x00" in run_id:
        raise InvalidNameError(f"run id must be a non-empty string of at most 1000 characters, got {run_id!r}")
    if not isinstance(dag_id, str) or len(dag_id) > 1000 or "\x00" in dag_id:
        raise InvalidNameError(f"DAG id must be a string of at most 1000 characters, got {dag_id!r}")
    text = f"{dag_id}\x00{run_id}" if dag_id else run_id
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def run_index_dir(run_id: str, dag_id: str = "") -> str:
    """``_txlog/runs/<run key>``: one empty-ish file per epoch the run was given."""
    return f"{RUNS}/{run_key(run_id, dag_id)}"


def _version_name(version: int, width: int, what: str) -> str:
    """``v<version>``, zero-padded to ``width`` digits: the name of one write-once version of ``what``."""
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 10**width:
        raise ValueError(f"{what} version must be an integer in 1..{10**width - 1}, got {version!r}")
    return f"v{version:0{width}d}"


def parse_version_name(name: str, width: int, suffix: str = "") -> int | None:
    """The version of a ``v<version>[suffix]`` name zero-padded to ``width`` digits, or None for anything else."""
    m = re.fullmatch(rf"v(\d{{{width}}}){re.escape(suffix)}", name)
    return int(m.group(1)) if m and int(m.group(1)) >= 1 else None


def descriptor_path(version: int) -> str:
    """``_descriptor/v<NNNNNN>.json``: one write-once version of the pipeline descriptor."""
    return f"{DESCRIPTOR}/{_version_name(version, DESCRIPTOR_WIDTH, 'descriptor')}.json"


def staging_epoch_dir(epoch: int) -> str:
    """``_staging/epoch=<e>``: everything any attempt of the epoch staged."""
    return f"{STAGING}/epoch={validate_epoch(epoch)}"


def staging_dir(epoch: int, attempt: int, sink: str) -> str:
    """``_staging/epoch=<e>/attempt=<a>/<sink>``: where one attempt stages one sink."""
    return f"{staging_epoch_dir(epoch)}/attempt={validate_attempt(attempt)}/{validate_name(sink, 'sink name')}"


def published_dir(epoch: int) -> str:
    """``epoch=<e>``: the directory an epoch's output gets below a sink's target."""
    return f"epoch={validate_epoch(epoch)}"


def parse_checkpoint_dir(name: str) -> int | None:
    """The epoch of a ``checkpoint_<e>`` directory name, or None for anything else."""
    m = _CHECKPOINT_DIR.fullmatch(name)
    return int(m.group(1)) if m else None


def parse_txlog_dir(name: str) -> int | None:
    """The epoch of an ``epoch-<e>`` txlog directory name, or None."""
    m = _TXLOG_DIR.fullmatch(name)
    return int(m.group(1)) if m else None


def parse_staging_epoch(name: str) -> int | None:
    """The epoch of an ``epoch=<e>`` staging directory name, or None."""
    m = _STAGING_EPOCH.fullmatch(name)
    return int(m.group(1)) if m else None


SETTLED = f"{TXLOG}/_settled"
SETTLED_WIDTH = 12


def settled_path(version: int) -> str:
    """``_txlog/_settled/v<NNNNNNNNNNNN>``: one write-once version of the settled watermark."""
    return f"{SETTLED}/{_version_name(version, SETTLED_WIDTH, 'settled record')}"
