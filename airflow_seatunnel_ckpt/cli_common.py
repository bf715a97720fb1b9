"""What every command of ``seatunnel-ckpt`` shares: its arguments, the store and pipeline it
opens, its output (a table, or JSON with ``--json``) and the errors that exit 2.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, layout
from airflow_seatunnel_ckpt.core.config import default_storage_url
from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.store import StoredPipeline


class StoreNotFoundError(CheckpointError, LookupError):
    """The store URL names nothing that exists (a typo, or the wrong connection)."""


class PipelineNotFoundError(CheckpointError, LookupError):
    """The store has no pipeline of that name (no transaction log and no descriptor)."""


def positive_int(text: str) -> int:
    """An argument that must be a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--storage-options`` (else ``$SEATUNNEL_CKPT_STORAGE_OPTIONS``) as a mapping."""
    raw = args.storage_options or os.environ.get("SEATUNNEL_CKPT_STORAGE_OPTIONS")
    if not raw:
        return {}
    try:
        options = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"--storage-options is not valid JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise CheckpointError("--storage-options must be a JSON object")
    return options


def open_store(args: argparse.Namespace) -> CheckpointStore:
    """The store ``--store`` names; StoreNotFoundError if nothing is there (a mistyped URL, not an
    empty store: every command reads or acts on what a store holds)."""
    settings: dict[str, Any] = {"storage_url": args.store or default_storage_url(),
                                "storage_options": storage_options(args)}
    if getattr(args, "timeout", None) is not None:
        settings["prepared_timeout_s"] = args.timeout
    store = CheckpointStore(CheckpointConfig.from_mapping(settings))
    if not store.storage.exists(""):
        raise StoreNotFoundError(
            f"no store at {store.storage.describe()}: that directory (or bucket prefix) does not exist. "
            "Check --store (default: $SEATUNNEL_CKPT_STORE, else $AIRFLOW_HOME/seatunnel-ckpt); it is the "
            "storage_url of the pipeline's checkpoint store connection")
    return store


def open_pipeline(args: argparse.Namespace, name: str | None = None, store: CheckpointStore | None = None,
                  **kwargs: Any) -> StoredPipeline:
    """The pipeline the command names; PipelineNotFoundError if the store does not hold it."""
    store = store or open_store(args)
    p = store.pipeline(args.pipeline if name is None else name, **kwargs)
    if not (p.storage.exists(layout.TXLOG) or p.storage.exists(layout.DESCRIPTOR)):
        known = store.list_pipelines()
        raise PipelineNotFoundError(
            f"pipeline {p.name!r} not found in {store.storage.describe()}: it has no transaction log "
            f"({layout.TXLOG}) and no descriptor ({layout.DESCRIPTOR}). Pipelines in this store: "
            f"{', '.join(known) if known else 'none'}; check the name and --store")
    return p


#: One argument of a command: its flags and the keyword arguments of ``add_argument``.
Arg = tuple[tuple[str, ...], dict[str, Any]]


def arg(*flags: str, **kwargs: Any) -> Arg:
    """An argument of a :class:`Command`, as ``add_argument(*flags, **kwargs)`` takes it."""
    return flags, kwargs


PIPELINE = arg("pipeline")
EPOCH = arg("epoch", type=int)
REASON = arg("--reason", required=True, help="why (kept in the transaction log)")
BY = arg("--by", help="who (default: cli and the user name)")


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``data`` as JSON with ``--json``, else ``text``."""
    print(json.dumps(data, indent=2, sort_keys=True, default=str) if args.json else text)


def by_whom(args: argparse.Namespace) -> str:
    """Who acts, for the transaction log: ``--by``, else ``cli (<user name>)``."""
    if args.by:
        return str(args.by)
    try:
        return f"cli ({getpass.getuser()})"
    except Exception:  # no user name in this environment
        return "cli"


@dataclass(frozen=True)
class Command:
    """One subcommand: its handler (whose docstring opens its ``--help``), the one-line ``help`` the
    command list shows, and its arguments."""

    name: str
    fn: Callable[[argparse.Namespace], int] | None
    help: str | None
    args: tuple[Arg, ...] = ()
    aliases: tuple[str, ...] = ()
    subcommands: tuple[Command, ...] = ()
