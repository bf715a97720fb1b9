"""Store URLs and paths: what a store URL may carry, and which relative paths stay inside a root."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import StorageError

_PASSWORD_ANYWHERE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^@/?#]*:(?!\d+(?:[/?#]|$))[^@]*@")


def refuse_password(url: str, what: str = "store URL") -> None:
    """Raise StorageError if ``url`` carries a password (``scheme://user:password@...``).

    Libraries below us (s3fs, botocore) would take it for part of a bucket or host name and
    put it into their own log lines and error messages, where no redaction can reach it.
    A user name alone (``abfs://container@account``) is fine.
    """
    try:
        password = urlsplit(url).password
    except ValueError:
        raise StorageError(f"{what} {redact_url(url)} is not a valid URL") from None
    # urlsplit ends the authority at the first "/", so it misses a secret holding one (AWS
    # secret keys do: "s3://KEY:abc/def@bucket"), and it misses chained URLs
    # ("simplecache::s3://KEY:SECRET@bucket"). A port ("host:8020/a@b") is not a password.
    if password is None and _PASSWORD_ANYWHERE.search(url):
        password = "?"
    if password is not None:
        raise StorageError(
            f"{what} {redact_url(url)} carries a password: pass credentials as storage options (or in "
            "the Airflow connection), never in a URL, where logs and error messages would show them")


def clean_relpath(path: str) -> str:
    """Normalise a relative store path and refuse anything that could escape the root."""
    if not isinstance(path, str):
        raise StorageError(f"store path must be a string, got {type(path).__name__}")
    if "\x00" in path or "\\" in path:
        raise StorageError(f"store path {path!r} contains a NUL byte or a backslash")
    if path.startswith("/"):
        raise StorageError(f"store path {path!r} must be relative to the store root")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise StorageError(f"store path {path!r} must not contain '..'")
    return "/".join(parts)

