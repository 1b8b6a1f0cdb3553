"""Tool calling in the chat serving layer: which `tool_choice` a request may use, the grammar that
forces a call, and each choice's output split into reasoning, content and tool calls, whole or
streamed.

tool_choice (with `tools` given; absent means "auto", as in OpenAI's API):
- "auto": the output is parsed by the server's `--tool-call-parser`; without one, a 400.
- "none": tools still reach the chat template (vLLM's default) but the output is not parsed.
- "required" / a named function `{"type": "function", "function": {"name": ...}}`: the output is
  forced by a JSON-schema grammar (`tool_choice_constraint`) and read directly (tool_parsers/forced.py),
  with or without --tool-call-parser, as vLLM does. A name not among the tools is a 400; so is a
  request that also constrains the output another way (response_format, guided_*, structured_outputs).

Split rules (`OutputSplitter.split`), with R the reasoning parser and T the tool parser:
- reasoning, C = R.split(text), or (None, text) without R.
- a parser that reads the answer (`reads_answer`) is given C; its content is C's text before the
  calls, or C itself when there are none.
- ernie-x1 reads the raw text; calls parsed: content = C cut at T's start tag, trailing whitespace
  removed, None when empty. No calls: content = C; if the text after the reasoning holds a
  (malformed) call block that neither field kept (ernie-x1's R drops call blocks from content), the
  raw text from that block on is appended: the model's words are never silently dropped.
- parallel_tool_calls false: only the first call is returned.

Streaming re-splits the text received so far after every delta, less a tail that could still grow
into a tag or be trailing whitespace, and sends only the new part of each field; once calls begin,
content is held at the cut. Every field sent before the end is a prefix of the whole-text field
whatever comes next. Tool calls are sent as OpenAI does: for each call a first delta with `index`,
`id`, `type` and `function.name` (arguments ""), then argument fragments. A JSON-argument format
(T.new_scanner) streams the arguments' source text as it grows, so the fragments add up to the
non-streamed arguments exactly; other formats send each call whole when the output ends. (An output
whose calls turn out malformed at the end — cut off by max_tokens — has had its first fragments
sent; its text then follows as content, as in the whole response.)
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput
from fdcli_engine.entrypoints.openai.protocol import DeltaToolCall
from fdcli_engine.entrypoints.openai.reasoning_ernie import THINK_END
from fdcli_engine.entrypoints.openai.tool_parsers.forced import NamedCallParser, RequiredCallParser
from fdcli_engine.tokenizer.chat_render import tools_in_system_prompt as render_tools_in_system_prompt

# Tags of the reasoning formats fd parses (<think>, ERNIE's <response>); the reasoning parser's own
# tags (Mistral's [THINK]) and the tool parser's are added per splitter. A tail of the text that could grow into one of these is held back.
_REASONING_TAGS = ("<think>", "</think>", "<response>", "</response>")

# Request fields that constrain the output: tool_choice "required" / named cannot be combined with them.
_CONSTRAINT_FIELDS = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structural_tag",
)


def _named_function(req) -> str | None:
    """The function a named tool_choice asks for (a 400 when malformed); None for a string choice."""
    choice = req.tool_choice
    if not isinstance(choice, dict):
        return None
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str) or not name:
        raise bad_request(
            'a named tool_choice is {"type": "function", "function": {"name": "<one of tools>"}}',
            "tool_choice",
        )
    if name not in {t.function.name for t in req.tools or ()}:
        raise bad_request(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")
    return name


def tool_call_parser(req, tool_parser_cls):
    """The parser for this request's output (an instance), or None when it is not parsed for tool
    calls; a 400 for a tool_choice fd cannot honour."""
    choice = req.tool_choice
    if req.tools == []:  # OpenAI's API refuses it (minItems 1), and so does vLLM
        raise bad_request(
            "tools must not be an empty array: list at least one function, or leave tools out", "tools"
        )
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools: list the functions the model may call", "tool_choice")
        return None
    name = _named_function(req)
    if name is not None:
        return NamedCallParser(name)
    if choice == "required":
        return RequiredCallParser()
    if choice not in (None, "auto", "none"):
        raise bad_request(
            f'tool_choice {choice!r} is not valid: use "auto", "none", "required" or a named function',
            "tool_choice",
        )
    if choice == "none":
        return None
    if tool_parser_cls is None:
        raise bad_request(
            'tool calling (tool_choice "auto") needs fd serve (or fd run-batch) started with '
            '--tool-call-parser (e.g. hermes); or send tool_choice "none", "required" or a named function',
            "tools" if choice is None else "tool_choice",
        )
    return tool_parser_cls(req.tools) if getattr(tool_parser_cls, "reads_tools", False) else tool_parser_cls()


def tool_choice_constraint(req):
    """The StructuredOutputsParams that forces tool_choice "required" / a named function, else None.

    required: a JSON array (at least one item; at most one with parallel_tool_calls false) of
    objects {"name": one tool's name, "parameters": that tool's schema}, one anyOf branch per tool.
    named: the function's parameters schema itself.
    A function without `parameters` takes none (OpenAI: an empty parameter list), so its arguments are
    the empty object, as vLLM constrains them; close_objects keeps `properties: {}` closed."""
    if not req.tools or (req.tool_choice != "required" and not isinstance(req.tool_choice, dict)):
        return None
    name = _named_function(req)
    for other in _CONSTRAINT_FIELDS:
        value = getattr(req, other, None)
        if value is not None and not (other == "response_format" and value.type == "text"):
            raise bad_request(
                f"tool_choice {'required' if name is None else repr(name)} forces the output into tool "
                f"calls and cannot be combined with {other}: send one of tool_choice and {other}",
                "tool_choice",
            )
    from fdcli_engine.structured_output.params import StructuredOutputsParams  # noqa: PLC0415

    def parameters(tool) -> dict:
        return tool.function.parameters or {"type": "object", "properties": {}}

    if name is not None:
        tool = next(t for t in req.tools if t.function.name == name)
        return StructuredOutputsParams(json=parameters(tool))
    shared: dict[str, dict] = {}
    branches = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": _without_definitions(parameters(t), shared),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in req.tools
    ]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": branches}, **shared}
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return StructuredOutputsParams(json=schema)


# Where JSON schemas keep the definitions their `$ref`s point at ("#/$defs/X"; "definitions" before
# draft 2019-09, still written by pydantic v1 and zod-to-json-schema).
_DEFINITION_KEYS = ("$defs", "definitions")


def _without_definitions(parameters: dict, shared: dict[str, dict]) -> dict:
    """A tool's parameters schema with its definitions moved into `shared`, the root of the
    "required" schema: nested under the array, the schema's "#/$defs/X" refs would point at nothing.
    Two tools defining one name differently is a 400 naming tools (vLLM hoists and refuses the same)."""
    kept = {k: v for k, v in parameters.items() if k not in _DEFINITION_KEYS}
    for key in _DEFINITION_KEYS:
        defs = parameters.get(key)
        if defs is None:
            continue
        if not isinstance(defs, dict):
            raise bad_request(f"tools: a parameters schema's {key} must be an object", "tools")
        root = shared.setdefault(key, {})
        for name, definition in defs.items():
            if root.setdefault(name, definition) != definition:
                raise bad_request(
                    f"tools: {key}/{name} is defined differently by two tools; tool_choice required "
                    "needs one definition per name (rename one, or send a named tool_choice)",
                    "tools",
                )
    return kept


class OutputSplitter:
    """One choice's output -> reasoning, content and tool calls (see the module docstring).
    `tool_parser` is a parser instance or class (None: no tool calls are parsed)."""

    def __init__(self, reasoning_parser_cls=None, tool_parser=None, parallel_tool_calls: bool = True):
        if isinstance(tool_parser, type):
            tool_parser = tool_parser()
        self.reasoning_parser_cls = reasoning_parser_cls
        self.tool_parser = tool_parser
        self.parallel_tool_calls = parallel_tool_calls
        own_tags = reasoning_parser_cls.tags() if reasoning_parser_cls is not None else ()
        self._tags = _REASONING_TAGS + own_tags + (tuple(tool_parser.tags) if tool_parser else ())
        self._text = ""
        self._sent_reasoning = 0
        self._sent_content = 0
        # Streamed calls: the scanner over the calls region, and per announced call its id and the
        # arguments sent so far.
        self._scanner = None
        self._scan_off = not hasattr(tool_parser, "new_scanner")
        self._sent_calls: list[tuple[str, str]] = []

    def _reason(self, text: str) -> tuple[str | None, str]:
        if self.reasoning_parser_cls is None:
            return None, text
        whole = self.reasoning_parser_cls().split(text)
        return whole.reasoning, whole.content

    def _tail_start(self, text: str) -> int:
        """Where the answer part of the raw text begins (after </think> when R splits reasoning)."""
        end = getattr(self.reasoning_parser_cls, "end", THINK_END)
        if self.reasoning_parser_cls is None or end not in text:
            return 0
        return text.index(end) + len(end)

    def _call_start(self, content: str) -> int:
        parser = self.tool_parser
        if getattr(parser, "reads_answer", False):
            return parser.call_start(content)
        return content.find(parser.start_tag)

    def split(self, text: str) -> ParsedOutput:
        reasoning, content = self._reason(text)
        parser = self.tool_parser
        if parser is None:
            return ParsedOutput(reasoning, content)
        if getattr(parser, "reads_answer", False):
            extracted = parser.extract(content)
            calls = extracted.tool_calls if self.parallel_tool_calls else extracted.tool_calls[:1]
            return ParsedOutput(reasoning, extracted.content, calls)
        tag = parser.start_tag
        extracted = parser.extract(text)
        if extracted.tools_called:
            calls = extracted.tool_calls
            if not self.parallel_tool_calls:
                calls = calls[:1]
            return ParsedOutput(reasoning, content.partition(tag)[0].rstrip() or None, calls)
        at = text.find(tag, self._tail_start(text))
        if at != -1 and tag not in content and tag not in (reasoning or ""):
            content = f"{content}\n\n{text[at:]}" if content else text[at:]
        return ParsedOutput(reasoning, content)

    def _held(self, text: str) -> str:
        """The text so far less a tail that could still change how it splits."""
        for n in range(min(len(text), max(map(len, self._tags)) - 1), 0, -1):
            if any(t.startswith(text[-n:]) for t in self._tags):
                text = text[:-n]
                break
        return text.rstrip()

    def feed(self, delta: str, final: bool = False) -> ParsedOutput:
        """One streamed delta -> the new reasoning and content text, and `call_deltas` (DeltaToolCall
        parts to send); `tool_calls` (the whole calls, for finish_reason) only when `final`."""
        self._text += delta
        deltas: list[DeltaToolCall] = []
        if final:
            whole = self.split(self._text)
            reasoning, content, calls = whole.reasoning or "", whole.content or "", whole.tool_calls
            deltas = self._final_call_deltas(calls)
        else:
            held = self._held(self._text)
            reasoning, content = self._reason(held)
            reasoning, calls = reasoning or "", []
            if self.tool_parser is not None:
                at = self._call_start(content)
                if at != -1:
                    if not self._scan_off:
                        deltas = self._scan(self._reason(self._text)[1])
                    content = content[:at].rstrip()  # calls have begun: hold content at the cut
        out = ParsedOutput(reasoning[self._sent_reasoning :], content[self._sent_content :], calls)
        out.call_deltas = deltas
        self._sent_reasoning = max(self._sent_reasoning, len(reasoning))
        self._sent_content = max(self._sent_content, len(content))
        return out

    def _scan(self, answer: str) -> list[DeltaToolCall]:
        """The new call parts in the calls region of the answer so far (every char of it: the JSON
        scanner holds back an open value's trailing whitespace itself)."""
        region = self.tool_parser.calls_region(answer)
        if region is None:
            return []
        if self._scanner is None:
            self._scanner = self.tool_parser.new_scanner()
        fed = self._scanner.text
        if not region.startswith(fed):  # the region did not grow by appending: stop streaming parts
            self._scan_off = True
            return []
        found = self._scanner.feed(region[len(fed) :])
        deltas = []
        for k, call in enumerate(found):
            if (k and not self.parallel_tool_calls) or call.name is None:
                break  # calls are announced in order, each once its name is complete
            if k == len(self._sent_calls):
                call_id = getattr(call, "id", None) or self.tool_parser.new_id()
                deltas.append(_header(k, call_id, call.name))
                self._sent_calls.append((call_id, ""))
            call_id, sent = self._sent_calls[k]
            args = self._scanner.arguments(call)
            if len(args) > len(sent) and args.startswith(sent):
                deltas.append(DeltaToolCall(index=k, function={"arguments": args[len(sent) :]}))
                self._sent_calls[k] = (call_id, args)
        return deltas

    def _final_call_deltas(self, calls) -> list[DeltaToolCall]:
        """What is left to send of the whole calls: the rest of each announced call's arguments, and
        each call not announced yet whole (with its index)."""
        deltas = []
        for k, call in enumerate(calls):
            args = call.function.arguments
            if k < len(self._sent_calls):
                sent = self._sent_calls[k][1]
                if len(args) > len(sent) and args.startswith(sent):
                    deltas.append(DeltaToolCall(index=k, function={"arguments": args[len(sent) :]}))
            else:
                function = {"name": call.function.name, "arguments": args}
                deltas.append(DeltaToolCall(index=k, id=call.id, type="function", function=function))
        return deltas


def _header(index: int, call_id: str, name: str) -> DeltaToolCall:
    return DeltaToolCall(index=index, id=call_id, type="function", function={"name": name, "arguments": ""})


# The tool list for a chat template that has no `tools` variable (SmolLM2's and other plain ChatML
# templates): the request's tools are written into the system prompt, in the words Qwen2.5's template
# uses, rather than refused. Refusing would leave fd's default model without tool calling, where a
# forced tool_choice does not even depend on the model knowing the format (the grammar writes it);
# dropping them silently (what such a template does) would leave the model blind to the tools.
def tools_in_system_prompt(messages: list[dict], tools: list[dict], tool_parser) -> list[dict]:
    """`messages` with the tool list in the system prompt (tokenizer/chat_render.py), the hermes call
    format described when that is the format the output is parsed in."""
    from fdcli_engine.entrypoints.openai.tool_parsers.hermes import HermesToolParser  # noqa: PLC0415

    # The <tool_call> format itself: not a subclass writing other tags (longcat).
    return render_tools_in_system_prompt(messages, tools, type(tool_parser) is HermesToolParser)
