"""Type name -> factory registries for the sources and sinks a stage spec names."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from airflow_seatunnel_ckpt.core.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Builds ``{"type": name, **options}`` entries of a stage spec as ``factory(name, **options)``."""

    def __init__(self, kind: str, builtin: Mapping[str, Callable[..., T]]) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = dict(builtin)

    def register(self, type_name: str, factory: Callable[..., T]) -> None:
        """Make ``{"type": type_name, ...}`` build with ``factory(name, **options)``."""
        self._factories[type_name] = factory

    def build(self, name: str, options: Mapping[str, Any]) -> T:
        """Build the entry ``name`` that ``options`` describe (default type ``file``)."""
        opts = dict(options)
        type_name = opts.pop("type", "file")
        factory = self._factories.get(type_name)
        if factory is None:
            raise ConfigError(
                f"{self.kind} {name!r}: unknown type {type_name!r}; known: {sorted(self._factories)}"
            )
        try:
            return factory(name, **opts)
        except TypeError as exc:
            raise ConfigError(f"{self.kind} {name!r}: bad options {sorted(opts)}: {exc}") from exc
