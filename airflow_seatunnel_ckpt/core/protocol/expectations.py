"""Data-quality expectations of a sink (docs/EXPECTATIONS.md): the rules as declared
(:func:`parse_expectations`), and what the commit decision asks of their counts (:func:`refusals`)."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import ExpectationResult, PreparedRecord

ACTIONS = ("warn", "drop", "quarantine", "fail")
#: Actions that keep a failing row out of the sink's output.
REMOVING = ("drop", "quarantine")
RULE_KEYS = ("expr", "on_fail", "max_fraction", "max_rows")
QUARANTINE_SUFFIX = ".quarantine"
#: The column of a quarantined row naming the rules it broke.
FAILED_COLUMN = "_expectations_failed"
#: Reasons of decisions refused by an expectation start with this.
REFUSED = "expectations failed: "

_RULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Expectation:
    """One declared rule of a sink."""

    name: str
    expr: str
    on_fail: str = "warn"
    max_fraction: float | None = None
    max_rows: int | None = None

    def result(self, checked: int, failed: int) -> ExpectationResult:
        """The rule's measured outcome, as recorded in the sink's manifest."""
        return ExpectationResult(self.name, self.expr, self.on_fail, checked, failed,
                                 self.max_fraction, self.max_rows)


def _hint(given: str, choices: Iterable[str]) -> str:
    match = difflib.get_close_matches(given, list(choices), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def parse_expectations(sink: str, raw: Any) -> tuple[Expectation, ...]:
    """Check a sink's ``expectations`` option; ConfigError naming the sink, the rule and the way out."""
    if raw is None:
        return ()
    where = f"sink {sink!r}: expectations"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping of rule name -> {{'expr': ..., 'on_fail': ...}}, "
                          f"got {type(raw).__name__} {raw!r}")
    rules = []
    for name, rule in raw.items():
        if not isinstance(name, str) or not _RULE_NAME.match(name):
            raise ConfigError(f"{where}: rule name {name!r} must be an identifier (letters, digits, '_', "
                              "not starting with a digit, at most 64 characters)")
        if isinstance(rule, str):
            rule = {"expr": rule}
        if not isinstance(rule, Mapping):
            raise ConfigError(f"{where}: rule {name!r} must be a mapping such as "
                              f"{{'expr': 'amount > 0', 'on_fail': 'drop'}}, got {rule!r}")
        unknown = sorted(set(rule) - set(RULE_KEYS))
        if unknown:
            raise ConfigError(f"{where}: rule {name!r}: unknown key(s) {unknown}; a rule takes "
                              f"{list(RULE_KEYS)}" + "".join(_hint(u, RULE_KEYS) for u in unknown))
        expr = rule.get("expr")
        if not isinstance(expr, str) or not expr.strip():
            raise ConfigError(f"{where}: rule {name!r} needs 'expr', a Spark SQL boolean expression such as "
                              f"'order_id IS NOT NULL', got {expr!r}")
        on_fail = rule.get("on_fail", "warn")
        if on_fail not in ACTIONS:
            raise ConfigError(f"{where}: rule {name!r}: on_fail must be one of {list(ACTIONS)}, got "
                              f"{on_fail!r}" + (_hint(on_fail, ACTIONS) if isinstance(on_fail, str) else ""))
        fraction = rule.get("max_fraction")
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, int | float)
                                     or not math.isfinite(fraction) or not 0 <= fraction <= 1):
            raise ConfigError(f"{where}: rule {name!r}: max_fraction must be a number in 0..1 (0.05 = 5% "
                              f"of the checked rows), got {fraction!r}")
        max_rows = rule.get("max_rows")
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 0):
            raise ConfigError(f"{where}: rule {name!r}: max_rows must be a non-negative integer, got {max_rows!r}")
        rules.append(Expectation(name, expr, on_fail,
                                 None if fraction is None else float(fraction), max_rows))
    return tuple(rules)


def _percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def refusal(sink: str, result: ExpectationResult) -> str | None:
    """Why ``result`` refuses the epoch, or None when it lets it commit."""
    head = (f"expectation {result.name!r} of sink {sink!r}: {result.failed} of {result.checked} rows failed "
            f"({_percent(result.fraction)})")
    if result.on_fail == "fail" and result.failed:
        return f"{head}, and its action is 'fail'"
    if result.max_fraction is not None and result.fraction > result.max_fraction:
        return f"{head}, over max_fraction {_percent(result.max_fraction)}"
    if result.max_rows is not None and result.failed > result.max_rows:
        return f"{head}, over max_rows {result.max_rows}"
    return None


def _measured(records: Iterable[PreparedRecord]) -> Iterator[tuple[str, ExpectationResult]]:
    """Each rule's measured outcome in ``records``, with the sink it belongs to."""
    for record in records:
        for manifest in record.sinks:
            for result in manifest.expectations:
                yield manifest.sink, result


def refusals(records: Iterable[PreparedRecord]) -> list[str]:
    """Every reason the expectations recorded in ``records`` refuse the epoch (empty: commit)."""
    return [reason for sink, result in _measured(records) if (reason := refusal(sink, result)) is not None]


def summary(records: Iterable[PreparedRecord]) -> list[dict[str, Any]]:
    """Every rule's counts in ``records``, sink by sink, as plain data (for the CLI, the page, lineage)."""
    out = [{"sink": sink, "rule": result.name, "expr": result.expr, "on_fail": result.on_fail,
            "checked": result.checked, "failed": result.failed, "fraction": result.fraction,
            "max_fraction": result.max_fraction, "max_rows": result.max_rows, "refused": refusal(sink, result)}
           for sink, result in _measured(records)]
    return sorted(out, key=lambda e: (e["sink"], e["rule"]))


def describe(entry: Mapping[str, Any]) -> str:
    """One line of :func:`summary`: ``sink.rule (action): failed of checked rows (x%)``."""
    limits = [f"max_fraction {_percent(entry['max_fraction'])}"] if entry.get("max_fraction") is not None else []
    limits += [f"max_rows {entry['max_rows']}"] if entry.get("max_rows") is not None else []
    text = (f"{entry['sink']}.{entry['rule']} ({entry['on_fail']}"
            + (", " + ", ".join(limits) if limits else "") + f"): {entry['failed']} of {entry['checked']} rows "
            f"failed ({_percent(entry['fraction'])})")
    return text + (" -- REFUSES the epoch" if entry.get("refused") else "")
