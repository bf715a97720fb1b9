"""The source contract: what every source promises, each promise in one place.

A :class:`Source` plans an epoch's offsets from the committed history and the source's
present (:meth:`Source.plan`), the runner pins them before the stage reads, every read
checks the pinned input is still there as pinned (:meth:`Source.pinned_gone`,
:meth:`Source.verify_pinned`), and a replay reads the same input or refuses
(:meth:`Source.read_exactly`). The Spark side (:class:`spark.sources.base.Source`) adds
the read; docs/ARCHITECTURE.md has the design.
"""

from __future__ import annotations

import contextlib
import posixpath
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.options import Options, checked, type_name

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.protocol.restore import RestorePoint

OptionsT = TypeVar("OptionsT", bound=Options)

#: Pinned inputs an error names (the count says how many more there are).
MAX_SHOWN = 5


class SourceError(CheckpointError):
    """A source cannot plan or read its input (missing path, unreadable file, no schema, input gone)."""


def last_read(history: Sequence[Mapping[str, Any]], field: str) -> dict[str, Any] | None:
    """The offsets of the newest committed epoch that read the source (its offsets' ``field`` is set, e.g.
    the ``end`` of a range); None: none did."""
    for entry in reversed(history):
        offsets = entry.get("offsets") or {}
        if offsets.get(field) is not None:
            return dict(offsets)
    return None


@contextlib.contextmanager
def as_source_error(caught: type[CheckpointError] = CheckpointError) -> Iterator[None]:
    """A ``caught`` error of the core's planning or reading raised as :class:`SourceError`, its message
    kept: what the pipeline expects of a source."""
    try:
        yield
    except caught as exc:
        raise SourceError(str(exc)) from exc


class Source(ABC):
    """The contract of a source, without Spark (see the module docstring).

    :param name: the source's name in the stage spec (and in the checkpoint).
    """

    #: How errors name the kind of source (``"file source 'orders'"``).
    kind = "source"
    #: Looks up :meth:`first_pinned` in the log; the runner sets it before planning.
    earlier_plans: Callable[[], Mapping[str, Any] | None] | None = None
    #: Set by :meth:`read_exactly`: no option may pass over pinned input that is gone.
    exact = False

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def where(self) -> str:
        """How errors name this source."""
        return f"{self.kind} source {self.name!r}"

    def checked_options(self, model: type[OptionsT], options: Mapping[str, Any]) -> OptionsT:
        """``options`` (a stage spec's entry, without ``type``) checked once by the source's
        options model (:mod:`core.sources.options`); ConfigError naming the source and each problem."""
        kind = type_name(model)
        return checked(model, {"type": kind, **options}, f"source {self.name!r} (type {kind!r})")

    # -- plan --------------------------------------------------------------------------------
    @abstractmethod
    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """This epoch's offsets, given ``history``: the offsets of every committed epoch,
        oldest first, as ``[{"epoch": e, "offsets": {...}}, ...]``. Must be JSON data."""

    def plan_from(self, point: RestorePoint, epoch: int | None = None) -> dict[str, Any]:
        """The offsets of ``epoch``, planned from the restore point the epoch starts from (by default
        :meth:`plan` of the source's whole history)."""
        return self.plan(point.source_entries(self.name))

    def first_pinned(self) -> Mapping[str, Any] | None:
        """The newest offsets an earlier epoch (aborted, or committed without reading it) pinned for this
        source, or None: where a first plan that depends on when it is made (Kafka's ``latest``) starts."""
        return self.earlier_plans() if self.earlier_plans is not None else None

    def repin(self, offsets: Mapping[str, Any]) -> dict[str, Any] | None:
        """New offsets for pinned ones only the process that planned them could read (a CDC source's
        exported snapshot), asked before any attempt prepared; None (the default): the pinned ones stand."""
        return None

    # -- check -------------------------------------------------------------------------------
    def pinned_gone(self, offsets: Mapping[str, Any]) -> list[str]:
        """What of the input ``offsets`` pin cannot be read as it was pinned now, one line per item (``[]``:
        all of it is there, or the source knows of no identity to check)."""
        return []

    @property
    def skips_gone(self) -> bool:
        """Whether a read passes over pinned input that is gone instead of failing (an option
        such as Kafka's ``fail_on_data_loss=false``); never after :meth:`read_exactly`."""
        return False

    def verify_pinned(self, offsets: Mapping[str, Any]) -> None:
        """Raise :class:`SourceError` unless all the input ``offsets`` pin can still be read as pinned (the
        check a read makes, and a replay for every epoch it runs again)."""
        gone = self.pinned_gone(offsets)
        if not gone:
            return
        more = f" (and {len(gone) - MAX_SHOWN} more)" if len(gone) > MAX_SHOWN else ""
        raise SourceError(
            f"{self.where}: the pinned input is not all there: {'; '.join(gone[:MAX_SHOWN])}{more}. The epoch "
            "reads exactly the input it pinned, so it cannot read this; abort the epoch (the next one plans "
            "the input as it is now) or restore the input as it was")

    def read_figures(self) -> dict[str, Any]:
        """What the last read counted beyond its offsets (a CDC read's changes by operation), recorded with
        the consumed offsets for ``show`` and the Checkpoints page, never part of the position."""
        return {}

    def read_exactly(self) -> None:
        """From now on, read exactly the pinned input or fail, whatever options allow skipping
        part of it (a replay with fewer rows would replace committed output)."""
        self.exact = True


def files_gone(pinned: Mapping[str, Mapping[str, Any] | None], storage_options: Mapping[str, Any],
               same: Callable[[Mapping[str, Any], Mapping[str, Any]], bool]) -> list[str]:
    """The pinned files (URL -> pinned identity, None: unknown) missing or changed now (``same(pinned, listed
    fsspec info)``), listing each directory once rather than asking per file."""
    from fsspec.core import url_to_fs

    by_dir: dict[str, list[str]] = {}
    for url in pinned:
        by_dir.setdefault(posixpath.dirname(url.rstrip("/")), []).append(url)
    out: list[str] = []
    for directory, urls in sorted(by_dir.items()):
        fs, root = url_to_fs(directory, **storage_options)
        try:
            listed = {posixpath.basename(str(info["name"]).rstrip("/")): info
                      for info in fs.ls(root, detail=True, refresh=True)}
        except FileNotFoundError:
            listed = {}
        for url in sorted(urls):
            info = listed.get(posixpath.basename(url))
            ident = pinned[url]
            if info is None or info.get("type") == "directory":
                out.append(f"{url} is gone")
            elif ident and not same(ident, info):
                out.append(f"{url} changed since the epoch pinned it (pinned as {dict(ident)})")
    return out
