"""A conversation rendered into a prompt: the one rule for fd's chat routes (serving_chat.render) and the
offline `LLM.chat`, with vLLM's meanings of add_generation_prompt, continue_final_message, tools,
chat_template and chat_template_kwargs. Leaf module: messages are plain dicts here (the server turns
its request models into them first); errors are InvalidRequestError naming the field, which the
server reports as a 400 and the offline API raises (a ValueError).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.tokenizer.chat_template import RenderLimitError, template_takes_tools

# chat_template_kwargs may not set what the call's own arguments set, nor the special tokens, which
# come from the model's tokenizer.
_OWN_ARGUMENTS = ("messages", "add_generation_prompt", "continue_final_message", "chat_template", "tokenize")
_FROM_TOKENIZER = ("bos_token", "eos_token")

_TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>"
)
_HERMES_FORMAT = (
    "\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)

# (messages, tools) -> messages holding the tools, for a template without a `tools` variable.
ToolsToSystem = Callable[[list[dict], list[dict]], list[dict]]


def tools_in_system_prompt(
    messages: list[dict], tools: list[dict], hermes_format: bool = False
) -> list[dict]:
    """`messages` with the tool list appended to the system message (one is added first when there
    is none); `hermes_format` also describes the hermes call format (when the output is read so)."""
    block = _TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if hermes_format:
        block += _HERMES_FORMAT
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        text = first["content"]
        if isinstance(text, list):  # parts with images: the tools go in a text part of their own
            return [{**first, "content": [*text, {"type": "text", "text": block}]}, *messages[1:]]
        return [{**first, "content": f"{text}\n\n{block}" if text else block}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def check_template_kwargs(kwargs: dict | None) -> dict:
    """A copy of chat_template_kwargs; InvalidRequestError for a key the caller may not set there."""
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidRequestError("chat_template_kwargs must be a dict", param="chat_template_kwargs")
    kwargs = dict(kwargs or {})
    for reserved in (*_OWN_ARGUMENTS, "tools", *_FROM_TOKENIZER):
        if reserved in kwargs:
            hint = ": pass them as tools" if reserved == "tools" else ""
            hint = ": fd sets it from the model's tokenizer" if reserved in _FROM_TOKENIZER else hint
            raise InvalidRequestError(
                f"chat_template_kwargs may not set {reserved!r}{hint}", param="chat_template_kwargs"
            )
    return kwargs


def render_chat(
    tok,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template: str | None = None,
    chat_template_kwargs: dict | None = None,
    tools: list[dict] | None = None,
    tools_to_system: ToolsToSystem | None = None,
) -> tuple[str, list[int] | None]:
    """(the prompt text, its ids where the template itself produced ids, else None: the caller
    encodes the text). A template that reads no `tools` variable gets the tools in the system prompt
    (`tools_to_system`, default tools_in_system_prompt) rather than dropping them."""
    kwargs = check_template_kwargs(chat_template_kwargs)
    if continue_final_message and add_generation_prompt:  # vLLM's check and wording
        raise InvalidRequestError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            param="continue_final_message",
        )
    template = chat_template or getattr(tok, "chat_template", None)
    if tools and template and not template_takes_tools(template):
        messages, tools = (tools_to_system or tools_in_system_prompt)(messages, tools), None
    try:
        rendered = tok.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            chat_template=chat_template,
            **({"tools": tools} if tools else {}),
            **kwargs,
        )
    except RenderLimitError as e:
        raise InvalidRequestError(str(e), param="chat_template") from None
    except Exception as e:
        if hasattr(e, "status"):  # the caller's own error type, already meant for the user
            raise
        raise InvalidRequestError(
            f"the chat template failed on these messages: {e}", param="messages"
        ) from None
    if isinstance(rendered, list):
        if not continue_final_message:
            return tok.decode(rendered), list(rendered)
        rendered = tok.decode(rendered)
    if continue_final_message:
        rendered = open_final_message(rendered, text_of(messages[-1]["content"]))
    return rendered, None


def open_final_message(rendered: str, final: str) -> str:
    """The rendered chat cut right after the final message's text, so the model continues it (no
    end of turn, no generation prompt): transformers' and vLLM's continue_final_message. A template
    that strips messages is matched on the stripped text, as transformers does."""
    if not final.strip():
        raise InvalidRequestError(
            "continue_final_message needs a final message with text to continue",
            param="continue_final_message",
        )
    for text in (final, final.strip()):
        if text in rendered:
            return rendered[: rendered.rindex(text) + len(text)]
    raise InvalidRequestError(
        "continue_final_message: the final message does not appear in the rendered chat (the chat "
        "template changes it); send the prefix as a completions prompt instead",
        param="continue_final_message",
    )


def text_of(content: Any) -> str:
    """A message's text as the template writes it: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content or () if isinstance(p, dict) and p.get("type") == "text")
