"""The file sink: each epoch's files in ``<target>/epoch=<e>/``, behind the sink contract.

The target holds the ``_seatunnel_ckpt_owner`` marker, ``epoch=<e>/`` directories with a
``_SUCCESS`` summary written last (the epoch's marker), ``_LATEST`` for snapshot sinks and
the ``_EPOCHS`` pointer a replay swaps (:func:`current_epoch_dirs` reads it). Nothing else
is ever deleted; docs/ARCHITECTURE.md has the layout.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tenacity

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, PublishError, SinkRefusedError, StorageError
from airflow_seatunnel_ckpt.core.models import PublishedSink, SinkMode
from airflow_seatunnel_ckpt.core.sinks.base import SinkCommit
from airflow_seatunnel_ckpt.core.storage import publish
from airflow_seatunnel_ckpt.core.storage.base import TEMP_PREFIX, FileInfo, Storage
from airflow_seatunnel_ckpt.core.storage.publish import DEFAULT_CONCURRENCY, PublishMethod
from airflow_seatunnel_ckpt.core.storage.registry import open_storage

# The target's own files start with ``_``: readers skip them like every ``_`` file (Spark, Hive, pandas).
#: The marker naming a sink target's owner (store and pipeline), at the target's root.
OWNER_MARKER = "_seatunnel_ckpt_owner"
#: The summary written last into each published epoch directory.
SUCCESS = "_SUCCESS"
#: A snapshot sink's current snapshot directory (``epoch=<e>``, one line).
LATEST = "_LATEST"
#: Which epoch directories readers skip, after a replay (JSON, :class:`EpochsPointer`).
EPOCHS = "_EPOCHS"
EPOCH_DIR = re.compile(r"^epoch=(\d+)$")


def target_of(request: SinkCommit) -> Storage:
    """The sink's target directory, opened as a store (with the options the pipeline gives for it)."""
    return open_storage(request.sink.target_url, request.target_options)


def precheck(request: SinkCommit) -> None:
    """Everything a file sink's target can refuse (its owner, a replay's unreadable ``_EPOCHS``), checked
    before the commit decision; a store error is raised as it is (transient)."""
    target = target_of(request)
    claim_target(target, request.owner)
    if request.replaces and request.sink.mode is not SinkMode.SNAPSHOT:
        try:
            read_epochs_pointer(target)
        except PublishError as exc:
            raise SinkRefusedError(str(exc)) from None


def commit(request: SinkCommit) -> PublishedSink:
    """Publish the epoch's staged files as ``<target>/epoch=<e>/`` (see the module docs); idempotent."""
    sink, epoch = request.sink, request.epoch
    target = target_of(request)
    dst = layout.published_dir(epoch)
    summary: dict[str, Any] = {"pipeline": request.pipeline, "epoch": epoch, "sink": sink.sink, "rows": sink.rows,
                               "bytes": sink.bytes, "files": [{"path": f.path, "size": f.size} for f in sink.files]}
    if sink.mode is SinkMode.SNAPSHOT:
        summary["mode"] = sink.mode.value
    replay = bool(request.replaces)  # a replay's output: one staged subdirectory per epoch run again
    if replay:
        summary["replaces"] = list(request.replaces)
        summary["files"] = [{"path": f.path.partition("/")[2], "size": f.size} for f in sink.files]

    def publish_dir() -> PublishMethod:
        return publish_sink_dir(request.staged, sink.staging, target, dst, sink.files, summary,
                                owner=request.owner, retries=request.retries,
                                concurrency=request.concurrency, flatten=replay)

    if replay and sink.mode is not SinkMode.SNAPSHOT:  # swapped for the replaced epochs' directories
        how = replace_epoch_dirs(target, dst, [layout.published_dir(e) for e in request.replaces], publish_dir)
    else:
        how = publish_dir()
    if sink.mode is SinkMode.SNAPSHOT:
        snapshots = {e: name for name in target.list_dir("")
                     if (e := layout.parse_staging_epoch(name)) is not None}
        retire_older_snapshots(target, snapshots, epoch)
    return request.published(dst, how)


#: A replay's commit (the contract's replace) is the commit: it swaps when ``request.replaces`` is set.
replace = commit


def held_epoch(request: SinkCommit) -> int | None:
    """The newest epoch whose commit the target holds finished; None: none. Reads only.

    Finished: its directory is complete and current, and what :func:`commit` does after
    writing it is done too (replaced directories removed, ``_LATEST`` and no older snapshot).
    """
    target = target_of(request)
    names = target.list_dir("")
    pointer = read_epochs_pointer(target)
    dirs = pointer.current(names, lambda d: target.exists(f"{d}/{SUCCESS}"))
    if not dirs:
        return None
    newest = dirs[-1]
    unfinished = any(name in names for name in pointer.replaced_by.get(newest, ()))
    if request.sink.mode is SinkMode.SNAPSHOT:
        try:
            latest = target.read(LATEST).decode().strip()
        except FileNotFoundError:
            latest = ""
        unfinished = unfinished or latest != newest or len(dirs) > 1
    if unfinished:  # the one before it is held
        dirs = dirs[:-1]
    return int(dirs[-1].split("=", 1)[1]) if dirs else None


def publish_sink_dir(source: Storage, staging: str, target: Storage, dst: str, files: Sequence[FileInfo],
                     summary: Mapping[str, Any], *, owner: Mapping[str, str], retries: int,
                     deadline_s: float = 300.0, concurrency: int = DEFAULT_CONCURRENCY,
                     flatten: bool = False) -> PublishMethod:
    """Publish one sink's staged ``files`` to ``target:dst`` and write its ``_SUCCESS``.

    Transient store errors are retried ``retries`` times (at most ``deadline_s`` in all). With
    ``flatten`` (a replay's output, one staged subdirectory per epoch run again) each file
    ``<subdir>/<path>`` is published as ``<path>``, the layout of any other epoch's directory.
    """
    groups: dict[str, list[FileInfo]] = {"": list(files)}
    if flatten:
        groups = {}
        for f in files:
            head, _, rest = f.path.partition("/")
            groups.setdefault(head, []).append(FileInfo(rest, f.size, f.crc32c))

    @tenacity.retry(retry=tenacity.retry_if_exception(
                        lambda e: isinstance(e, StorageError) and not isinstance(e, PublishError)),
                    stop=tenacity.stop_after_attempt(retries + 1) | tenacity.stop_after_delay(deadline_s),
                    wait=tenacity.wait_exponential(multiplier=0.05, max=5), reraise=True)
    def attempt() -> PublishMethod:
        claim_target(target, owner)
        hows = [publish.publish_files(source, posixpath.join(staging, sub) if sub else staging, target, dst, group,
                                      concurrency=concurrency) for sub, group in groups.items()]
        how = next((h for h in hows if h is not PublishMethod.ALREADY), PublishMethod.ALREADY)
        # A publisher killed while writing into the epoch directory (the _SUCCESS mark,
        # a copied file) left a temp file in the user-visible output. The directory
        # belongs to this epoch alone, so any temp in it is such debris; a concurrent
        # publisher whose temp this removes retries through this loop.
        for f in target.walk(dst, include_temp=True):
            if posixpath.basename(f.path).startswith(TEMP_PREFIX):
                target.delete(f"{dst}/{f.path}")
        target.write_atomic(f"{dst}/{SUCCESS}", json.dumps(dict(summary), indent=1).encode())
        return how

    return attempt()


def retire_older_snapshots(target: Storage, snapshots: Mapping[int, str], epoch: int) -> str:
    """Make the newest published snapshot the only one in a snapshot sink's ``target``; the current directory.

    ``snapshots`` maps epoch -> directory name, ``epoch`` is the one just published. The newest
    complete directory (a newer one if a later epoch committed before this retry) becomes
    ``_LATEST`` (written before anything is removed), then every older one is removed.
    """
    complete = [e for e, name in snapshots.items() if target.exists(f"{name}/{SUCCESS}")]
    newest = max([*complete, epoch])
    current = snapshots.get(newest, f"epoch={newest}")
    try:
        pointed = target.read(LATEST).decode().strip()
    except FileNotFoundError:
        pointed = ""
    by_name = {name: e for e, name in snapshots.items()}
    if by_name.get(pointed, -1) < newest:  # never point back to an older snapshot
        target.write_atomic(LATEST, (current + "\n").encode())
    for e, name in sorted(snapshots.items()):
        if e < newest:
            target.delete(name, recursive=True)
    return current


@dataclass(frozen=True)
class EpochsPointer:
    """The ``_EPOCHS`` pointer of an append file sink's target: which epoch directories readers skip.

    Written whole only by a replay's commit (docs/REPLAY.md). ``hidden``: the directories a
    reader skips; ``replaced_by``: each swapped-in replay directory's replaced ones;
    ``version`` grows with every write.
    """

    version: int = 0
    hidden: frozenset[str] = frozenset()
    replaced_by: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: bytes, where: str) -> EpochsPointer:
        """Read a pointer's bytes (``where`` names the file in errors)."""
        try:
            raw = json.loads(data)
            return cls(int(raw["version"]), frozenset(str(d) for d in raw["hidden"]),
                       {str(k): tuple(str(d) for d in v) for k, v in dict(raw.get("replaced_by") or {}).items()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PublishError(f"{where} is not a valid epoch pointer ({exc}); it is written only by a replay's "
                               "commit: restore it from that commit (run the commit or recovery again), or "
                               "remove it if no replay ever ran on this target") from None

    def to_bytes(self) -> bytes:
        """The pointer as stored."""
        return json.dumps({"version": self.version, "hidden": sorted(self.hidden),
                           "replaced_by": {k: list(v) for k, v in sorted(self.replaced_by.items())}},
                          indent=1).encode()

    def current(self, names: Iterable[str], complete: Callable[[str], bool]) -> list[str]:
        """The current epoch directories among the target's entry ``names`` (``complete``: holds ``_SUCCESS``)."""
        return sorted((n for n in names if EPOCH_DIR.match(n) and n not in self.hidden and complete(n)),
                      key=lambda n: int(n.split("=", 1)[1]))


def read_epochs_pointer(target: Storage) -> EpochsPointer:
    """The target's ``_EPOCHS`` pointer (an empty one when there is none)."""
    try:
        return EpochsPointer.parse(target.read(EPOCHS), target.describe_path(EPOCHS))
    except FileNotFoundError:
        return EpochsPointer()


def current_epoch_dirs(target: Storage, attempts: int = 10) -> tuple[int, list[str]]:
    """The documented read path of an append file sink (docs/REPLAY.md): ``(version, epoch directories to read)``,
    listed between two reads of the pointer that agree (PublishError if none do in ``attempts`` listings)."""
    for _ in range(attempts):
        before = read_epochs_pointer(target)
        dirs = before.current(target.list_dir(""), lambda d: target.exists(f"{d}/{SUCCESS}"))
        if read_epochs_pointer(target) == before:
            return before.version, dirs
    raise PublishError(f"{target.describe()}: its {EPOCHS} pointer changed during each of {attempts} listings; "
                       "a replay is swapping its epochs: read again once it committed")


def replace_epoch_dirs(target: Storage, new: str, old: Sequence[str], publish: Callable[[], PublishMethod]
                       ) -> PublishMethod:
    """Publish a replay's directory ``new`` (by ``publish``) in place of the epoch directories ``old``: hidden
    while written, then one pointer write swaps them, then ``old`` are removed (docs/REPLAY.md). Safe to repeat:
    a pointer that records the swap skips to the removal, so readers never go back to the old set."""
    pointer = read_epochs_pointer(target)
    how = PublishMethod.ALREADY
    if new not in pointer.replaced_by:
        if new not in pointer.hidden:
            pointer = EpochsPointer(pointer.version + 1, pointer.hidden | {new}, pointer.replaced_by)
            target.write_atomic(EPOCHS, pointer.to_bytes())
        how = publish()
        pointer = EpochsPointer(pointer.version + 1, (pointer.hidden - {new}) | set(old),
                                {**pointer.replaced_by, new: tuple(sorted(old))})
        target.write_atomic(EPOCHS, pointer.to_bytes())
    for name in pointer.replaced_by[new]:
        target.delete(name, recursive=True)
    return how


def claim_target(target: Storage, owner: Mapping[str, str]) -> None:
    """Create ``target``'s owner marker, or check that it names ``owner`` (else SinkRefusedError)."""
    mine = dict(sorted(owner.items()))
    try:
        found = target.read(OWNER_MARKER)
    except FileNotFoundError:
        try:
            target.create_exclusive(OWNER_MARKER, json.dumps(mine, indent=1).encode())
            return
        except AlreadyExistsError:  # another publisher claimed it just now
            found = target.read(OWNER_MARKER)
    where = target.describe_path(OWNER_MARKER)
    try:
        theirs = json.loads(found)
        if not isinstance(theirs, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise SinkRefusedError(
            f"cannot publish to {target.describe()}: its owner marker {where} is not valid JSON ({exc}); "
            f"check which pipeline writes there, then delete the marker and run the epoch again") from None
    if {k: theirs.get(k) for k in mine} != mine:
        raise SinkRefusedError(
            f"cannot publish to {target.describe()}: it belongs to pipeline {theirs.get('pipeline')!r} of store "
            f"{theirs.get('store')!r} (marker {where}), not to pipeline {mine.get('pipeline')!r} of store "
            f"{mine.get('store')!r}; epochs of both would mix in one directory. Give this sink its own target "
            f"URL, or, if the target was deliberately handed over (the store moved), delete the marker and "
            f"run the epoch again")
