"""Type checks of option values against a config dataclass's annotations (leaf module).

Flags arrive typed (Typer converts them); a YAML file or `LLM(**kw)` may hold anything, and a wrong
type must be a one-line ConfigError naming the option and the type it takes, not a TypeError deep in
validation. Ints pass where a float is expected; a bool is never an int (YAML's `yes` is a bool).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from fdcli_engine.errors import ConfigError

_NAMES = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    dict: "a mapping (a JSON object)",
    list: "a list",
}


def check_option_types(cls: type, values: dict[str, Any], source: str = "options") -> None:
    """ConfigError for the first value whose type the field of `cls` does not take."""
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        want = hints.get(key)
        if want is None or _matches(value, want):
            continue
        name = key.replace("_", "-") if source.startswith("--config") else key
        where = f"{source}: " if source != "options" else ""
        raise ConfigError(f"{where}{name} must be {_describe(want)}, got {value!r}")


def _members(tp: Any) -> tuple:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _matches(value: Any, tp: Any) -> bool:
    for member in _members(tp):
        origin = typing.get_origin(member) or member
        if member is type(None):
            if value is None:
                return True
        elif member is typing.Any:
            return True
        elif origin is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif origin is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif isinstance(origin, type) and isinstance(value, origin):
            return True
    return False


def _describe(tp: Any) -> str:
    names = []
    for member in _members(tp):
        if member is type(None):
            continue
        origin = typing.get_origin(member) or member
        names.append(_NAMES.get(origin, getattr(origin, "__name__", str(origin))))
    return " or ".join(names) or "null"
