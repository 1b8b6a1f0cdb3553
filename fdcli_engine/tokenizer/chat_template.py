"""Render Hugging Face-style Jinja chat templates safely.

Templates come from model files (untrusted), so they run in jinja2's ImmutableSandboxedEnvironment: no
attribute access to Python internals, no mutation of passed-in lists/dicts. The helpers templates expect
from transformers are provided with the same meaning: `raise_exception(msg)`, `strftime_now(fmt)`, a
`tojson` filter that keeps non-ASCII text as is, and `trim_blocks`/`lstrip_blocks`. Every failure —
syntax, undefined helper, raise_exception — becomes an InvalidRequestError (a 400, not a 500).

A render is bounded, since a hostile template (a request's own with --trust-request-chat-template, or a
model's) could otherwise loop for hours or fill memory:
- time: RENDER_TIMEOUT_S of wall clock, checked on every line the template's compiled code runs (a
  trace function on the rendering thread only, for frames of template code only), so a loop that
  writes nothing is stopped too;
- output: at most MAX_RENDER_CHARS characters, counted as the template writes them;
- the operators that build a large value in one C call (`*` of a string or list, `**`, `%` with a
  field width) are checked before they run.
Each limit is a TemplateError naming `chat_template`. The serving layer renders off the event loop
(serving_common.off_loop), so a render that runs to its limit delays only its own request.
"""

from __future__ import annotations

import datetime as _dt
import functools
import io
import json
import re
import sys
import time
from typing import Any

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.multimodal.content_parts import TEXT_PARTS

RENDER_TIMEOUT_S = 5.0
MAX_RENDER_CHARS = 16 << 20
_BIG_POWER_BITS = 1 << 16  # `a ** b` for integers: at most this many bits in the result
_FORMAT_WIDTH = re.compile(r"%[-+ #0]*(\d*)(?:\.(\d+))?")
_TEMPLATE_FILE = "<template>"  # the file name of code jinja2 compiles from a string


class TemplateError(InvalidRequestError):
    """The chat template failed to render for this request (or raised on purpose)."""


class RenderLimitError(TemplateError):
    """The template ran past a render limit (time, output size, one oversized value)."""

    def __init__(self, what: str):
        super().__init__(f"the chat template {what}; it was stopped", param="chat_template")


def _size_of_product(left: Any, right: Any) -> int:
    if isinstance(left, int) and isinstance(right, (str, list, tuple)):
        left, right = right, left
    if isinstance(left, (str, list, tuple)) and isinstance(right, int):
        return len(left) * right
    return 0


def _check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "*" and _size_of_product(left, right) > MAX_RENDER_CHARS:
        raise RenderLimitError(f"builds a value of over {MAX_RENDER_CHARS} items with '*'")
    if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        if abs(left) > 1 and max(abs(left).bit_length() - 1, 1) * right > _BIG_POWER_BITS:
            raise RenderLimitError(f"computes an integer of over {_BIG_POWER_BITS} bits with '**'")
    if operator == "%" and isinstance(left, str):
        widths = (int(n) for m in _FORMAT_WIDTH.finditer(left) for n in m.groups() if n)
        if any(w > MAX_RENDER_CHARS for w in widths):
            raise RenderLimitError(f"formats a field wider than {MAX_RENDER_CHARS} characters")


def _render_bounded(compiled, context: dict[str, Any]) -> str:
    deadline = time.monotonic() + RENDER_TIMEOUT_S

    def on_line(frame, event, arg):
        if time.monotonic() > deadline:
            raise RenderLimitError(f"ran for more than {RENDER_TIMEOUT_S:g} s")
        return on_line

    def on_call(frame, event, arg):
        return on_line if frame.f_code.co_filename == _TEMPLATE_FILE else None

    previous = sys.gettrace()  # a coverage tool's or debugger's, restored after
    out, written = io.StringIO(), 0
    sys.settrace(on_call)
    try:
        for chunk in compiled.generate(**context):
            written += len(chunk)
            if written > MAX_RENDER_CHARS:
                raise RenderLimitError(f"wrote more than {MAX_RENDER_CHARS} characters")
            out.write(chunk)
    finally:
        sys.settrace(previous)
    return out.getvalue()


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

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%"})

        def call_binop(self, context, operator, left, right):
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

    # Undefined (not StrictUndefined): HF templates test optional fields with `is defined` and read missing
    # keys of messages; transformers uses the lenient default too.
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"chat template has a syntax error at line {exc.lineno}: {exc.message}") from None


def _flatten_content(content: Any, index: int) -> Any:
    """String content stays; a list of {"type": "text"} parts becomes their texts joined by newlines; a
    list with {"type": "image"} parts (the serving layer's stand-in for each picture) stays a list, as
    HF templates for vision models read it."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts, has_image = [], False
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind == "image":
                has_image = True
            elif kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
                raise InvalidRequestError(
                    f"messages[{index}].content: only text and image parts are supported, got {kind!r}",
                    param="messages",
                )
            else:
                texts.append(part["text"])
        if not has_image:
            return "\n".join(texts)
        return [
            {"type": "text", "text": p["text"]} if p.get("type") in TEXT_PARTS else dict(p) for p in content
        ]
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
        return _render_bounded(compiled, context)
    except InvalidRequestError:
        raise
    except Exception as exc:  # jinja2 UndefinedError, SecurityError, TypeError inside a template, ...
        raise TemplateError(
            f"chat template failed to render: {type(exc).__name__}: {exc}", param="messages"
        ) from None


@functools.lru_cache(maxsize=16)
def template_takes_tools(template: str) -> bool:
    """Whether the template reads the `tools` variable (a template that never does would drop the
    request's tools without a word). A template that does not parse counts as taking them: its
    render reports the syntax error."""
    from jinja2 import Environment, meta
    from jinja2.ext import loopcontrols

    try:
        parsed = Environment(extensions=[loopcontrols]).parse(template)
    except Exception:  # noqa: BLE001  (any parse failure is reported by the render)
        return True
    return "tools" in meta.find_undeclared_variables(parsed)
