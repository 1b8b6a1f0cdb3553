"""The 400 for a request body its pydantic model rejects, worded the same for `fd serve` and
`fd run-batch`: `<param>: <pydantic's message>` with an OpenAI `param` like `messages[0].role`.

Framework-free: it reads pydantic's error list (`ValidationError.errors()`, which FastAPI's
`RequestValidationError.errors()` also returns), so run-batch needs no web framework for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fdcli_engine.entrypoints.openai.errors import APIError, bad_request

# pydantic's union-branch labels in an error location: not field names.
_TYPE_LABELS = {"str", "int", "float", "bool", "dict", "list", "none", "json-or-python"}


def loc_to_param(loc) -> str | None:
    """pydantic's error location → an OpenAI `param` like `messages[0].role` (union-branch labels such
    as `list[int]` or `constrained-str` are not field names and are dropped)."""
    out = ""
    for i, p in enumerate(loc):
        if isinstance(p, int):
            out += f"[{p}]"
        elif i == 0 and p in ("body", "query", "path") and (len(loc) > 1 or p == "body"):
            continue  # FastAPI's location prefix (a body field may itself be named `query`)
        elif "[" in p or "-" in p or p in _TYPE_LABELS:
            continue
        else:
            out += f".{p}" if out else p
    return out or None


def validation_error(errors: Sequence[dict[str, Any]]) -> APIError:
    """The 400 for pydantic's `errors()` list: the first problem, and how many more there are."""
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    if first.get("type") in ("json_invalid", "model_attributes_type") and len(first.get("loc", ())) <= 2:
        return bad_request("the request body must be a JSON object")
    param = loc_to_param(first.get("loc", ()))
    msg = first.get("msg", "invalid value")
    extra = f" ({len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return bad_request(f"{param or 'body'}: {msg}{extra}", param)
