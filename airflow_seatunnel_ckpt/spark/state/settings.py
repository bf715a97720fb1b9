"""A keyed state's settings: one typed object the driver builds and its tasks receive (plain data shipped in the
``mapInArrow`` closure; nothing read from the store is unpickled)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.codec import Codec
from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.models import OperatorState, PartRef
from airflow_seatunnel_ckpt.core.state.checkpoint import needs_full
from airflow_seatunnel_ckpt.core.state.run_chain import (
    DEFAULT_BUDGET,
    DEFAULT_FANOUT,
    DEFAULT_MERGE_FLOOR,
    DEFAULT_TURNS,
)
from airflow_seatunnel_ckpt.core.state.runs import DEFAULT_BLOCK_ROWS
from airflow_seatunnel_ckpt.core.storage import open_storage

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.config import CheckpointConfig
    from airflow_seatunnel_ckpt.core.storage import Storage

#: Column holding the key group while rows travel to their task.
KEY_GROUP_COLUMN = "__key_group"
#: Rows a key-set task de-duplicates in one go (bounds its memory; more rows are
#: processed in further chunks against everything seen so far).
DEFAULT_CHUNK_ROWS = 1_000_000


class StateError(CheckpointError):
    """Keyed state cannot be used as asked (wrong key columns, key groups changed, ...)."""


class StateKind(StrEnum):
    """What a keyed state holds; the value is the checkpoint's ``state_kind``."""

    KEY_SET = "key_set"
    KEY_VALUE = "key_value"


class Aggregate(StrEnum):
    """A running aggregate of a key -> value state, named like its Spark SQL function."""

    SUM = "sum"
    COUNT = "count"
    MIN = "min"
    MAX = "max"


@dataclass(frozen=True)
class StoreLocation:
    """A pipeline root in a checkpoint store, as an executor opens it."""

    url: str
    options: Mapping[str, Any] = field(repr=False)  #: may hold credentials

    @classmethod
    def of(cls, storage: Storage) -> StoreLocation:
        """The location of an open store."""
        return cls(storage.url, dict(storage.storage_options))

    def open(self) -> Storage:
        """Open the store (on the driver or an executor)."""
        return open_storage(self.url, self.options)


@dataclass(frozen=True)
class PartPolicy:
    """How a key group's next part is written: chain bound and compression."""

    incremental: bool
    full_checkpoint_interval: int
    compression: Codec
    compression_level: int
    force_full: bool = False  #: restored from another store: write every key group in full
    #: Rows per block of a sorted run: what a lookup reads at a time (memory per task is
    #: the epoch's input plus the runs' bloom filters plus one block).
    block_rows: int = DEFAULT_BLOCK_ROWS
    #: Runs of similar size that are merged into one (size-tiered compaction).
    fanout: int = DEFAULT_FANOUT
    #: What one epoch's merges may write, as a fraction of the state's bytes.
    compaction_budget: float = DEFAULT_BUDGET
    #: Key groups merge in turns, each in one epoch out of this many.
    compaction_turns: int = DEFAULT_TURNS
    #: Bytes a key group may always merge in its turn (tiny states merge freely).
    compaction_floor: int = DEFAULT_MERGE_FLOOR

    @classmethod
    def from_config(cls, config: CheckpointConfig, *, force_full: bool = False) -> PartPolicy:
        """The policy of a pipeline's checkpoint configuration."""
        return cls(incremental=config.incremental, full_checkpoint_interval=config.full_checkpoint_interval,
                   compression=Codec.ZSTD if config.compression == "zstd" else Codec.LZ4,
                   compression_level=config.compression_level, force_full=force_full)


def starts_empty(kind: StateKind) -> str:
    """What starting a state over (a reset, a new name) costs: said wherever it is offered."""
    if kind is StateKind.KEY_SET:
        return ("but a state started over is empty: every key it held passes again, so events already "
                "published (re-sent ones, or input read again) are published again as duplicates")
    return ("but a state started over is empty: its values (totals, counts) restart from nothing instead of "
            "continuing from the committed ones")


@dataclass(frozen=True)
class StateSettings:
    """Everything the driver and the tasks of one keyed state need, built once per stage (key groups and kind are
    checked against the restored checkpoint)."""

    name: str
    kind: StateKind
    key_groups: int
    epoch: int
    attempt: int
    store: StoreLocation  #: the pipeline root the new parts are written to
    restore_from: StoreLocation  #: the pipeline root the restored chains live in
    policy: PartPolicy
    restored: OperatorState | None = None  #: the state in the last committed checkpoint
    #: The key columns: the checkpoint's, until the stage's update binds them.
    key_columns: tuple[str, ...] = ()
    #: Key sets only: a key is forgotten this many epochs after the epoch that last wrote
    #: it (None: never). Like Flink's StateTtlConfig with OnCreateAndWrite updates.
    ttl_epochs: int | None = None
    #: The pipeline's name, for the commands a refusal prints.
    pipeline: str = "<pipeline>"

    @property
    def min_epoch(self) -> int | None:
        """The oldest epoch whose keys are still live under the TTL (None: no TTL)."""
        return None if self.ttl_epochs is None else self.epoch - self.ttl_epochs + 1

    def __post_init__(self) -> None:
        restored = self.restored
        if restored is None:
            return
        if restored.key_groups != self.key_groups:
            raise StateError(
                f"keyed state {self.name!r} was checkpointed with {restored.key_groups} key groups, "
                f"the stage asks for {self.key_groups}; key groups are fixed for the life of a "
                "pipeline's state. Way out: "
                f"run the stage with key_groups={restored.key_groups}, or re-partition the committed state "
                f"with `seatunnel-ckpt rescale {self.pipeline} --key-groups {self.key_groups}` first"
            )
        if restored.state_kind != self.kind:
            raise StateError(f"keyed state {self.name!r} is a {restored.state_kind} in the checkpoint, "
                             f"not a {self.kind}; use another name for a new state, or start this one over with "
                             f"`seatunnel-ckpt state reset {self.pipeline} {self.name}` -- {starts_empty(self.kind)}")
        if not self.key_columns:
            object.__setattr__(self, "key_columns", tuple(restored.key_columns))

    def bound_to(self, key_columns: Sequence[str]) -> StateSettings:
        """These settings for an update keyed by ``key_columns`` (the checkpoint's, if any)."""
        keys = tuple(key_columns)
        if self.restored is not None and keys != self.key_columns:
            raise StateError(f"keyed state {self.name!r} is keyed by {list(self.key_columns)} in the checkpoint, "
                             f"not {list(keys)}: its stored values belong to other keys. Way out: key it by "
                             f"{list(self.key_columns)} again; or start it over with `seatunnel-ckpt state reset "
                             f"{self.pipeline} {self.name}` or under a new state name -- {starts_empty(self.kind)}")
        return dataclasses.replace(self, key_columns=keys)

    @property
    def chains(self) -> Mapping[int, Sequence[PartRef]]:
        """The restored chain of each key group that has one."""
        return self.restored.chains if self.restored is not None else {}

    def chain(self, key_group: int) -> list[PartRef]:
        """The restored chain of ``key_group`` (empty when it has no state yet)."""
        return list(self.chains.get(key_group, ()))

    def must_write_full(self, key_group: int) -> bool:
        """Whether this epoch's part of ``key_group`` must be a full part (chain bound)."""
        policy = self.policy
        return policy.force_full or needs_full(
            self.chain(key_group), policy.incremental, policy.full_checkpoint_interval
        )

    def part_path(self, key_group: int, token: str | None = None) -> str:
        """A new part's path below the pipeline root (attempt- and, with ``token``, task-unique)."""
        return layout.part_path(self.epoch, "operators", self.name, key_group, self.attempt, token)

    def reports_folder(self, update: str) -> str:
        """Where the tasks of one update (``update``: a token of its own) report their parts: below this attempt's
        staging directory, removed with the epoch's staging."""
        return (f"{layout.staging_epoch_dir(self.epoch)}/attempt={layout.validate_attempt(self.attempt)}"
                f"/_state/{self.name}/{update}")

    @property
    def parts_folder(self) -> str:
        """The folder this epoch's parts of the state are written to."""
        return self.part_path(0).rsplit("/", 1)[0]
