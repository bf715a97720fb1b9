"""Checkpoint configuration: one typed, validated place (docs/REFERENCE.md, "Configuration").

The fields mirror SeaTunnel's Spark checkpoint tuning block; each field's type and range is
declared once, and its ``description`` says what a refused value's :class:`ConfigError` quotes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pydantic
from pydantic import ConfigDict, Field, Json, TypeAdapter, ValidationError

from airflow_seatunnel_ckpt.core.errors import ConfigError

COMPRESSIONS = ("zstd", "lz4")
DEFAULT_STORE_DIR = "seatunnel-ckpt"

log = logging.getLogger(__name__)


def airflow_home() -> str:
    """``$AIRFLOW_HOME`` as an absolute path (default ``~/airflow``, as Airflow itself uses)."""
    return os.path.abspath(os.path.expanduser(os.environ.get("AIRFLOW_HOME") or "~/airflow"))


def default_storage_url() -> str:
    """The embedded default store: ``$SEATUNNEL_CKPT_STORE``, else ``file://$AIRFLOW_HOME/seatunnel-ckpt``.

    Always absolute: workers started in different directories must share one store.
    """
    env = os.environ.get("SEATUNNEL_CKPT_STORE")
    if env:
        return absolute_local_url(env, "$SEATUNNEL_CKPT_STORE")
    return "file://" + os.path.join(airflow_home(), DEFAULT_STORE_DIR)


def absolute_local_url(url: str, what: str = "storage_url") -> str:
    """``url`` as given, or -- for a relative local path -- as an absolute ``file://`` URL (with a warning).

    Resolved once, here, every process handed the configuration uses the same directory.
    """
    if not isinstance(url, str) or not url or "://" in url or "::" in url or os.path.isabs(url):
        return url
    resolved = "file://" + os.path.abspath(os.path.expanduser(url))
    if not url.startswith("~"):
        log.warning("%s %r is a relative path; it was resolved against the current directory to %r. Give "
                    "an absolute URL (file:///absolute/path) so that every worker uses the same store",
                    what, redact_url(url), redact_url(resolved))
    return resolved


#: ``scheme://userinfo@``. With a ``user:password`` form the password may itself hold
#: ``/`` (AWS secret keys do) or ``@``, so it runs to the last ``@``: redacting too much of
#: a message is harmless, leaking part of a secret is not.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?:[^@/?#]*:.*@|[^@/?#:]*@)", re.DOTALL)
#: Query parameters that carry credentials (SAS tokens, pre-signed URL signatures, keys).
_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;][^=&#;]*(?:key|secret|token|passw|pwd|signature|sig|credential|auth)[^=&#;]*=)[^&#;]*",
    re.IGNORECASE,
)


def redact_url(url: str) -> str:
    """``url`` with credentials (user:password, secret query parameters) replaced, for messages.

    Works on chained fsspec URLs (``simplecache::s3://...``) and URLs ``urlsplit`` misparses.
    """
    if not isinstance(url, str):
        return f"<{type(url).__name__}, not a URL>"
    redacted = _USERINFO.sub(lambda m: m.group("scheme") + "***@", url)
    return _SECRET_PARAM.sub(lambda m: m.group("name") + "***", redacted)


def form_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Values as a form or a text source writes them (Airflow's connection form), as the typed config reads them.

    An empty value is the field's default (left out); a number's or truth value's text and
    ``storage_options`` as JSON text are read; anything else is kept for ``from_mapping`` to check.
    """
    kinds: dict[str, Any] = {f.name: type(f.default) for f in dataclasses.fields(CheckpointConfig)
                             if isinstance(f.default, (bool, int, float))}
    kinds["storage_options"] = Json[dict[str, Any]]
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or (isinstance(value, str) and not value.strip()):
            continue  # an empty field: the default
        if isinstance(value, str) and name in kinds:
            # pydantic's lax reading of text ("300", "true", JSON); other text is kept as given,
            # for from_mapping to refuse naming the field, what it accepts and the value
            try:
                value = TypeAdapter(kinds[name]).validate_python(value.strip())
            except ValidationError:
                if name == "storage_options":  # never quoted: it holds credentials
                    raise ConfigError("storage_options must be a JSON object, got text that is not one") from None
        out[name] = value
    return out


def _seconds(upper: int) -> Any:
    return Annotated[float, Field(gt=0, le=upper, description=f"a number of seconds in (0, {upper}]")]


def _integer(low: int, high: int, accepted: str) -> Any:
    return Annotated[int, Field(ge=low, le=high, description=accepted)]


_TRUTH = Annotated[bool, Field(description="true or false")]


@pydantic.dataclasses.dataclass(config=ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False))
class _Settings:
    """The settings of :class:`CheckpointConfig`, each with its type, range and what it accepts."""

    storage_url: Annotated[str, Field(min_length=1, description="a non-empty fsspec URL such as "
                                      "file:///var/ckpt or s3://bucket/ckpt")] = dataclasses.field(
        default_factory=default_storage_url)
    storage_options: Annotated[Mapping[str, Any], Field(description="a mapping")] = dataclasses.field(
        default_factory=dict, repr=False)
    prepared_timeout_s: _seconds(7 * 24 * 3600) = 600.0  # type: ignore[valid-type]
    lease_timeout_s: _seconds(24 * 3600) = 180.0  # type: ignore[valid-type]
    lease_renew_s: _seconds(24 * 3600) = 30.0  # type: ignore[valid-type]
    max_retain: _integer(1, 100_000, "an integer >= 1") = 10  # type: ignore[valid-type]
    incremental: _TRUTH = True
    full_checkpoint_interval: _integer(1, 1000, "an integer in 1..1000") = 10  # type: ignore[valid-type]
    compression: Annotated[Literal["zstd", "lz4"], Field(description=f"one of {COMPRESSIONS}")] = "zstd"
    compression_level: _integer(-7, 22, "an integer in -7..22") = 3  # type: ignore[valid-type]
    fallback_enabled: _TRUTH = True
    secondary_url: Annotated[str | None, Field(min_length=1, description="a non-empty URL or null")] = None
    max_retries: _integer(0, 100, "an integer in 0..100") = 3  # type: ignore[valid-type]
    #: Upper bound for the decompressed size of any single stored frame chunk (bytes).
    max_chunk_bytes: _integer(1024, 1 << 31, "an integer in 1024..2**31") = 64 * 1024 * 1024  # type: ignore[valid-type]
    publish_concurrency: _integer(1, 256, "an integer in 1..256") = 8  # type: ignore[valid-type]

    def __post_init__(self) -> None:
        if self.lease_renew_s >= self.lease_timeout_s / 2:
            raise ConfigError(
                f"lease_renew_s ({self.lease_renew_s!r}) must be below lease_timeout_s / 2 "
                f"({self.lease_timeout_s!r} / 2), so that one late renewal does not make a running stage "
                "look dead")
        if self.compression == "lz4":
            try:
                import lz4.frame  # noqa: F401
            except ImportError as exc:
                raise ConfigError("compression 'lz4' needs the optional package lz4 (pip install lz4)") from exc
        # Resolved once, where the configuration is built: every process it is handed to
        # (spark-submit drivers, other workers) then uses the same directory.
        object.__setattr__(self, "storage_url", absolute_local_url(self.storage_url))
        if self.secondary_url:
            object.__setattr__(self, "secondary_url", absolute_local_url(self.secondary_url, "secondary_url"))


def _config_error(exc: ValidationError) -> ConfigError:
    """The unknown keys of ``exc``, else its first problem: the option, what it accepts and the value given."""
    errors = exc.errors(include_url=False)
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "unexpected_keyword_argument")
    if unknown:
        known = sorted(f.name for f in dataclasses.fields(_Settings))
        return ConfigError(f"unknown checkpoint config keys {unknown}; known keys: {known}")
    error = errors[0]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return cause
    name = str(error["loc"][0]) if error["loc"] else "checkpoint config"
    field_info = _Settings.__pydantic_fields__.get(name)  # type: ignore[attr-defined]  # set by pydantic's dataclass
    accepted = field_info.description if field_info is not None and field_info.description else error["msg"]
    return ConfigError(f"{name} must be {accepted}, got {error['input']!r}")


class CheckpointConfig(_Settings):
    """How and where checkpoints, transaction logs and staged output are kept.

    Built with :meth:`from_mapping` from user input, or directly: either way validated
    (:class:`ConfigError` naming the option, what it accepts and the value given).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().__init__(*args, **kwargs)
        except ValidationError as exc:
            raise _config_error(exc) from None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> CheckpointConfig:
        """Build a config from plain data, rejecting unknown keys and wrong types."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"checkpoint config must be a mapping, got {type(values).__name__}")
        values = dict(values)
        timeout = values.get("lease_timeout_s")
        if "lease_renew_s" not in values and isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            # A lease timeout set alone (the connection form has no renewal field) keeps the
            # renewal well inside it: a third of it, at most the default.
            values["lease_renew_s"] = min(30.0, timeout / 3)
        return cls(**values)

    def to_mapping(self, include_secrets: bool = True) -> dict[str, Any]:
        """Plain-data form (JSON-serialisable); ``include_secrets=False`` drops options."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["storage_options"] = dict(self.storage_options) if include_secrets else {}
        if not include_secrets:
            data["storage_url"] = redact_url(self.storage_url)
            if self.secondary_url:
                data["secondary_url"] = redact_url(self.secondary_url)
        return data

    def __repr__(self) -> str:
        # The generated repr would show URLs with their user:password; options are omitted.
        shown = self.to_mapping(include_secrets=False)
        del shown["storage_options"]
        return f"CheckpointConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def replace(self, **changes: Any) -> CheckpointConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)
