"""Connector options, typed: one pydantic model per source or sink type, checked once.

A stage's ``{"type": ..., **options}`` entries become their model (:func:`parse`) when the
DAG is parsed, and travel typed to the commit; :func:`option_table` renders a model as the
table docs/REFERENCE.md holds. Nothing here imports PySpark or a table library.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from airflow_seatunnel_ckpt.core.errors import ConfigError

OptionsT = TypeVar("OptionsT", bound="Options")
#: A password in a libpq connection string, keyword form or URL form: options are stored in the
#: checkpoint store, so a connection string there must not hold one.
PASSWORD_IN_CONNINFO = re.compile(r"(^|\s)password\s*=|://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)


class Options(BaseModel):
    """One connector's options: unknown keys refused, immutable once checked.

    Subclasses declare ``type: Literal["<name>"] = "<name>"`` and their options as documented fields.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    type: str

    def to_dict(self) -> dict[str, Any]:
        """The options as plain JSON data (what a manifest or a stage spec stores)."""
        return self.model_dump(mode="json")


def type_name(model: type[Options]) -> str:
    """The ``type`` literal of ``model`` (its one allowed value)."""
    (name,) = typing.get_args(model.model_fields["type"].annotation)
    return str(name)


def keyed(*models: type[Options]) -> dict[str, type[Options]]:
    """``models`` keyed on their ``type`` literal (a kind's union); a name twice is a bug."""
    out: dict[str, type[Options]] = {}
    for model in models:
        name = type_name(model)
        assert name not in out, f"two option models for type {name!r}"
        out[name] = model
    return out


def parse(kind: str, name: str, options: Mapping[str, Any], models: Mapping[str, type[Options]],
          default_type: str = "file") -> Options:
    """The model of the entry ``name`` of ``kind`` ("source", "sink"); ConfigError naming each problem."""
    data = {"type": default_type, **options}
    type_ = data["type"]
    model = models.get(type_) if isinstance(type_, str) else None
    if model is None:
        raise ConfigError(f"{kind} {name!r}: unknown type {type_!r}; known types: {sorted(models)}")
    return checked(model, data, f"{kind} {name!r} (type {type_!r})")


def checked(model: type[OptionsT], data: Mapping[str, Any], where: str) -> OptionsT:
    """``model`` validated from ``data``; ConfigError naming ``where`` and every problem."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(f"{where}: {'; '.join(problem(model, e) for e in exc.errors(include_url=False))}") from None


def problem(model: type[Options], error: Any) -> str:
    """One validation error of ``model`` in words, with the nearest option for an unknown one."""
    field = ".".join(str(p) for p in error["loc"])
    if error["type"] == "extra_forbidden":
        takes = sorted(model.model_fields)
        near = difflib.get_close_matches(str(error["loc"][0]), takes, n=1)
        return (f"unknown option {field!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                + f"; it takes {takes}")
    if error["type"] == "missing":
        return f"missing required option {field!r}"
    if not field:  # a rule over several options (a model validator): its message says which
        return str(error["msg"]).removeprefix("Value error, ")
    return f"option {field!r}: {error['msg'][0].lower()}{error['msg'][1:]} (found {error['input']!r:.80})"


def option_table(model: type[Options]) -> str:
    """``model``'s options as a Markdown table: option, type, default, what it does."""
    rows = ["| option | type | default | what it does |", "|---|---|---|---|"]
    for field_name, field in model.model_fields.items():
        if field_name == "type":
            continue
        default = "required" if field.is_required() else f"`{field.get_default(call_default_factory=True)!r}`"
        about = " ".join((field.description or "").split())
        rows.append(f"| `{field_name}` | {_type_words(field.annotation)} | {default} | {about} |")
    return "\n".join(rows)


def _type_words(annotation: Any) -> str:
    """A field's type as a reader of the reference says it (``str``, ``list[str]``, ``"a" | "b"``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # the constraints are said in the field's docstring
        return _type_words(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{v!r}`".replace("'", '"') for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_words(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_words(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))
