"""How a file source lists its input: below ``path``, or below ``prefixes`` only (globs expanded; ordered glob prefixes
from their floor), with each file's identity; and the checks of ``prefixes`` and ``max_file_age``."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from typing import Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.sources import files as file_index

#: ``max_file_age`` as text: a number and a unit (Spark's ``maxFileAge`` spelling, "7d").
AGE_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|m|min|mins|h|hour|hours|d|day|days|w|week|weeks)\s*$")
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: Characters that make a ``prefixes`` entry a glob pattern.
GLOB_CHARS = ("*", "?", "[")


def is_glob(prefix: str) -> bool:
    """Whether a ``prefixes`` entry is a glob pattern."""
    return any(c in prefix for c in GLOB_CHARS)


def prefix_matcher(prefix: str) -> tuple[str, Callable[[str], bool]]:
    """The literal start of a glob ``prefix`` and a test of whether a file name (relative to ``path``) lies below a
    directory the prefix matches: what finds a prefix's floor in the consumed-file index."""
    from fnmatch import fnmatchcase

    components = prefix.split("/")
    head = prefix[: min((prefix.index(c) for c in GLOB_CHARS if c in prefix), default=len(prefix))]

    def matches(name: str) -> bool:
        parts = name.split("/")
        return len(parts) >= len(components) and all(
            fnmatchcase(part, pattern) for part, pattern in zip(parts, components, strict=False))

    return head, matches


def find_below(fs: Any, root: str, prefixes: list[str] | None, ordered: bool,
               floors: Mapping[str, str | None] | None) -> dict[str, Any]:
    """``fs.find`` below the root, or below each prefix only (a missing prefix is empty: the partition of a run may not
    exist yet); ``ordered`` glob prefixes skip the partitions before their floor's, ``floors[prefix]`` (see
    :func:`_expand_ordered`)."""
    if prefixes is None:
        return dict(fs.find(root, detail=True))
    base = root.rstrip("/")
    found: dict[str, Any] = {}
    for prefix in prefixes:
        target = f"{base}/{prefix}".rstrip("/")
        if is_glob(prefix):
            floor = (floors or {}).get(prefix)
            matches = _expand_ordered(fs, base, prefix, floor) if ordered else fs.glob(target, detail=True)
            for path, info in matches.items():
                if info.get("type") == "directory":
                    found.update(fs.find(path, detail=True))
                else:
                    found[path] = info
        elif fs.exists(target):
            found.update(fs.find(target, detail=True))
    return found


def file_identity(info: Mapping[str, Any]) -> dict[str, Any]:
    """A listed file's identity from its fsspec info: size and the store's ETag (object stores) or modification time; a
    file re-uploaded under the same name changes it."""
    ident: dict[str, Any] = {"size": int(info.get("size") or 0)}
    etag = info.get("ETag") or info.get("etag")
    if etag:
        ident["etag"] = str(etag).strip('"')
        return ident
    modified = next((info[k] for k in ("mtime", "LastModified", "last_modified", "updated",
                                       "created") if info.get(k) is not None), None)
    if modified is not None and hasattr(modified, "timestamp"):
        modified = modified.timestamp()
    if isinstance(modified, (int, float)):
        ident["mtime"] = float(modified)
    elif modified is not None:
        ident["mtime"] = str(modified)  # e.g. an RFC 3339 string: compared as given
    return ident


def _expand_ordered(fs: Any, base: str, prefix: str, floor: str | None) -> dict[str, Any]:
    """The entries a glob ``prefix`` matches below ``base``, one directory level at a time, skipping at each glob level
    the names that sort before ``floor``'s at that depth."""
    from fnmatch import fnmatchcase

    current: dict[str, Any] = {base: {"type": "directory"}}
    components = prefix.split("/")
    for depth, component in enumerate(components):
        bound = "/".join(floor.split("/")[: depth + 1]) if floor else None
        last = depth == len(components) - 1
        found: dict[str, Any] = {}
        for parent in current:
            if not is_glob(component):
                target = f"{parent}/{component}"
                if fs.exists(target):
                    found[target] = fs.info(target)
                continue
            try:
                entries = fs.ls(parent, detail=True)
            except FileNotFoundError:
                continue
            for info in entries:
                path = str(info["name"]).rstrip("/")
                rel = path[len(base) + 1:]
                if not fnmatchcase(posixpath.basename(path), component) or (bound and rel < bound):
                    continue
                if info.get("type") == "directory" or last:
                    found[path] = info
        current = found
    return current


def listed_identity(info: Mapping[str, Any]) -> dict[str, Any]:
    """A listed file's identity for the file source: :func:`file_identity`, plus the modification time next to an ETag
    (the watermark needs it; the ETag still decides whether the file changed)."""
    ident = file_identity(info)
    if "mtime" not in ident:
        modified = next((info[k] for k in ("mtime", "LastModified", "last_modified", "updated",
                                           "created") if info.get(k) is not None), None)
        seconds = file_index.mtime_seconds(modified)
        if seconds is not None:
            ident["mtime"] = seconds
    return ident


def parse_prefixes(name: str, prefixes: Any) -> list[str] | None:
    """The ``prefixes`` option checked: relative subdirectories of ``path`` (or globs)."""
    if prefixes is None:
        return None
    if isinstance(prefixes, str) or not isinstance(prefixes, (list, tuple)) or not prefixes:
        raise ConfigError(
            f"file source {name!r}: prefixes must be a non-empty list of subdirectories of 'path', "
            f'e.g. ["dt={{{{ ds }}}}/"] or ["dt=*/hour=*/"], got {prefixes!r}')
    out = []
    for prefix in prefixes:
        parts = prefix.strip("/").split("/") if isinstance(prefix, str) else []
        if (not isinstance(prefix, str) or not prefix.strip("/") or prefix.startswith("/") or "://" in prefix
                or any(p in ("", ".", "..") for p in parts)):
            raise ConfigError(
                f"file source {name!r}: prefixes entry {prefix!r} must be a subdirectory relative to "
                "'path' (no leading '/', no scheme, no '.' or '..'); put the fixed part of the location "
                "in 'path' and the part that changes per run (a date, a glob) in 'prefixes'")
        out.append(prefix.strip("/"))
    return out


def parse_age(name: str, value: Any) -> float | None:
    """The ``max_file_age`` option in seconds: a positive number, or text like ``"7d"``."""
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = AGE_TEXT.match(value.lower())
        if match:
            seconds = float(match.group(1)) * AGE_UNITS[match.group(2)[0]]
    if seconds is None or not seconds > 0 or seconds == float("inf"):
        raise ConfigError(
            f"file source {name!r}: max_file_age must be a positive number of seconds or a duration "
            f'such as "7d", "12h", "30m", got {value!r}; leave it out to keep every consumed file')
    return seconds
