"""A sink's expectations, Spark side: flag, count and route rows in the job that writes them (docs/EXPECTATIONS.md).

:func:`flag` adds each rule's outcome to the DataFrame: packed into failure masks for :mod:`.staged_writer`
(:meth:`Flagged.writer_options`), else observed (``DataFrame.observe``) with the quarantine a second job over the cache
the write filled.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import ExpectationResult
from airflow_seatunnel_ckpt.core.protocol.expectations import FAILED_COLUMN, REMOVING, Expectation
from airflow_seatunnel_ckpt.spark.session import session_conf

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation

_FLAG = "__expectation_ok_"
#: The staged writer's failure masks: column ``<this><k>`` holds bit ``i % RULES_PER_MASK``
#: set when the row failed rule ``i`` (``i // RULES_PER_MASK == k``).
MASK = "__expectations_failed_"
#: Rules per mask column (the bits of a signed 64-bit integer but its sign).
RULES_PER_MASK = 63
#: The session setting that makes an invalid cast, a division by zero, ... raise (see :func:`flag`).
ANSI = "spark.sql.ansi.enabled"


def mask_of(index: int) -> tuple[str, int]:
    """The mask column and bit holding rule ``index``'s failure in the staged writer's rows."""
    return f"{MASK}{index // RULES_PER_MASK}", 1 << (index % RULES_PER_MASK)


def check_expressions(sink: str, rules: tuple[Expectation, ...], df: DataFrame) -> None:
    """Refuse a rule whose expression does not parse, names an unknown column or is not boolean (analysis only, before
    anything is written)."""
    from pyspark.errors import AnalysisException, ParseException
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, NullType

    try:  # one analysis for every rule; one per rule only to name the one that is wrong
        fields = df.select(*[F.expr(r.expr).alias(f"ok{i}") for i, r in enumerate(rules)]).schema.fields
    except (AnalysisException, ParseException):
        fields = []
    for i, rule in enumerate(rules):
        try:
            field = fields[i] if fields else df.select(F.expr(rule.expr).alias("ok")).schema.fields[0]
        except (AnalysisException, ParseException) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"sink {sink!r}: expectation {rule.name!r}: expression {rule.expr!r} cannot be evaluated on the "
                f"rows written ({first}); columns: {df.columns}. Fix the expression; nothing was written") from exc
        if not isinstance(field.dataType, BooleanType | NullType):
            raise ConfigError(f"sink {sink!r}: expectation {rule.name!r}: expression {rule.expr!r} is "
                              f"{field.dataType.simpleString()}, not boolean; write a condition such as 'amount > 0'")


@dataclass
class Flagged:
    """A DataFrame with one flag per rule; see the module docstring."""

    rules: tuple[Expectation, ...]
    flagged: DataFrame  #: the rows with their flags
    columns: list[str]
    #: The same, observed (None: the staged writer counts, :meth:`writer_options`).
    observed: DataFrame | None = None
    observation: Observation | None = None

    def _ok(self, i: int) -> Column:
        from pyspark.sql import functions as F

        return F.col(f"{_FLAG}{i}")

    @property
    def kept(self) -> DataFrame:
        """The rows the sink stages: those failing no ``drop`` or ``quarantine`` rule."""
        assert self.observed is not None, "flagged for the staged writer: see writer_options()"
        removed = _failing(self.rules, REMOVING)
        out = self.observed if removed is None else self.observed.where(~removed)
        return out.drop(*[f"{_FLAG}{i}" for i in range(len(self.rules))])

    @property
    def quarantined(self) -> DataFrame | None:
        """The rows failing a ``quarantine`` rule, with :data:`FAILED_COLUMN` (None: no such rule)."""
        from pyspark.sql import functions as F

        bad = _failing(self.rules, ("quarantine",))
        if bad is None:
            return None
        broke = F.array_compact(F.array(*[F.when(~self._ok(i), F.lit(r.name)) for i, r in enumerate(self.rules)]))
        return self.flagged.where(bad).select(*[F.col(f"`{c}`") for c in self.columns], broke.alias(FAILED_COLUMN))

    def writer_options(self) -> dict[str, str]:
        """The options with which :mod:`.staged_writer`, writing :attr:`flagged`, applies the rules itself in the one
        writing pass; only the masks travel (it names a quarantined row's broken rules itself)."""
        import json

        rules = [[*mask_of(i), r.name, r.on_fail] for i, r in enumerate(self.rules)]
        return {"expectation_rules": json.dumps(rules), "quarantine_columns": json.dumps(self.columns),
                "failed_column": FAILED_COLUMN}

    def release(self) -> None:
        """Drop the cached rows (after the quarantine was written)."""
        if self.flagged.storageLevel.useMemory or self.flagged.storageLevel.useDisk:
            self.flagged.unpersist()

    def results(self, metrics: Mapping[str, Any] | None = None) -> tuple[tuple[ExpectationResult, ...], int]:
        """Each rule's counts and the number of quarantined rows (after the write ran), from ``metrics`` (the staged
        writer's counts) or else the observation."""
        if metrics is None:
            assert self.observation is not None
            metrics = self.observation.get
        checked = int(metrics.get("checked") or 0)
        results = tuple(r.result(checked, int(metrics.get(f"failed_{i}") or 0)) for i, r in enumerate(self.rules))
        return results, int(metrics.get("quarantined") or 0)


def _failing(rules: tuple[Expectation, ...], actions: tuple[str, ...]) -> Column | None:
    """Whether a flagged row fails any of the ``rules`` whose action is in ``actions`` (None: there is none)."""
    from functools import reduce

    from pyspark.sql import functions as F

    failing = [~F.col(f"{_FLAG}{i}") for i, r in enumerate(rules) if r.on_fail in actions]
    return reduce(lambda a, b: a | b, failing) if failing else None


def flag(sink: str, rules: tuple[Expectation, ...], df: DataFrame, *, by_writer: bool = False) -> Flagged:
    """Check the rules' expressions on ``df``, then flag every rule (one that cannot be evaluated on a row is NULL
    there: the row fails it).

    :param by_writer: the staged writer applies the rules; otherwise every rule is observed, and a ``quarantine`` rule's
        flagged rows are cached for the second job.
    """
    if FAILED_COLUMN in df.columns:
        raise ConfigError(f"sink {sink!r}: column {FAILED_COLUMN!r} is reserved for the quarantine's rule names; "
                          "rename it before writing")
    # Rules are built without ANSI errors, so an invalid cast or a division by zero is NULL and the row fails the
    # rule instead of failing every attempt of the task. An expression takes the setting when it is built, so it is
    # off only while the rules are: the stage's own expressions keep the session's mode. (``TryEval`` around each
    # rule would not do: whole-stage code generation hoists a shared subexpression out of it.)
    with session_conf(df.sparkSession, ANSI, "false"):
        if by_writer:
            return Flagged(rules, _with_masks(sink, rules, df), list(df.columns))
        return _observed(sink, rules, df)


def _observed(sink: str, rules: tuple[Expectation, ...], df: DataFrame) -> Flagged:
    """``df`` with one flag per rule, observed (see :func:`flag`)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    check_expressions(sink, rules, df)
    flags = [F.coalesce(F.expr(r.expr).cast("boolean"), F.lit(False)).alias(f"{_FLAG}{i}")
             for i, r in enumerate(rules)]
    flagged = df.select("*", *flags)
    if any(r.on_fail == "quarantine" for r in rules):
        # The quarantine is a second job over the same rows: it reads them from this cache,
        # filled by the sink's write, instead of running the stage's transformations again
        # (a keyed state's update must see each row once, and a source is read once).
        from pyspark import StorageLevel

        flagged = flagged.persist(StorageLevel.MEMORY_AND_DISK)
    observation = Observation(f"expect_{sink}_{uuid.uuid4().hex[:8]}".replace(".", "_"))
    ok = [F.col(f"{_FLAG}{i}") for i in range(len(rules))]
    any_quarantined = _failing(rules, ("quarantine",))
    metrics = [F.count(F.lit(1)).alias("checked"),
               *[F.sum(F.when(c, 0).otherwise(1)).alias(f"failed_{i}") for i, c in enumerate(ok)],
               F.sum(F.when(any_quarantined if any_quarantined is not None else F.lit(False), 1).otherwise(0))
               .alias("quarantined")]
    observed = flagged.observe(observation, *metrics)
    return Flagged(rules, flagged, list(df.columns), observed, observation)


def _with_masks(sink: str, rules: tuple[Expectation, ...], df: DataFrame) -> DataFrame:
    """``df`` with the staged writer's failure masks (:func:`mask_of`), checked and built in one analysis.

    Each rule is parsed alone (``selectExpr``); the masks' ``CASE WHEN (<rule>)`` accepts only a boolean rule. What the
    analyser refuses goes through :func:`check_expressions` to name the rule; a rule typed NULL gets the masks with each
    rule cast to boolean.
    """
    from pyspark.errors import AnalysisException, ParseException

    try:
        df.selectExpr(*(rule.expr for rule in rules)).schema  # noqa: B018 -- analysed for its errors
        masked = df.selectExpr("*", *_mask_sql(rules, cast=False))
        masked.schema  # noqa: B018
        return masked
    except (AnalysisException, ParseException):
        check_expressions(sink, rules, df)  # raises, naming the rule, unless only NULL-typed rules were refused
        return df.selectExpr("*", *_mask_sql(rules, cast=True))


def _mask_sql(rules: tuple[Expectation, ...], *, cast: bool) -> list[str]:
    """The failure masks (:func:`mask_of`) as SQL: a rule's bit is set when its expression is false or NULL, in the
    smallest integer type holding the mask's bits."""
    masks = []
    for start in range(0, len(rules), RULES_PER_MASK):
        chunk = rules[start:start + RULES_PER_MASK]
        # Each rule on lines of its own: a trailing "-- comment" ends with its line.
        conditions = [f"CAST((\n{r.expr}\n) AS BOOLEAN)" if cast else f"(\n{r.expr}\n)" for r in chunk]
        bits = " | ".join(f"CASE WHEN {c} THEN 0 ELSE {mask_of(start + j)[1]} END" for j, c in enumerate(conditions))
        kind = next(t for t, width in (("TINYINT", 7), ("SMALLINT", 15), ("INT", 31), ("BIGINT", 63))
                    if len(chunk) <= width)
        masks.append(f"CAST({bits} AS {kind}) AS `{mask_of(start)[0]}`")
    return masks
