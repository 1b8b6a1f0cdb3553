"""Parameter values written as text (XML-style formats: qwen3_coder, glm45) converted to the JSON types
the tool's schema declares, by vLLM's rules (its qwen3coder parser's `_convert_param_value`):

- a parameter the schema does not list (or no schema at all) stays a string;
- the declared type is `type` (a string, or a list: its first non-null entry) or the first non-null
  `anyOf` branch's; "null"/"none" (any case) is null when the schema admits null, and for every
  non-string type;
- string types (string, str, text, varchar, char, enum) keep the text as written;
- int*/uint*/long*/short*/unsigned*: an integer; num*/float*: a number (an integer when whole);
  boolean/bool/binary: true only for "true" (any case); a value that does not read as its type
  stays a string;
- anything else (object, array, unknown names): JSON, else a Python literal (`ast.literal_eval`,
  literals only: nothing is evaluated); a JSON string holding a Python literal is read once more
  for container types (a model trained on `json.dumps(str(dict))`). A value none of these read
  stays a string.
A converted value that JSON cannot carry (NaN, a set, bytes) stays a string.
"""

from __future__ import annotations

import ast
import json
import math

_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_NULLS = ("null", "none")


def tool_properties(tools, name: str) -> dict:
    """The `properties` of the parameters schema of the tool called `name` ({} when none)."""
    for tool in tools or ():
        function = getattr(tool, "function", None)
        if function is not None and function.name == name:
            props = (function.parameters or {}).get("properties")
            return props if isinstance(props, dict) else {}
    return {}


def _declared(schema) -> tuple[str, bool]:
    """(the declared type, lower-cased; whether null is admitted)."""
    if not isinstance(schema, dict):
        return "string", False
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        kinds = [str(k).strip().lower() for k in kinds]
        non_null = [k for k in kinds if k != "null"]
        return (non_null[0] if non_null else "null"), "null" in kinds
    if isinstance(schema.get("anyOf"), list):
        kinds = [
            str(o["type"]).strip().lower() for o in schema["anyOf"] if isinstance(o, dict) and "type" in o
        ]
        non_null = [k for k in kinds if k != "null"]
        return (non_null[0] if non_null else "string"), "null" in kinds
    return "string", False


def convert_param(value: str, name: str, properties: dict):
    """`value` (the parameter's text) as the type `properties[name]` declares."""
    if name not in properties:
        return value
    kind, nullable = _declared(properties[name])
    if nullable and value.lower() in _NULLS:
        return None
    if kind in _STRING_TYPES:
        return value
    if value.lower() in _NULLS:
        return None
    if kind.startswith(_INT_PREFIXES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        if not math.isfinite(number):
            return value
        return int(number) if number == int(number) else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    container = kind in ("object", "array", "arr") or kind.startswith(("dict", "list"))
    parsed = _literal(value, container)
    return value if parsed is _UNREAD else parsed


_UNREAD = object()


def _literal(value: str, container: bool):
    """JSON (container types), else a Python literal; a string read again for container types."""
    readers = (json.loads, ast.literal_eval) if container else (ast.literal_eval,)
    for read in readers:
        try:
            parsed = read(value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            continue
        if container and isinstance(parsed, str):
            try:
                parsed = ast.literal_eval(parsed)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                pass
        try:
            json.dumps(parsed, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            return _UNREAD
        return parsed
    return _UNREAD


def json_pair(name: str, value) -> str:
    """`"name": value` as json.dumps writes it inside an object (non-ASCII kept, as vLLM does)."""
    return f"{json.dumps(name, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
