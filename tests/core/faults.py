"""Crash injection: the process "dies" right before the N-th storage mutation.

Every mutating storage primitive (``write_atomic``, ``create_exclusive``, ``delete``,
``rename_dir`` -- the local publish's one rename -- and ``_copy_in_store``, a publish's
copy within one store) of every backend class is
wrapped, so the pipeline's own storage, its children and the sinks' target storages all
count. The crash is a :class:`SimulatedCrash`, a ``BaseException``: like a killed process,
no ``except Exception`` in the code under test can swallow it.

:func:`crash_at_every_mutation` drives one protocol step with N = 1, 2, ... until the step
runs to completion, resuming and checking the invariants after each crash.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from airflow_seatunnel_ckpt.core.storage import LocalStorage, MemoryStorage, ObjectStorage, Storage

MUTATIONS = ("write_atomic", "create_exclusive", "delete", "rename_dir", "_copy_in_store")

W = TypeVar("W")


class SimulatedCrash(BaseException):
    """The process died here."""


@dataclass
class CrashPlan:
    """Counts storage mutations and crashes before the armed one."""

    crash_before: int | None = None
    mutations: int = 0
    trace: list[str] = field(default_factory=list)
    #: Crash before the first mutation whose description holds this text (see :meth:`arm_at`).
    crash_at: str | None = None

    def arm(self, n: int) -> None:
        self.crash_before, self.crash_at, self.mutations, self.trace = n, None, 0, []

    def arm_at(self, text: str) -> None:
        """Crash before the first mutation of a path holding ``text`` (e.g. ``"/committed"``)."""
        self.crash_before, self.crash_at, self.mutations, self.trace = None, text, 0, []

    def disarm(self) -> None:
        self.crash_before = self.crash_at = None

    def tick(self, what: str) -> None:
        if self.crash_before is None and self.crash_at is None:
            return
        self.mutations += 1
        self.trace.append(what)
        if self.mutations == self.crash_before or (self.crash_at is not None and self.crash_at in what):
            raise SimulatedCrash(f"crash before mutation #{self.mutations}: {what}")


def install(monkeypatch: pytest.MonkeyPatch, plan: CrashPlan | None = None) -> CrashPlan:
    """Wrap every mutating primitive of every storage class to count for ``plan`` (default: a new
    one); returns the (disarmed) plan."""
    plan = plan or CrashPlan()
    for cls in (Storage, LocalStorage, MemoryStorage, ObjectStorage):
        for name in MUTATIONS:
            original = cls.__dict__.get(name)
            if original is None:
                continue

            def wrapper(
                self: Storage,
                *args: Any,
                _original: Any = original,
                _name: str = name,
                **kwargs: Any,
            ) -> Any:
                plan.tick(f"{type(self).__name__}.{_name}({args[0] if args else ''})")
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, wrapper)
    return plan


@dataclass
class CrashRun:
    """What :func:`crash_at_every_mutation` did: the crash points it tried."""

    crash_points: int = 0
    crashed_at: list[str] = field(default_factory=list)


def crash_at_every_mutation(
    plan: CrashPlan,
    setup: Callable[[int], W],
    step: Callable[[W], object],
    resume: Callable[[W], object],
    check: Callable[[W, bool], None],
    limit: int = 400,
) -> CrashRun:
    """Crash ``step`` before each of its storage mutations in turn.

    For N = 1, 2, ...: build a fresh world with ``setup(N)``, run ``step`` crashing before
    its N-th mutation, then ``resume`` (the normal path a retry or the recovery DAG would
    take) and ``check(world, crashed)``. Ends after the first N at which ``step``
    completes without reaching a crash (that run is checked too).
    """
    run = CrashRun()
    for n in itertools.count(1):
        assert n <= limit, f"step still mutating after {limit} crash points"
        world = setup(n)
        plan.arm(n)
        crashed = False
        try:
            step(world)
        except SimulatedCrash as crash:
            crashed = True
            run.crashed_at.append(str(crash))
        finally:
            plan.disarm()
        if crashed:
            resume(world)
        try:
            check(world, crashed)
        except AssertionError as exc:
            where = run.crashed_at[-1] if crashed else "no crash"
            raise AssertionError(f"after {where}: {exc}") from exc
        if not crashed:
            run.crash_points = n - 1
            return run
    raise AssertionError("unreachable")  # pragma: no cover
