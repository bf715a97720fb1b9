"""The option tables of the docs, generated from the connectors' options models.

A table sits between two markers in a page under docs/::

    <!-- options: sink postgres -->
    **Sink `postgres`**

    | option | type | default | what it does |
    ...
    <!-- /options -->

and is what :func:`airflow_seatunnel_ckpt.core.options.option_table` makes of that type's
model (the Spark registries know each type's model). A marker naming a type without a model
is left as it is.

    python scripts/reference.py          # exit 1 and name the pages that are out of date
    python scripts/reference.py --write  # rewrite them
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: The command that brings the pages up to date (named by the check and its test).
FIX = "python scripts/reference.py --write"
BLOCK = re.compile(r"(?P<open><!-- options: (?P<kind>source|sink) (?P<type>[\w.-]+) -->\n)(?P<body>.*?)"
                   r"(?P<close><!-- /options -->)", re.DOTALL)


def models() -> Callable[[str, str], Any]:
    """``model(kind, type)``: the options model of a source or sink type, or None."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from airflow_seatunnel_ckpt.spark.registry import REGISTRIES

    def model(kind: str, type_name: str) -> Any:
        registry = REGISTRIES[kind]
        if type_name not in registry:
            raise SystemExit(f"an options marker names the {kind} type {type_name!r}, which is not registered; "
                             f"known: {registry.names}")
        return registry.options_model(type_name)

    return model


def render(text: str, model: Callable[[str, str], Any]) -> str:
    """``text`` with the table of every marked type that has a model made from that model."""
    from airflow_seatunnel_ckpt.core.options import option_table

    def table(match: re.Match[str]) -> str:
        found = model(match["kind"], match["type"])
        if found is None:
            return match[0]
        title = f"**{match['kind'].capitalize()} `{match['type']}`**\n\n"
        return f"{match['open']}{title}{option_table(found)}\n{match['close']}"

    return BLOCK.sub(table, text)


def stale(write: bool, model: Callable[[str, str], Any] | None = None) -> list[Path]:
    """The pages whose tables differ from their models (rewritten when ``write``)."""
    model = model or models()
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        new = render(text, model)
        if new != text:
            out.append(page)
            if write:
                page.write_text(new)
    return out


def main(argv: list[str]) -> int:
    """Check the pages (exit 1 when one is out of date) or, with ``--write``, rewrite them."""
    write = "--write" in argv
    pages = stale(write)
    names = ", ".join(str(p.relative_to(ROOT)) for p in pages)
    if write:
        print(f"rewrote {names}" if pages else "every option table is up to date")
        return 0
    if pages:
        print(f"option tables out of date with their models in {names}; run `{FIX}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
