"""Process-level fault injection: SIGKILL (or SIGSTOP) a process at its N-th store mutation.

Installed only inside a child process that is about to run one protocol step. Every
mutation the step makes to a store -- on a local disk each ``os.replace``, ``os.link``,
``os.rename``, ``os.unlink`` and ``os.rmdir`` a :class:`Storage` method performs, on an
object store each PUT, conditional PUT, per-file copy and per-object delete -- is a
numbered *crash point*. Before mutation number ``crash_at`` the process sends itself
``SIGKILL``: no exception, no ``finally``, no flush -- exactly what the OOM killer, a
lost node or ``kill -9`` does to an Airflow task or a Spark driver.

Each point is appended to an op log (one ``write(2)`` per line, so it survives the kill)
with the semantic operation and the store path, so the parent can name the protocol step
the process died in (see :func:`classify`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from airflow_seatunnel_ckpt.core.storage import LocalStorage, ObjectStorage, Storage
from airflow_seatunnel_ckpt.core.storage import publish as storage_module

#: Crash after every mutation of the step, i.e. the task dies before reporting success.
AFTER_LAST = "after-last"


@dataclass(frozen=True)
class FaultPlan:
    """Where to stop the process: at mutation ``crash_at`` (1-based) or ``pause_at``."""

    crash_at: int | None = None
    pause_at: int | None = None
    op_log: str | None = None
    #: Pause at the first mutation whose ``"<op> <path> <low-level call>"`` matches this
    #: regular expression (to line racing processes up at the same protocol step).
    pause_on: str | None = None


class _Injector:
    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.count = 0
        self.paused = False
        self.local = threading.local()
        # Publish copies files from a thread pool: counting, logging and the crash check of
        # one mutation must not interleave with another thread's, or a crash point is lost.
        self.lock = threading.Lock()
        self.fd = os.open(plan.op_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if plan.op_log else None

    # -- the semantic operation a low-level call belongs to ------------------------------
    def context(self) -> list[tuple[str, str]]:
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    @contextmanager
    def op(self, kind: str, path: str) -> Iterator[None]:
        stack = self.context()
        stack.append((kind, path))
        try:
            yield
        finally:
            stack.pop()

    def point(self, low: str) -> None:
        """One mutation is about to happen: log it, then maybe kill or pause the process."""
        stack = self.context()
        if not stack:
            return  # not a store mutation (e.g. a temp file of a library)
        kind, path = stack[-1]
        with self.lock:
            self.count += 1
            n = self.count
            if self.fd is not None:
                line = json.dumps({"n": n, "op": kind, "path": path, "low": low}) + "\n"
                os.write(self.fd, line.encode())
            if self.plan.crash_at == n:
                os.kill(os.getpid(), signal.SIGKILL)
            if self.plan.pause_at == n:
                os.kill(os.getpid(), signal.SIGSTOP)
            if self.plan.pause_on and not self.paused and re.search(self.plan.pause_on, f"{kind} {path} {low}"):
                self.paused = True
                os.kill(os.getpid(), signal.SIGSTOP)

    def end(self) -> None:
        """The step finished: log its total, and die here if asked to crash after the last op."""
        if self.fd is not None:
            os.write(
                self.fd,
                (json.dumps({"n": self.count + 1, "op": "end", "path": "", "low": ""}) + "\n").encode(),
            )
        if self.plan.crash_at == self.count + 1:
            os.kill(os.getpid(), signal.SIGKILL)


_INJECTOR: _Injector | None = None


def _store_path(storage: Storage, path: str) -> str:
    """A path for the op log: the root-relative path prefixed by the root's last segments."""
    root = storage.url.rstrip("/").split("/")
    return "/".join(root[-2:]) + "/" + path


def install(plan: FaultPlan) -> None:
    """Patch the storage backends and the ``os`` calls they make. Child processes only."""
    global _INJECTOR
    if _INJECTOR is not None:
        raise RuntimeError("fault injection is already installed in this process")
    inj = _INJECTOR = _Injector(plan)

    def low_level(name: str) -> None:
        original = getattr(os, name)

        def patched(*args: Any, **kwargs: Any) -> Any:
            target = args[0] if args else ""
            inj.point(f"{name} {os.path.basename(str(target))}")
            return original(*args, **kwargs)

        setattr(os, name, patched)

    for name in ("replace", "link", "rename", "unlink", "remove", "rmdir"):
        low_level(name)

    def semantic(cls: type[Storage], name: str, kind: str, counted: bool) -> None:
        if name not in cls.__dict__:
            return  # inherited: the wrapper of the class that defines it covers this one
        original: Callable[..., Any] = cls.__dict__[name]

        def patched(self: Storage, path: str, *args: Any, **kwargs: Any) -> Any:
            with inj.op(kind, _store_path(self, path)):
                if counted and not isinstance(self, LocalStorage):
                    inj.point(kind)
                return original(self, path, *args, **kwargs)

        setattr(cls, name, patched)

    # Object stores: one point per request that changes the store.
    semantic(Storage, "write_atomic", "write", counted=True)
    semantic(Storage, "create_exclusive", "create", counted=True)
    semantic(ObjectStorage, "create_exclusive", "create", counted=True)
    # Local disk: the points are the os calls inside these methods.
    semantic(LocalStorage, "write_atomic", "write", counted=False)
    semantic(LocalStorage, "create_exclusive", "create", counted=False)

    original_publish = storage_module.publish_files

    def publish_files(source: Storage, src: str, dest: Storage, dst: str, *args: Any, **kwargs: Any) -> Any:
        with inj.op("publish", _store_path(dest, dst)):
            return original_publish(source, src, dest, dst, *args, **kwargs)

    storage_module.publish_files = publish_files

    original_delete = Storage.delete

    def delete(self: Storage, path: str, recursive: bool = False) -> None:
        with inj.op("delete", _store_path(self, path)):
            if isinstance(self, LocalStorage):
                return original_delete(self, path, recursive)
            # An object store deletes object by object (DeleteObjects is not atomic either),
            # so a crash can leave any prefix of them deleted.
            files = self.walk(path, include_temp=True) if recursive else []
            for f in files:
                with inj.op("delete", _store_path(self, f"{path}/{f.path}")):
                    inj.point("delete-object")
                    original_delete(self, f"{path}/{f.path}")
            inj.point("delete")
            return original_delete(self, path, recursive)

    Storage.delete = delete  # type: ignore[method-assign]

    original_copy = storage_module.copy_file

    def copy_file(src: Storage, src_path: str, dest: Storage, dst_path: str) -> None:
        with inj.op("publish", _store_path(dest, dst_path)):
            if not isinstance(dest, LocalStorage):
                inj.point("copy")
            return original_copy(src, src_path, dest, dst_path)

    storage_module.copy_file = copy_file


def step_finished() -> None:
    """Call when the step returned: counts the 'after the last mutation' crash point."""
    if _INJECTOR is not None:
        _INJECTOR.end()


def read_op_log(path: str) -> list[dict[str, Any]]:
    """The op log a child wrote (the last line is the point it died at, if it was killed)."""
    try:
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


# -- naming crash points ------------------------------------------------------------------

_RULES: list[tuple[str, str]] = [
    (r"/_txlog/epoch-\d+/begin$", "begin record"),
    (r"/_txlog/runs/", "run index"),
    (r"/_txlog/epoch-\d+/prepared-", "prepared record"),
    (r"/_txlog/epoch-\d+/plan-", "input plan record"),
    (r"/_txlog/epoch-\d+/decision$", "decision record"),
    (r"/_txlog/epoch-\d+/committed$", "committed record"),
    (r"/_txlog/epoch-\d+/aborted$", "aborted record"),
    (r"/_txlog/epoch-\d+/retired$", "retired record"),
    (r"/_staging/", "staging"),
    (r"/checkpoint_\d+/_metadata$", "_metadata"),
    (r"/checkpoint_\d+/sinks/", "sink marker"),
    (r"/checkpoint_\d+/sources/[^/]+/_meta$", "source _meta"),
    (r"/checkpoint_\d+/sources/", "source-state part"),
    (r"/checkpoint_\d+/operators/", "keyed-state part"),
    (r"/checkpoint_\d+/?$", "checkpoint dir"),
    (r"/epoch=\d+/_SUCCESS$", "publish _SUCCESS"),
    (r"/epoch=\d+(/|$)", "publish file"),
]


def classify(entry: dict[str, Any]) -> str:
    """Name a logged mutation: ``"<operation> <what>[: <low-level call>]"``."""
    if entry["op"] == "end":
        return "after the last mutation (task dies before reporting success)"
    path = entry["path"]
    what = "store file"
    for pattern, name in _RULES:
        if re.search(pattern, path):
            what = name
            break
    low = entry.get("low", "")
    base = os.path.basename(path)
    if what != "staging" and "/.tmp-" in "/" + base:
        what = "temp file"
    verb = entry["op"]
    if verb == "publish" and what == "publish file":
        what = "sink output"
    detail = ""
    if low.startswith("replace"):
        detail = " (temp written, before rename)"
    elif low.startswith("link"):
        detail = " (temp written, before link)"
    elif low.startswith(("unlink", "remove")) and entry["op"] == "create":
        detail = " (record linked, before temp removed)"
    elif low.startswith("rename"):
        detail = " (rename)"
    elif low == "copy":
        detail = " (copy one file)"
    elif low.startswith(("unlink", "remove", "rmdir", "delete")):
        detail = ""
    return f"{verb} {what}{detail}"
