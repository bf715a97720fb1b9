"""Spark schema DDL (``"order_id long, amount double"``) checked without Spark, when the DAG is parsed.

:func:`check_schema_ddl` reads the grammar of ``StructType.fromDDL`` and returns the column names; it refuses only what
Spark would refuse too (an unknown type name, a malformed list).
"""

from __future__ import annotations

import difflib
import re

from airflow_seatunnel_ckpt.core.errors import ConfigError

#: Spark's primitive type names (and their SQL synonyms), lower case.
PRIMITIVE_TYPES = (
    "boolean", "byte", "tinyint", "short", "smallint", "int", "integer", "long", "bigint", "float", "real",
    "double", "date", "timestamp", "timestamp_ltz", "timestamp_ntz", "string", "binary", "void", "variant",
    "decimal", "dec", "numeric", "char", "character", "varchar", "interval", "time",
)
#: Types with parameters in ``<...>``.
NESTED_TYPES = ("array", "map", "struct")

_TOKEN = re.compile(r"""\s*(?:(?P<quoted>`(?:[^`]|``)*`)|(?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
                        |(?P<word>[A-Za-z_0-9]+)|(?P<punct>[<>(),:]))""", re.VERBOSE)
_INTERVAL_UNITS = ("year", "month", "day", "hour", "minute", "second")


class _Tokens:
    def __init__(self, text: str) -> None:
        self.items: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                raise ValueError(f"unexpected character {text[pos:].lstrip()[:1]!r} at position {pos}")
            kind = match.lastgroup or "punct"
            self.items.append((kind, match.group(kind), match.start(kind)))
            pos = match.end()
        self.i = 0

    def peek(self) -> str | None:
        return self.items[self.i][1] if self.i < len(self.items) else None

    def next(self, what: str) -> tuple[str, str]:
        if self.i >= len(self.items):
            raise ValueError(f"the schema ends where {what} was expected")
        kind, value, _ = self.items[self.i]
        self.i += 1
        return kind, value

    def expect(self, punct: str) -> None:
        kind, value = self.next(f"{punct!r}")
        if value != punct:
            raise ValueError(f"expected {punct!r}, found {value!r}")

    def accept(self, value: str) -> bool:
        if self.peek() is not None and self.peek().lower() == value:  # type: ignore[union-attr]
            self.i += 1
            return True
        return False


def _type(tokens: _Tokens) -> None:
    kind, word = tokens.next("a type")
    name = word.lower()
    if kind != "word" or name not in PRIMITIVE_TYPES + NESTED_TYPES:
        close = difflib.get_close_matches(name, PRIMITIVE_TYPES + NESTED_TYPES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown type {word!r}{hint}")
    if name == "array":
        tokens.expect("<")
        _type(tokens)
        tokens.expect(">")
    elif name == "map":
        tokens.expect("<")
        _type(tokens)
        tokens.expect(",")
        _type(tokens)
        tokens.expect(">")
    elif name == "struct":
        tokens.expect("<")
        if not tokens.accept(">"):
            _columns(tokens, closing=">")
            tokens.expect(">")
    elif name == "interval":
        while tokens.peek() is not None and tokens.peek().lower() in (*_INTERVAL_UNITS, "to"):  # type: ignore[union-attr]
            tokens.next("an interval unit")
    elif tokens.accept("("):  # decimal(10, 2), varchar(20), time(6)
        while not tokens.accept(")"):
            tokens.next("')'")
    if name in ("string", "char", "character", "varchar") and tokens.accept("collate"):
        tokens.next("a collation name")


def _columns(tokens: _Tokens, closing: str | None) -> list[str]:
    names: list[str] = []
    while True:
        kind, word = tokens.next("a column name")
        if kind not in ("word", "quoted"):
            raise ValueError(f"expected a column name, found {word!r}")
        names.append(word[1:-1].replace("``", "`") if kind == "quoted" else word)
        tokens.accept(":")
        _type(tokens)
        # Column options: NOT NULL, COMMENT '...', DEFAULT <expression> (skipped up to the next column).
        depth = 0
        while tokens.peek() is not None and not (depth == 0 and tokens.peek() in (",", closing)):
            _, value = tokens.next("a column option")
            if value in ("(", "<"):
                depth += 1
            elif value in (")", ">"):
                depth -= 1
        if not tokens.accept(","):
            return names


def check_schema_ddl(ddl: str) -> list[str]:
    """The column names of a Spark schema DDL string; ValueError saying what does not parse."""
    tokens = _Tokens(ddl)
    if tokens.peek() is None:
        return []  # as Spark reads it: no columns (a source then has no declared schema)
    first = tokens.peek()
    if first is not None and first.lower() == "struct" and len(tokens.items) > 1 and tokens.items[1][1] == "<":
        tokens.next("struct")
        tokens.expect("<")
        names = _columns(tokens, closing=">")
        tokens.expect(">")
    else:
        names = _columns(tokens, closing=None)
    if tokens.peek() is not None:
        raise ValueError(f"unexpected {tokens.peek()!r} after the last column")
    return names


def checked_schema(ddl: object, where: str) -> list[str]:
    """:func:`check_schema_ddl` for a source's ``schema`` option; ConfigError naming ``where``."""
    if not isinstance(ddl, str):
        raise ConfigError(f"{where}: schema must be a Spark DDL string such as 'order_id long, amount double', "
                          f"got {type(ddl).__name__}")
    try:
        return check_schema_ddl(ddl)
    except ValueError as exc:
        raise ConfigError(f"{where}: schema {ddl!r} does not parse as Spark DDL: {exc}. Give the columns as "
                          "'name TYPE, ...' (e.g. 'order_id long, amount double')") from None
