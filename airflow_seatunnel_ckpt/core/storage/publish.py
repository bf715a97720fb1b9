"""Publishing a sink's staged output: exactly the files the commit decided on, once.

:func:`publish_sink_dir` is the whole step for one sink of a commit-decided epoch:

1. the target's **owner** marker (``<target>/_seatunnel_ckpt_owner``) is created on the
   first publish, or must name this store and pipeline -- two pipelines never mix epochs
   in one directory (claimed already before the commit decision, by :func:`precheck_target`,
   so that another owner's target aborts the epoch instead of leaving it COMMITTING);
2. files already at the destination with the manifest's size and CRC32C are kept (a
   retry or a concurrent publisher; the destination is listed once); the others are
   **verified in staging** against the manifest (size and CRC32C: a file damaged after
   the decision is refused by name) before the first one moves;
3. the backend is asked **how** to move them: one directory rename where it can
   (:meth:`Storage.rename_dir`), copy file by file elsewhere; either way only the
   manifest's files are published (Spark's ``_SUCCESS`` and Hadoop ``.crc`` files stay
   behind). Checks and copies run up to ``concurrency`` at a time: on an object store
   each is one request (a ``HEAD`` answering size and CRC32C, a ``CopyObject``) whose
   latency, not bandwidth, is the cost;
4. temp debris of a killed publisher is removed from the epoch directory and the
   ``_SUCCESS`` summary is written last.

A replay's epoch of a ``changes`` file sink replaces older epoch directories: it is
published hidden and swapped in through the target's ``_EPOCHS`` pointer
(:func:`replace_epoch_dirs`); the replaced directories are removed only after the swap.
Otherwise it never deletes published output: a failure raises :class:`PublishError` (nothing to
retry) or :class:`StorageError` (retried with backoff, then raised) and leaves the epoch
COMMITTING for the next attempt.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import tenacity

from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, PublishError, SinkRefusedError, StorageError
from airflow_seatunnel_ckpt.core.storage.base import BLOCK, TEMP_PREFIX, FileInfo, Storage

T = TypeVar("T")

#: How many files a publish checks and copies at once when the caller does not say
#: (``CheckpointConfig.publish_concurrency``).
DEFAULT_CONCURRENCY = 8
#: The marker naming a sink target's owner (store and pipeline), at the target's root.
#: Readers skip it like every ``_`` file (Spark, Hive, pandas).
OWNER_MARKER = "_seatunnel_ckpt_owner"
#: The summary written last into each published epoch directory.
SUCCESS = "_SUCCESS"
#: In the target of a snapshot sink: the name of the directory holding the current
#: snapshot (``epoch=<e>``, one line). Readers skip it like every ``_`` file.
LATEST = "_LATEST"
#: In the target of a ``changes`` sink a replay replaced epochs of: which epoch directories
#: readers skip (JSON, see :class:`EpochsPointer`). Readers skip the file itself like every ``_`` file.
EPOCHS = "_EPOCHS"
#: A published epoch directory's name.
EPOCH_DIR = re.compile(r"^epoch=(\d+)$")


class PublishMethod(StrEnum):
    """How a sink's files got to their place (the values are stored in ``committed`` records)."""

    RENAME = "renamed"
    COPY = "copied"
    ALREADY = "already"


def publish_sink_dir(source: Storage, staging: str, target: Storage, dst: str, files: Sequence[FileInfo],
                     summary: Mapping[str, Any], *, owner: Mapping[str, str], retries: int,
                     deadline_s: float = 300.0, concurrency: int = DEFAULT_CONCURRENCY,
                     flatten: bool = False) -> PublishMethod:
    """Publish one sink's staged ``files`` to ``target:dst`` and write its ``_SUCCESS``.

    Transient store errors are retried ``retries`` times (exponential backoff, at most
    ``deadline_s`` in all); a :class:`PublishError` is not retried. Up to ``concurrency``
    files are checked and copied at once (see :func:`publish_files`). With ``flatten``
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
        hows = [publish_files(source, posixpath.join(staging, sub) if sub else staging, target, dst, group,
                              owner=owner, concurrency=concurrency) for sub, group in groups.items()]
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


def publish_files(source: Storage, src: str, target: Storage, dst: str, files: Iterable[FileInfo], *,
                  owner: Mapping[str, str] | None = None, verify: bool = True,
                  concurrency: int = DEFAULT_CONCURRENCY) -> PublishMethod:
    """Make exactly ``files`` (relative to ``source:src``) present below ``target:dst``.

    Idempotent: files already at the destination with the expected size (and CRC32C, when
    the manifest has one) are kept. Never deletes anything at the destination. Raises
    :class:`PublishError` naming the file if one is neither at the destination nor intact
    in staging. ``verify=False`` checks sizes only (for callers that just checksummed the
    staging themselves).

    Requests: one listing of the destination (not a probe per file); per file to move, one
    request for its staged size and kept checksum and one copy (or a single directory
    rename); up to ``concurrency`` files at a time, every staged file checked before the
    first is copied.
    """
    expected = list(files)
    if owner is not None:
        claim_target(target, owner)
    # What the destination already has: a retry's or a concurrent publisher's copies.
    listed = {f.path: f.size for f in target.walk(dst)}
    same_size = [f for f in expected if listed.get(f.path) == f.size]
    kept = {f.path for f, ok in zip(same_size, _each(
        lambda f: holds(target, f"{dst}/{f.path}", f, verify), same_size, concurrency), strict=True) if ok}
    missing = [f for f in expected if f.path not in kept]
    if not missing:
        return PublishMethod.ALREADY
    problems = _each(lambda f: staged_problem(source, f"{src}/{f.path}", f, verify), missing, concurrency)
    for f, problem in zip(missing, problems, strict=True):
        # Re-check the destination: a concurrent publisher (a retry, the recovery DAG)
        # may have moved the staged file there since ``missing`` was computed.
        if problem and not holds(target, f"{dst}/{f.path}", f, verify):
            raise PublishError(
                f"cannot publish {target.describe_path(dst)}: staged file {source.describe_path(f'{src}/{f.path}')} "
                f"{problem}, and the destination does not hold it either. The epoch stays COMMITTING and "
                "nothing was deleted: put the file back as the manifest of the prepared record describes "
                "it (from a backup or the writer's retained output) and run the commit or recovery again")
    if len(missing) == len(expected) and source.capabilities.atomic_rename_dir and not target.exists(dst):
        # Only the manifest is published: the writer's own bookkeeping (Spark's empty
        # _SUCCESS, Hadoop .crc files) would otherwise move along with the directory.
        # (A copy publishes the manifest's files only; the staging goes as a whole later.)
        names = {f.path for f in expected}
        for f in source.walk(src, include_temp=True):
            if f.path not in names:
                source.delete(f"{src}/{f.path}")
        if source.rename_dir(src, target, dst):
            return PublishMethod.RENAME

    def copy(f: FileInfo) -> None:
        # No probe of the destination first: a copy over a concurrent publisher's copy of
        # the same verified staged bytes changes nothing a reader could see.
        try:
            copy_file(source, f"{src}/{f.path}", target, f"{dst}/{f.path}")
        except (FileNotFoundError, StorageError):
            # The staged file may be gone because a concurrent publisher finished first.
            if not holds(target, f"{dst}/{f.path}", f, verify):
                raise

    _each(copy, missing, concurrency)
    return PublishMethod.COPY


def _each(call: Callable[[FileInfo], T], files: Sequence[FileInfo], concurrency: int) -> list[T]:
    """``call`` on every file, up to ``concurrency`` at a time; results in order, the first error raised.

    Every call has finished (or failed) when this returns or raises: nothing keeps writing
    into the destination behind the caller's back.
    """
    if concurrency <= 1 or len(files) <= 1:
        return [call(f) for f in files]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(files)), thread_name_prefix="publish") as pool:
        futures = [pool.submit(call, f) for f in files]
        wait(futures)
    return [future.result() for future in futures]


def holds(storage: Storage, path: str, f: FileInfo, verify: bool = True) -> bool:
    """Whether ``path`` has ``f``'s size and (with ``verify``, when known) its CRC32C."""
    try:
        found = storage.file_info(path)
        if found.size != f.size:
            return False
        if not verify or f.crc32c is None:
            return True
        crc = found.crc32c if found.crc32c is not None else storage.checksum(path)
        return crc == f.crc32c
    except FileNotFoundError:
        return False


def staged_problem(storage: Storage, path: str, f: FileInfo, verify: bool = True) -> str:
    """What is wrong with staged file ``path`` against its manifest entry ("" = nothing)."""
    try:
        found = storage.file_info(path)
        if found.size != f.size:
            return f"is {found.size} bytes, the manifest says {f.size}"
        if verify and f.crc32c is not None:
            crc = found.crc32c if found.crc32c is not None else storage.checksum(path)
            if crc != f.crc32c:
                return (f"has CRC32C {crc:#010x}, the manifest says {f.crc32c:#010x} "
                        "(it changed after the commit decision)")
    except FileNotFoundError:
        return "is missing"
    return ""


def claim_target(target: Storage, owner: Mapping[str, str]) -> None:
    """Create ``target``'s owner marker, or check that it names ``owner``.

    :class:`SinkRefusedError` if the target belongs to another pipeline or store (its epoch
    directories would mix with this pipeline's) or its marker is not valid JSON. Called
    before the commit decision (:func:`precheck_target`), so that such a target aborts the
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


def precheck_target(target: Storage, owner: Mapping[str, str], *, replacing: bool) -> None:
    """Everything a file sink's ``target`` can refuse, checked before the commit decision.

    The owner marker is claimed (or checked: :func:`claim_target`), and for a replay's output
    (``replacing``) the ``_EPOCHS`` pointer it swaps must be readable. A refusal raises
    :class:`SinkRefusedError`, with which the decision aborts the epoch; after the decision,
    publishing fails only for transient reasons (or a target changed in between). A store
    error is raised as it is (transient: the decision is asked again).
    """
    claim_target(target, owner)
    if replacing:
        try:
            read_epochs_pointer(target)
        except PublishError as exc:
            raise SinkRefusedError(str(exc)) from None


def copy_file(src: Storage, src_path: str, dest: Storage, dst_path: str) -> None:
    """Copy one file between (possibly different) stores; the target appears whole."""
    same_store = src.fs is dest.fs or (
        src.protocol == dest.protocol and src.storage_options == dest.storage_options)
    if same_store:
        try:
            if dest._copy_in_store(src.full_path(src_path), dest.full_path(dst_path)):
                return
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise PublishError(
                f"copying {src.describe_path(src_path)} to {dest.describe_path(dst_path)} failed: {exc}") from exc

    def stream() -> Iterator[bytes]:
        with src.open_read(src_path) as fh:
            while block := fh.read(BLOCK):
                yield block

    # Otherwise through write_atomic: a local copy would be written in place.
    dest.write_atomic(dst_path, stream())
