"""Figures for docs/RELIABILITY.md: tests append JSON lines when ``RELIABILITY_REPORT`` is set.

``python -m tests.integration.reliability.report <file.jsonl>`` prints the summary tables.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict
from typing import Any


def record(kind: str, **data: Any) -> None:
    """Append one result line (no-op unless ``RELIABILITY_REPORT`` names a file)."""
    path = os.environ.get("RELIABILITY_REPORT")
    if not path:
        return
    with open(path, "a") as fh:
        fh.write(json.dumps({"kind": kind, **data}, default=str, sort_keys=True) + "\n")


def summarise(lines: list[dict[str, Any]]) -> str:
    out = []
    points = [r for r in lines if r["kind"] == "crash-point"]
    if points:
        out.append("| backend | scenario | crash points | continuations run | failures |")
        out.append("|---|---|---|---|---|")
        grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in points:
            grouped[(r["backend"], r["scenario"])].append(r)
        for (backend, scenario), rows in sorted(grouped.items()):
            n = len({r["n"] for r in rows})
            failed = sum(1 for r in rows if r["problems"])
            out.append(f"| {backend} | {scenario} | {n} | {len(rows)} | {failed} |")
        out.append("")
        names: Counter[tuple[str, str, str]] = Counter()
        for r in points:
            names[(r["backend"], r["scenario"], r["point"])] += 1
        out.append("| backend | scenario | named crash point | runs |")
        out.append("|---|---|---|---|")
        for (backend, scenario, point), count in sorted(names.items()):
            out.append(f"| {backend} | {scenario} | {point} | {count} |")
        out.append("")
    schedules = [r for r in lines if r["kind"] == "schedule"]
    if schedules:
        by_backend: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in schedules:
            by_backend[r["backend"]].append(r)
        columns = [
            "epochs",
            "kills",
            "retries",
            "recoveries",
            "zombies",
            "records",
            "lost",
            "duplicated",
            "unreferenced_parts",
        ]
        out.append("| backend | schedules | " + " | ".join(columns) + " | failures |")
        out.append("|---" * (len(columns) + 3) + "|")
        for backend, rows in sorted(by_backend.items()):
            sums = [str(sum(r.get(c, 0) for r in rows)) for c in columns]
            failed = sum(1 for r in rows if r["problems"])
            out.append(f"| {backend} | {len(rows)} | " + " | ".join(sums) + f" | {failed} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print(summarise([json.loads(line) for line in fh if line.strip()]))
