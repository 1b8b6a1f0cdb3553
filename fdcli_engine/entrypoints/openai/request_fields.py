"""Unknown request fields: found in a validated request model, logged once, or refused when strict.

The request models keep keys they do not declare as pydantic extras (protocol.py, extra="allow"), at
every level (messages, tools, stream_options, ...). `unknown_fields` lists them as OpenAI-style
params (`frobnicate`, `messages[1].foo`); the HTTP app names them in the `fd-ignored-fields` response
header and logs each field name once per server (`IgnoredFieldsLog`), or, with
--strict-request-fields, answers OpenAI's own 400 for the first one (`unrecognized`).

Content parts are not inspected: each part type carries its own keys (`image_url`, `input_audio`)
and the serving layer answers for the types it cannot read. Framework-free.
"""

from __future__ import annotations

import logging
import re

from pydantic import BaseModel

from fdcli_engine.entrypoints.openai.errors import APIError
from fdcli_engine.entrypoints.openai.protocol import ContentPart

HEADER = "fd-ignored-fields"
MAX_HEADER_CHARS = 1024  # the header names the first fields; the log names every one
logger = logging.getLogger("fd.serve")


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Every undeclared key in `model` and the request models nested in it: this level's own (in body
    order) first, then those of the declared fields (in declaration order)."""
    out = [f"{prefix}{name}" for name in (model.model_extra or {})]
    for name in type(model).model_fields:
        if name in model.model_fields_set:
            out.extend(_nested(getattr(model, name), f"{prefix}{name}"))
    return out


def _nested(value, path: str) -> list[str]:
    if isinstance(value, ContentPart):
        return []
    if isinstance(value, BaseModel):
        return unknown_fields(value, path + ".")
    if isinstance(value, list):
        # Most lists are scalars (a prompt's token ids): their element types are read in one C pass,
        # and only a list holding models or lists is walked item by item.
        if not any(issubclass(t, _CONTAINERS) for t in set(map(type, value))):
            return []
        return [f for i, v in enumerate(value) for f in _nested(v, f"{path}[{i}]")]
    return []


_CONTAINERS = (BaseModel, list)


def header_value(fields: list[str]) -> str:
    """The fields as one header value: printable ASCII only (a field name is client text: control
    characters would break the response, non-Latin-1 ones cannot be sent), commas escaped so they
    only separate names, cut to MAX_HEADER_CHARS with a trailing `...`."""
    names = [f.encode("unicode_escape").decode("ascii").replace(",", "\\x2c") for f in fields]
    value = ",".join(names)
    return value if len(value) <= MAX_HEADER_CHARS else value[: MAX_HEADER_CHARS - 3] + "..."


def unrecognized(param: str) -> APIError:
    """OpenAI's answer to a field it does not know."""
    return APIError(f"Unrecognized request argument supplied: {param}", 400, param=param)


class IgnoredFieldsLog:
    """Logs each ignored field name once (list indices dropped: `messages[].foo` once for all). Names
    are client text: at most MAX_LOGGED distinct ones are logged, each cut to 100 characters."""

    MAX_LOGGED = 256

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def note(self, fields: list[str], route: str) -> None:
        for name in dict.fromkeys(re.sub(r"\[\d+\]", "[]", f)[:100] for f in fields):
            if name in self._seen or len(self._seen) > self.MAX_LOGGED:
                continue
            self._seen.add(name)
            if len(self._seen) > self.MAX_LOGGED:
                logger.warning(
                    "%s: more unknown request field names than %d; no more are logged", route, self.MAX_LOGGED
                )
                continue
            logger.warning(
                "%s: ignored the unknown request field %r (named in the %s response header; "
                "--strict-request-fields refuses such requests)",
                route,
                name,
                HEADER,
            )
