"""Render Hugging Face-style Jinja chat templates safely.

Templates come from model files (untrusted), so they run in jinja2's ImmutableSandboxedEnvironment: no
attribute access to Python internals, no mutation of passed-in lists/dicts. The helpers templates expect
from transformers are provided with the same meaning: `raise_exception(msg)`, `strftime_now(fmt)`, a
`tojson` filter that keeps non-ASCII text as is, and `trim_blocks`/`lstrip_blocks`. Every failure —
syntax, undefined helper, raise_exception — becomes an InvalidRequestError (a 400, not a 500).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
from typing import Any

from fdcli_engine.errors import InvalidRequestError


class TemplateError(InvalidRequestError):
    """The chat template failed to render for this request (or raised on purpose)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template error: {message}", param="messages")


def _strftime_now(fmt: str) -> str:
    return _dt.datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    indent: int | None = None,
    separators=None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    # Jinja's builtin tojson HTML-escapes <, >, &, ' — wrong for prompts; this one emits plain JSON.
    return json.dumps(
        value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii
    )


@functools.lru_cache(maxsize=16)
def _compile(template: str):
    from jinja2 import StrictUndefined  # noqa: F401  (documented choice below)
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # Undefined (not StrictUndefined): HF templates test optional fields with `is defined` and read missing
    # keys of messages; transformers uses the lenient default too.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"chat template has a syntax error at line {exc.lineno}: {exc.message}") from None


def _flatten_content(content: Any, index: int) -> Any:
    """String content stays; a list of {"type": "text"} parts becomes their texts joined by newlines."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InvalidRequestError(
                    f"messages[{index}].content: only text parts are supported, got {kind!r}",
                    param="messages",
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise InvalidRequestError(
        f"messages[{index}].content must be a string or a list of parts", param="messages"
    )


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list", param="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise InvalidRequestError(
                f"messages[{i}] must be an object with a string 'role'", param="messages"
            )
        m = dict(msg)
        if "content" in m:
            m["content"] = _flatten_content(m["content"], i)
        out.append(m)
    return out


def render_chat_template(
    template: str,
    messages: Any,
    *,
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    special_tokens: dict[str, Any] | None = None,
    **template_kwargs: Any,
) -> str:
    """Render `template` for `messages`; `special_tokens` supplies bos_token/eos_token/... variables."""
    compiled = _compile(template)
    context = {**(special_tokens or {}), **template_kwargs}
    context.update(
        messages=normalize_messages(messages), add_generation_prompt=add_generation_prompt, tools=tools
    )
    try:
        return compiled.render(**context)
    except InvalidRequestError:
        raise
    except Exception as exc:  # jinja2 UndefinedError, SecurityError, TypeError inside a template, ...
        raise TemplateError(
            f"chat template failed to render: {type(exc).__name__}: {exc}", param="messages"
        ) from None
