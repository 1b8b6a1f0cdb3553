"""Function tools on /v1/responses, as vLLM serves them for models without the harmony format: the
Responses API's flat shapes become the chat path's, which renders the tools into the template and reads
the calls with the server's --tool-call-parser (or the grammar of a forced tool_choice).

- tool: {"type": "function", "name", "description", "parameters", "strict"}
  -> {"type": "function", "function": {"name", "description", "parameters", "strict"}}
- tool_choice {"type": "function", "name": N} -> {"type": "function", "function": {"name": N}};
  "auto" / "none" / "required" as they are.
- an earlier response's function_call item -> a tool call of the assistant turn it follows (vLLM's
  merge); a function_call_output item -> a "tool" message answering its call_id.
- each call the parser reads -> a function_call output item (id fc_..., the chat call's id as
  call_id), after the message.
"""

from __future__ import annotations

from typing import Any

from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.protocol import ChatMessage, FunctionCall, ToolCall
from fdcli_engine.entrypoints.openai.protocol_responses import FunctionCallItem, ResponsesRequest

FUNCTION_KEYS = ("name", "description", "parameters", "strict")


def chat_tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    out = []
    for i, tool in enumerate(req.tools):
        if tool.get("type") != "function":
            raise bad_request(
                f"tool type {tool.get('type')!r} is not supported on /v1/responses: fd runs no built-in "
                "tools; declare function tools and run them in the client",
                f"tools[{i}].type",
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request("a function tool needs a name", f"tools[{i}].name")
        out.append({"type": "function", "function": {k: tool[k] for k in FUNCTION_KEYS if k in tool}})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def add_function_call(messages: list[ChatMessage], item, i: int) -> None:
    """A function_call input item as a tool call of the preceding assistant turn (or a new one)."""
    if not item.call_id or not item.name or item.arguments is None:
        raise bad_request("a function_call item needs call_id, name and arguments", f"input[{i}]")
    call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        messages[-1] = last.model_copy(update={"tool_calls": [*(last.tool_calls or []), call]})
    else:
        messages.append(ChatMessage(role="assistant", content="", tool_calls=[call]))


def function_call_output(item, i: int) -> ChatMessage:
    """A function_call_output input item as the chat's tool message (text parts joined)."""
    if not item.call_id or item.output is None:
        raise bad_request("a function_call_output item needs call_id and output", f"input[{i}]")
    output = item.output
    if isinstance(output, list):
        output = "\n".join(part.text or "" for part in output)
    return ChatMessage(role="tool", content=output, tool_call_id=item.call_id)


def function_call_items(calls: list[ToolCall], key: str, status: str = "completed") -> list[FunctionCallItem]:
    return [
        FunctionCallItem(
            id=f"fc_{key}_{k}",
            call_id=c.id,
            name=c.function.name,
            arguments=c.function.arguments,
            status=status,
        )
        for k, c in enumerate(calls)
    ]
