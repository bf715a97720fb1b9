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
from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, PublishError, SinkRefusedError, StorageError
from airflow_seatunnel_ckpt.core.models import PublishedSink, SinkMode
from airflow_seatunnel_ckpt.core.sinks.base import SinkCommit
from airflow_seatunnel_ckpt.core.storage import publish
from airflow_seatunnel_ckpt.core.storage.base import TEMP_PREFIX, FileInfo, Storage
from airflow_seatunnel_ckpt.core.storage.publish import DEFAULT_CONCURRENCY, PublishMethod
from airflow_seatunnel_ckpt.core.storage.registry import open_storage

#: The marker naming a sink target's owner (store and pipeline), at the target's root.
#: Readers skip it like every ``_`` file (Spark, Hive, pandas).
OWNER_MARKER = "_seatunnel_ckpt_owner"
#: The summary written last into each published epoch directory.
SUCCESS = "_SUCCESS"
#: In the target of a snapshot sink: the name of the directory holding the current
#: snapshot (``epoch=<e>``, one line). Readers skip it like every ``_`` file.
LATEST = "_LATEST"
#: In the target of an ``append`` sink a replay replaced epochs of: which epoch directories
#: readers skip (JSON, see :class:`EpochsPointer`). Readers skip the file itself like every ``_`` file.
EPOCHS = "_EPOCHS"
#: A published epoch directory's name.
EPOCH_DIR = re.compile(r"^epoch=(\d+)$")


def target_of(request: SinkCommit) -> Storage:
    """The sink's target directory, opened as a store (with the options the pipeline gives for it)."""
    return open_storage(request.sink.target_url, request.target_options)


def precheck(request: SinkCommit) -> None:
    """Everything a file sink's target can refuse, checked before the commit decision.

    The owner marker is claimed (or checked: :func:`claim_target`), and for a replay's output
    the ``_EPOCHS`` pointer it swaps must be readable. A refusal raises
    :class:`SinkRefusedError`, with which the decision aborts the epoch; after the decision,
    publishing fails only for transient reasons (or a target changed in between). A store
    error is raised as it is (transient: the decision is asked again).
    """
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
    return PublishedSink(sink.sink, redact_url(sink.target_url), dst, len(sink.files), sink.rows, sink.bytes,
                         how.value)


#: The contract's replace (a replay's commit) is this same commit: with ``request.replaces`` set, its
#: directory is swapped in for the replaced epochs' through ``_EPOCHS`` (:func:`replace_epoch_dirs`).
replace = commit


def held_epoch(request: SinkCommit) -> int | None:
    """The newest epoch whose commit the target holds finished; None: none. Reads only.

    An epoch's directory is complete (its ``_SUCCESS``) and current (not hidden by
    ``_EPOCHS``; a replay's directory counts as its own epoch, holding the replaced ones),
    and what :func:`commit` does after writing it is done too: a replay's replaced
    directories are removed, a snapshot is the one ``_LATEST`` names and no older one is
    left. Recovery acknowledges an epoch held so without committing it again, so an
    unfinished one counts as not held (its commit finishes it).
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

    Transient store errors are retried ``retries`` times (exponential backoff, at most
    ``deadline_s`` in all); a :class:`PublishError` is not retried. Up to ``concurrency``
    files are checked and copied at once (see :func:`storage.publish.publish_files`). With ``flatten``
    (a replay's output, one staged subdirectory per epoch run again) each file
    ``<subdir>/<path>`` is published as ``<path>``: the directory keeps the layout of any
    other epoch's (its partition directories right below it).
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
    """Make the newest published snapshot the only one in a snapshot sink's ``target``.

    ``snapshots`` maps epoch -> directory name of every ``epoch=<e>`` directory found in
    the target, ``epoch`` is the one just published. The newest directory holding a
    ``_SUCCESS`` (normally ``epoch``'s; a newer one if a later epoch committed before
    this retry) becomes the target's ``_LATEST``, then every older snapshot directory is
    removed: a reader listing the target sees exactly one snapshot once the commit is
    done. Between the new directory's ``_SUCCESS`` and the removal a listing reader may
    see two; a reader that must never see that reads the directory ``_LATEST`` names
    (written atomically, before anything is removed). Returns the current directory.
    Only superseded snapshots are deleted: each one was the whole table of an older,
    committed epoch, and the current directory holds everything they held.
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
    """The ``_EPOCHS`` pointer of a ``changes`` file sink's target: which epoch directories readers skip.

    Written (atomically, whole) only by a replay's commit; a target no replay touched has
    none and every ``epoch=<e>`` directory holding ``_SUCCESS`` is current. ``hidden``
    are directories a reader skips: a replay's own directory while it is being published,
    then, from the swap on, the directories it replaced. ``replaced_by`` maps each
    swapped-in replay directory to the directories it replaced. ``version`` grows with
    every write: a reader that saw the same version before and after reading read one
    consistent set of directories.
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
    """The documented read path of a ``changes`` file sink: ``(version, epoch directories to read)``.

    The directories ``epoch=<e>`` holding ``_SUCCESS`` that the ``_EPOCHS`` pointer does not
    hide, listed between two reads of the pointer that agree. A reader reads the data files
    of these directories, then calls this again (or reads the pointer): the same version
    means no replay swapped directories meanwhile; another means read again (the old
    directories are being removed). Raises :class:`PublishError` if the pointer keeps
    changing for ``attempts`` listings.
    """
    for _ in range(attempts):
        before = read_epochs_pointer(target)
        dirs = before.current(target.list_dir(""), lambda d: target.exists(f"{d}/{SUCCESS}"))
        if read_epochs_pointer(target) == before:
            return before.version, dirs
    raise PublishError(f"{target.describe()}: its {EPOCHS} pointer changed during each of {attempts} listings; "
                       "a replay is swapping its epochs: read again once it committed")


def replace_epoch_dirs(target: Storage, new: str, old: Sequence[str], publish: Callable[[], PublishMethod]
                       ) -> PublishMethod:
    """Publish a replay's directory ``new`` (by ``publish``) in place of the epoch directories ``old``.

    1. the ``_EPOCHS`` pointer hides ``new`` (readers following it skip the directory while
       it is written);
    2. ``publish()`` writes ``new`` and its ``_SUCCESS``;
    3. **the swap**: one atomic write of the pointer hides ``old`` and shows ``new``;
    4. ``old`` are removed.

    Safe to repeat after a crash at any step: a pointer that already records the swap
    (``replaced_by[new]``) skips to step 4, so readers never go back to the old set.
    """
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
    """Create ``target``'s owner marker, or check that it names ``owner``.

    :class:`SinkRefusedError` if the target belongs to another pipeline or store (its epoch
    directories would mix with this pipeline's) or its marker is not valid JSON. Called
    before the commit decision (:func:`precheck`), so that such a target aborts the
    epoch, and again by the publish.
    """
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
