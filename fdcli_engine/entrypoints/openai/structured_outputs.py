"""Structured outputs in the serving layer: every request form mapped by one function onto the
StructuredOutputsParams the engine constrains with, then checked against the server's grammar
backend before the request reaches the engine.

Request forms (docs/structured-outputs.md):
- OpenAI's `response_format`: text (no constraint), json_object, json_schema; vLLM's structural_tag;
- vLLM's `structured_outputs: {json, regex, choice, grammar, json_object, structural_tag}`;
- vLLM's older and FastDeploy's `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`,
  FastDeploy's top-level `structural_tag`.
Exactly one constraint per request: two are a 400 naming both fields. Every 400 names the field the
constraint came from, so a client sees its own field, not the engine's name for it.

Invariant: a constraint reaches the engine only after it compiled with the server's backend (the
same backend and limits the engine core compiles it with), so a grammar error never reaches the
engine core; compilation runs off the event loop, bounded in time.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from typing import Any

from fdcli_engine.entrypoints.openai.errors import APIError, bad_request
from fdcli_engine.entrypoints.openai.serving_common import off_loop
from fdcli_engine.errors import ConfigError, InvalidRequestError
from fdcli_engine.structured_output import BACKEND_NAMES, StructuredOutputsParams, get_backend

# A constraint's text (schema, regex, grammar, choices) longer than this is a 400: the body cap
# bounds the request, this bounds what the grammar compiler is given.
MAX_CONSTRAINT_CHARS = 1 << 20
# JSON nesting of a schema (objects and arrays): deeper is a 400 before any recursive code (json
# serialization, the grammar compiler) sees it. Real schemas stay far below.
MAX_SCHEMA_DEPTH = 64
# Seconds a constraint may take to compile; llguidance's own fuel limits usually stop it first.
COMPILE_TIMEOUT_S = 10.0

# vLLM's `structured_outputs` keys that are options, not constraints: accepted, not honoured
# (llguidance's JSON is compact; fd has one backend, so no fallback).
_OPTION_KEYS = (
    "disable_fallback",
    "disable_any_whitespace",
    "disable_additional_properties",
    "whitespace_pattern",
)
_SO_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# Top-level fields, each one constraint kind.
_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "structural_tag": "structural_tag",
}


@dataclass(frozen=True)
class Constraint:
    kind: str  # one of StructuredOutputsParams' constraint fields
    value: Any  # already checked for its type: str, list[str] or True
    field: str  # the request field it came from, named in every 400


def _depth_ok(value: Any, limit: int) -> bool:
    """Whether JSON `value` nests at most `limit` containers deep (iterative: no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > limit:
                return False
            items = v.values() if isinstance(v, dict) else v
            stack.extend((item, depth + 1) for item in items)
    return True


def _json_text(value: Any, field: str, what: str) -> str:
    """A JSON object (or its text) as text; 400 naming `field` for anything else."""
    if isinstance(value, str):
        if len(value) > MAX_CONSTRAINT_CHARS:
            raise _too_long(field)
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise bad_request(f"{field} must be {what} (a JSON object or its text)", field) from None
    if not isinstance(value, dict):
        raise bad_request(f"{field} must be {what} (a JSON object or its text)", field)
    if not _depth_ok(value, MAX_SCHEMA_DEPTH):
        raise bad_request(f"{field} nests deeper than {MAX_SCHEMA_DEPTH} levels", field)
    text = json.dumps(value)
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise _too_long(field)
    return text


def _too_long(field: str) -> APIError:
    return bad_request(f"{field} is longer than {MAX_CONSTRAINT_CHARS} characters", field)


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad_request(f"{field} must be a non-empty string", field)
    if len(value) > MAX_CONSTRAINT_CHARS:
        raise _too_long(field)
    return value


def _choices(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise bad_request(f"{field} must be a non-empty list of non-empty strings", field)
    if sum(len(c) for c in value) > MAX_CONSTRAINT_CHARS:
        raise _too_long(field)
    return list(value)


def _checked(kind: str, value: Any, field: str) -> Constraint:
    """The constraint with its value checked for its type."""
    if kind == "json":
        if isinstance(value, bool):
            raise bad_request(f"{field} must be a JSON schema object, not {str(value).lower()}", field)
        return Constraint(kind, _json_text(value, field, "a JSON schema"), field)
    if kind == "structural_tag":
        return Constraint(kind, _json_text(value, field, "a structural tag"), field)
    if kind == "choice":
        return Constraint(kind, _choices(value, field), field)
    if kind == "json_object":
        if not isinstance(value, bool):
            raise bad_request(f"{field} must be a boolean", field)
        return Constraint(kind, True, field)
    return Constraint(kind, _text(value, field), field)


def _from_response_format(fmt) -> Constraint | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Constraint("json_object", True, "response_format")
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if spec is None or spec.json_schema is None:
            raise bad_request(
                "response_format json_schema needs json_schema.schema (the JSON schema)",
                "response_format.json_schema",
            )
        return _checked("json", spec.json_schema, "response_format")
    # structural_tag: the format's own keys (vLLM's `structures` + `triggers`; xgrammar's `format` is refused).
    tag = {k: v for k, v in fmt.model_dump(exclude_none=True).items() if k not in ("type", "json_schema")}
    if not tag:
        raise bad_request("response_format structural_tag needs structures and triggers", "response_format")
    return Constraint(
        "structural_tag", _json_text(tag, "response_format", "a structural tag"), "response_format"
    )


def _from_structured_outputs(value: Any) -> list[Constraint]:
    field = "structured_outputs"
    if value is None:
        return []
    if not isinstance(value, dict):
        raise bad_request(f"{field} must be an object with one of {', '.join(_SO_KINDS)}", field)
    unknown = sorted(set(value) - set(_SO_KINDS) - set(_OPTION_KEYS))
    if unknown:
        raise bad_request(
            f"{field}.{unknown[0]} is not a structured-outputs field: use one of {', '.join(_SO_KINDS)}",
            f"{field}.{unknown[0]}",
        )
    out = []
    for kind in _SO_KINDS:
        v = value.get(kind)
        if v is None or (kind == "json_object" and v is False):
            continue
        out.append(_checked(kind, v, f"{field}.{kind}"))
    if not out:  # vLLM's StructuredOutputsParams refuses it too: options alone constrain nothing
        raise bad_request(
            f"{field} names no constraint: give one of {', '.join(_SO_KINDS)}, or leave {field} out", field
        )
    return out


def constraint_of(req) -> Constraint | None:
    """The one constraint a chat or completions request asks for (None: unconstrained); a 400 naming
    the field for a wrong type, and naming both fields when there are two."""
    found: list[Constraint] = []
    fmt = _from_response_format(getattr(req, "response_format", None))
    if fmt is not None:
        found.append(fmt)
    found += _from_structured_outputs(req.structured_outputs)
    for name, kind in _GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            found.append(_checked(kind, value, name))
    if len(found) > 1:
        names = [c.field for c in found]
        raise bad_request(
            f"a request takes one structured-outputs constraint; got {' and '.join(names)}", names[1]
        )
    for name in ("guided_decoding_backend", "guided_whitespace_pattern"):
        value = getattr(req, name)
        if value is not None and not isinstance(value, str):
            raise bad_request(f"{name} must be a string", name)
    return found[0] if found else None


def to_params(c: Constraint, start_after_token_ids: list[int] | None = None) -> StructuredOutputsParams:
    return StructuredOutputsParams(
        **{c.kind: c.value}, start_after_token_ids=list(start_after_token_ids or [])
    )


def _one_line(message: str, limit: int = 1000) -> str:
    """A compiler's multi-line error (source excerpts, caret markers) as one line for the client."""
    lines = [ln.strip() for ln in message.splitlines()]
    text = "; ".join(ln for ln in lines if ln.strip("^~ "))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def reasoning_start_after(parser_cls, encode, prompt: str | None, template: str | None) -> list[int]:
    """The tokens after which a chat request's constraint starts, under a --reasoning-parser: the
    reasoning block stays free and the answer is constrained (vLLM's behaviour). Empty (constrained
    from the first token) when no reasoning is coming:
    - the prompt already closes the block (enable_thinking: false in Qwen3's and ERNIE's templates
      writes an empty <think></think> into the generation prompt);
    - the prompt opens no block, the parser's model opens it itself (Qwen3), and the chat template
      never mentions the end tag (a model without thinking served with a reasoning parser).
    Otherwise: the end tag's token ids (the prompt opened the block, as DeepSeek-R1's and ERNIE's
    templates do, or the model is expected to). `encode(text)` gives token ids without specials."""
    if parser_cls is None:
        return []
    from fdcli_engine.entrypoints.openai.reasoning import END, START  # noqa: PLC0415

    start, end = getattr(parser_cls, "start", START), getattr(parser_cls, "end", END)  # the parser's tags
    text = prompt or ""
    opened, closed = text.rfind(start), text.rfind(end)
    if closed > opened:
        return []
    if opened < 0 and not getattr(parser_cls, "starts_in_reasoning", False) and end not in (template or ""):
        return []
    return list(encode(end))


def _same_backend(requested: str, server: str) -> bool:
    """A request's guided_decoding_backend is accepted when it names the server's backend ("auto"
    and "guidance" are the same one here)."""
    if requested == "auto":
        return True
    norm = {"auto": "guidance"}
    return norm.get(requested, requested) == norm.get(server, server)


class StructuredOutputs:
    """The serving layer's grammar checks over one engine; the backend is built on first use (the
    LLTokenizer costs a pass over the vocabulary), once, and shared by chat and completions."""

    def __init__(self, engine):
        self.engine = engine
        config = getattr(engine, "config", None)
        self.backend_name = getattr(config, "guided_decoding_backend", "auto") or "auto"
        self._backend = None
        self._lock = threading.Lock()

    def backend(self):
        """The server's grammar backend, built on first use (on a prepare worker: it reads the vocabulary)."""
        with self._lock:
            if self._backend is None:
                tok = self.engine.tokenizer
                vocab = getattr(self.engine.model_config, "vocab_size", 0) or tok.vocab_size
                self._backend = get_backend(self.backend_name, tok, vocab)
            return self._backend

    async def params_for(self, req, start_after_token_ids: list[int] | None = None):
        """The request's StructuredOutputsParams (None: unconstrained), compiled once by the server's
        backend; every failure is a 400 naming the request's field."""
        c = constraint_of(req)
        requested = req.guided_decoding_backend
        if requested is not None and requested not in BACKEND_NAMES:
            raise bad_request(
                f"guided_decoding_backend {requested!r} is not known: choose one of {', '.join(BACKEND_NAMES)}",
                "guided_decoding_backend",
            )
        if c is None:
            return None
        if self.backend_name == "off":
            raise bad_request(
                f"structured outputs are off on this server (--guided-decoding-backend off); "
                f"leave {c.field} out or start the server with --guided-decoding-backend auto",
                c.field,
            )
        if requested is not None and not _same_backend(requested, self.backend_name):
            raise bad_request(
                f"guided_decoding_backend {requested!r}: this server's backend is {self.backend_name!r} "
                "(set with --guided-decoding-backend); a request cannot switch it",
                "guided_decoding_backend",
            )
        try:
            params = to_params(c, start_after_token_ids)
        except InvalidRequestError as e:
            raise bad_request(f"{c.field}: {_one_line(str(e))}", c.field) from None
        await self._compile(params, c.field, c.field, c.field)
        return params

    async def _compile(self, params: StructuredOutputsParams, field: str, what: str, config_field: str):
        """Compile `params` and probe its first mask with the server's backend, off the event loop and
        within COMPILE_TIMEOUT_S; a refusal is a 400 naming `field` (its message starts with `what`),
        a backend that cannot be built one naming `config_field`."""
        try:
            # Built once (a pass over the vocabulary), outside the compile budget: a large vocabulary
            # must not make the first request's compile look slow.
            backend = await off_loop(self.backend)
            await asyncio.wait_for(off_loop(_compile_and_probe, backend, params), COMPILE_TIMEOUT_S)
        except InvalidRequestError as e:
            raise bad_request(f"{what}: {_one_line(str(e))}", field) from None
        except ConfigError as e:
            raise bad_request(f"structured outputs are not available: {e}", config_field) from None
        except asyncio.TimeoutError:
            raise bad_request(f"{field} took over {COMPILE_TIMEOUT_S:g} s to compile", field) from None

    # --- tools: the grammar of tool_choice "required" / named (serving_tools.tool_choice_constraint) ---
    async def check_tools(self, params: StructuredOutputsParams) -> None:
        """Compile a forced tool choice's grammar as params_for does; a failure is a 400 naming
        `tools` (their parameter schemas make the grammar)."""
        if self.backend_name == "off":
            raise bad_request(
                "tool_choice required / a named function needs structured outputs, which are off on this "
                "server (--guided-decoding-backend off); send tool_choice auto or none",
                "tool_choice",
            )
        await self._compile(params, "tools", "tools: the parameters schemas do not compile", "tool_choice")

    # --- end tools ---


def _compile_and_probe(backend, params: StructuredOutputsParams) -> None:
    """Compile (cached by the backend) and compute the first mask: a constraint that matches nothing
    ends there, before any token (an empty regex class, a grammar of one impossible token)."""
    matcher = backend.compile(params).matcher()
    matcher.fill_bitmask(backend.allocate_bitmask(1), 0)
    if matcher.is_terminated():
        raise InvalidRequestError(
            f"the {params.kind} constraint matches no output", param="structured_outputs"
        )
