"""The docs' option tables are generated from the connectors' options models and kept up to date."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from airflow_seatunnel_ckpt.core.options import Options, option_table
from airflow_seatunnel_ckpt.spark.registry import REGISTRIES

ROOT = Path(__file__).resolve().parent.parent


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("reference_script", ROOT / "scripts" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("reference_script", module)
    spec.loader.exec_module(module)
    return module


reference = _script()


def test_the_option_tables_in_the_docs_are_those_of_the_models() -> None:
    pages = reference.stale(write=False)
    assert pages == [], f"option tables out of date with their models in {pages}; run `{reference.FIX}`"


def test_every_source_and_sink_type_with_a_model_has_a_table_in_the_reference() -> None:
    page = (ROOT / "docs" / "REFERENCE.md").read_text()
    missing = [f"<!-- options: {kind} {name} -->" for kind, registry in REGISTRIES.items() for name in registry.names
               if registry.is_builtin(name) and registry.options_model(name) is not None
               and f"<!-- options: {kind} {name} -->" not in page]
    assert missing == [], f"add these markers to docs/REFERENCE.md and run `{reference.FIX}`"


class _Queue(Options):
    type: Literal["queue"] = "queue"
    queue: str
    """The queue the rows go to."""
    batch_rows: Annotated[int, Field(ge=1)] | None = None
    """Rows per message (at least 1)."""


def test_a_stale_table_is_rewritten_from_its_model_and_a_type_without_one_is_left_alone() -> None:
    page = ("# Sinks\n\n<!-- options: sink queue -->\n| option | old |\n<!-- /options -->\n\n"
            "<!-- options: sink custom -->\nhand-written\n<!-- /options -->\n")
    models = {("sink", "queue"): _Queue}
    written = reference.render(page, lambda kind, name: models.get((kind, name)))
    assert written == ("# Sinks\n\n<!-- options: sink queue -->\n**Sink `queue`**\n\n" + option_table(_Queue)
                       + "\n<!-- /options -->\n\n"
                       "<!-- options: sink custom -->\nhand-written\n<!-- /options -->\n")
    assert "| `queue` | str | required | The queue the rows go to. |" in written
    assert "| `batch_rows` | int \\| None | `None` | Rows per message (at least 1). |" in written
    assert reference.render(written, lambda kind, name: models.get((kind, name))) == written  # stable
