"""Things found by name: storage backends, table formats, Spark sources and sinks (one mechanism).

A :class:`Registry` maps a name to ``"module:attribute"``, imported the first time the name
is asked for, so that parsing a DAG never imports a library for a type it does not use. A
name registered at run time wins over an entry point, which wins over a built-in one.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError

T = TypeVar("T")

DISTRIBUTION = "airflow-seatunnel-ckpt"


def load(path: str) -> Any:
    """The object ``"module:attribute"`` names (the module for ``"module"``); ImportError as Python says it."""
    module, _, attribute = path.partition(":")
    value: Any = importlib.import_module(module)
    for part in attribute.split(".") if attribute else ():
        value = getattr(value, part)
    return value


class Registry(Generic[T]):
    """Names of one kind -> what they stand for, imported on first use.

    :param kind: what a name is, for messages (``"store protocol"``, ``"sink"``...).
    :param builtin: the package's own names -> ``"module:attribute"``.
    :param extras: built-in names -> the pip extra that installs what they import.
    :param group: the entry-point group installed packages add names in, if any.
    :param unknown: the message for an unknown name, given it and the known names.
    :param error: the exception raised (a :class:`CheckpointError` subclass).
    :param accepts: whether a loaded value is of the right kind (``None``: anything is),
        with the words for what it must be.
    :param options: ``"module:attribute"`` of the options models keyed on the names
        (a mapping), for a registry of connector types.
    """

    def __init__(self, kind: str, builtin: Mapping[str, str], *, extras: Mapping[str, str] | None = None,
                 group: str | None = None, unknown: Callable[[str, list[str]], str] | None = None,
                 error: type[CheckpointError] = ConfigError,
                 accepts: tuple[Callable[[Any], bool], str] | None = None, options: str | None = None) -> None:
        self.kind = kind
        self.group = group
        self._builtin = dict(builtin)
        self._extras = dict(extras or {})
        self._unknown = unknown or (lambda name, known: f"unknown {kind} {name!r}; known: {known}")
        self._error = error
        self._accepts = accepts
        self._options_path = options
        self._registered: dict[str, T] = {}
        self._models: dict[str, Any] = {}
        self._models_read = options is None
        self._loaded: dict[str, T] = {}
        self._lock = threading.Lock()

    def register(self, name: str, value: T, options: Any = None) -> None:
        """Make ``name`` stand for ``value`` (and ``options`` its options model, if given)."""
        with self._lock:
            self._registered[name] = value
            self._loaded.pop(name, None)
            if options is not None:
                self._models[name] = options
            else:
                self._models.pop(name, None)

    def forget(self) -> None:
        """Forget what was loaded (the next look-up imports and reads the entry points again)."""
        with self._lock:
            self._loaded.clear()

    def _entry_points(self) -> list[Any]:
        return list(entry_points(group=self.group)) if self.group else []

    @property
    def names(self) -> list[str]:
        """Every name known here, sorted (built-in, registered, from entry points)."""
        return sorted({*self._builtin, *self._registered, *(ep.name for ep in self._entry_points())})

    def is_builtin(self, name: str) -> bool:
        """Whether ``name`` is one of the package's own (not replaced at run time)."""
        return name in self._builtin and name not in self._registered

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names

    def get(self, name: str) -> T:
        """What ``name`` stands for, imported on first use; the registry's error if it cannot be had."""
        if name in self._registered:
            return self._registered[name]
        if name in self._loaded:
            return self._loaded[name]
        value = self._load(name)
        with self._lock:
            self._loaded[name] = value
        return value

    def _load(self, name: str) -> T:
        for ep in self._entry_points():
            if ep.name == name:
                what = f"entry point {ep.value!r} for {self.kind} {name!r} in group {self.group}"
                try:
                    value = ep.load()
                except Exception as exc:
                    raise self._error(f"{what} cannot be loaded: {exc}") from exc
                return self._checked(name, value, what)
        if name not in self._builtin:
            raise self._error(self._unknown(name, self.names))
        try:
            value = load(self._builtin[name])
        except ImportError as exc:
            extra = self._extras.get(name)
            raise self._error(
                f"{self.kind} {name!r} cannot be used here: {exc}. "
                + (f"Install it where this runs: pip install '{DISTRIBUTION}[{extra}]'" if extra else
                   f"Reinstall {DISTRIBUTION} where this runs")) from exc
        return self._checked(name, value, f"{self.kind} {name!r} ({self._builtin[name]})")

    def _checked(self, name: str, value: Any, what: str) -> T:
        if self._accepts is not None and not self._accepts[0](value):
            raise self._error(f"{what} is not {self._accepts[1]}")
        return value  # type: ignore[no-any-return]

    def options_model(self, name: str) -> Any:
        """The options model of type ``name`` (registered with it, else the package's), or None."""
        if name in self._registered:
            return self._models.get(name)
        if not self._models_read and self._options_path is not None:
            try:
                models = load(self._options_path)
            except (ImportError, AttributeError):  # no models (yet): each type checks its own options
                models = {}
            with self._lock:
                self._models = {**models, **self._models}
                self._models_read = True
        return self._models.get(name)
