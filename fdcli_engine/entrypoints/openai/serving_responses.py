"""POST /v1/responses (OpenAI's Responses API), text and function tools, framework-free.

A request becomes a chat request (instructions as the system message, the input items as messages)
and rides the chat serving path: the same template rendering, limits, sampling parameters and engine
call (`OpenAIServingChat.prepare`). Only the reply's shape differs: a Response object, or the
Responses event stream the `openai` SDK's `client.responses.stream` accumulates:

  response.created → response.in_progress → response.output_item.added → response.content_part.added
  → response.output_text.delta … → response.output_text.done → response.content_part.done
  → response.output_item.done → response.completed (response.incomplete when max_output_tokens cut it)

With a --reasoning-parser, the reasoning text comes first as a reasoning item (vLLM's shape); function
calls (responses_tools.py) come after the message, their arguments streamed as the tool parser reads
them (responses_stream.py):

  response.output_item.added → response.function_call_arguments.delta … → …arguments.done
  → response.output_item.done
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator

from pydantic import ValidationError

from fdcli_engine.entrypoints.openai.errors import APIError, bad_request, from_exception
from fdcli_engine.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, ContentPart
from fdcli_engine.entrypoints.openai.protocol_responses import (
    LOGPROBS_INCLUDE,
    VLLM_SAMPLING_FIELDS,
    IncompleteDetails,
    InputContentPart,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from fdcli_engine.entrypoints.openai.responses_stream import EventWriter, OutputItems
from fdcli_engine.entrypoints.openai.responses_tools import (
    add_function_call,
    chat_tool_choice,
    chat_tools,
    function_call_items,
    function_call_output,
)
from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat, PreparedChat
from fdcli_engine.entrypoints.openai.serving_common import check_generative, final_outputs, merge_jobs
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter

TEXT_PARTS = ("input_text", "output_text", "text")
# Chat-side parameter names in errors from the shared path -> the Responses API's names.
_PARAMS = {
    "max_completion_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text.format",
}


def check_unsupported(req: ResponsesRequest) -> None:
    if req.previous_response_id is not None:
        raise bad_request(
            "previous_response_id is not supported: fd stores no responses; send the whole conversation "
            "in input",
            "previous_response_id",
        )
    if req.prompt is not None:
        raise bad_request(
            "prompt templates are not supported: fd stores no prompts; send the text in instructions and input",
            "prompt",
        )
    if req.conversation is not None:
        raise bad_request(
            "conversations are not supported: fd stores no conversations; send the whole conversation in input",
            "conversation",
        )
    if req.background:
        raise bad_request("background responses are not supported: fd answers in the request", "background")
    fmt = _text_format(req)
    if fmt is not None and fmt.type not in ("text", "json_object", "json_schema"):
        raise bad_request(
            f"text.format {fmt.type!r} is not supported on /v1/responses; use text, json_object or json_schema",
            "text.format",
        )


def response_format(req: ResponsesRequest) -> dict | None:
    """The chat response_format of the Responses API's text.format (whose json_schema is flat:
    name, schema, strict and description sit next to `type`)."""
    fmt = _text_format(req)
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    spec = fmt.echo()
    spec.pop("type")
    return {"type": "json_schema", "json_schema": spec}


def to_messages(req: ResponsesRequest) -> list[ChatMessage]:
    """The chat messages of a request: instructions first (system), then the input items. An
    `input_image` part (its `image_url` a URL string) becomes the chat's image_url part, which the chat
    path loads and checks against the model like any other."""
    messages = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
    if isinstance(req.input, str):
        return [*messages, ChatMessage(role="user", content=req.input)]
    if not req.input:
        raise bad_request("input is empty", "input")
    for i, item in enumerate(req.input):
        if item.type == "reasoning":
            _add_to_assistant_turn(messages, reasoning_content=_reasoning_text(item, i))
            continue
        if item.type == "function_call":
            add_function_call(messages, item, i)
            continue
        if item.type == "function_call_output":
            messages.append(function_call_output(item, i))
            continue
        if item.type != "message":
            raise bad_request(
                f"input item type {item.type!r} is not supported: fd's /v1/responses takes message, "
                "reasoning, function_call and function_call_output items",
                f"input[{i}].type",
            )
        if item.role is None or item.content is None:
            raise bad_request("a message item needs role and content", f"input[{i}]")
        content = item.content
        if isinstance(content, list):
            parts = [_chat_part(part, f"input[{i}].content[{j}]") for j, part in enumerate(content)]
            images = any(p.type == "image_url" for p in parts)
            content = parts if images else "\n".join(p.text for p in parts)
        if item.role == "assistant":
            _add_to_assistant_turn(messages, content=content)
        else:
            messages.append(ChatMessage(role=item.role, content=content))
    return messages


def continues_last_message(req: ResponsesRequest) -> bool:
    """vLLM's partial completion: a last assistant message (or reasoning item) still in_progress or
    incomplete is continued rather than answered."""
    if isinstance(req.input, str) or not req.input:
        return False
    last = req.input[-1]
    partial = last.type in ("message", "reasoning") and last.status in ("in_progress", "incomplete")
    return partial and (last.type == "reasoning" or last.role == "assistant")


def _add_to_assistant_turn(messages: list[ChatMessage], **fields) -> None:
    """An earlier response's output items as one assistant turn (vLLM's rule): a reasoning item and
    the message item after it fill the same assistant message's reasoning_content and content."""
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        free = {k: v for k, v in fields.items() if getattr(last, k) in (None, "")}
        if len(free) == len(fields):
            messages[-1] = last.model_copy(update=free)
            return
    messages.append(ChatMessage(role="assistant", **{"content": "", **fields}))


def _reasoning_text(item, i: int) -> str:
    """A reasoning item's text: its first content part, else its first summary part (as vLLM)."""
    if item.encrypted_content:
        raise bad_request(
            "encrypted reasoning content is not supported: send the reasoning item's content",
            f"input[{i}].encrypted_content",
        )
    parts = item.content if isinstance(item.content, list) and item.content else item.summary or []
    return (parts[0].text or "") if parts else ""


def _chat_part(part: InputContentPart, param: str) -> ContentPart:
    """A Responses content part as the chat path's part: text, or an image_url for `input_image`."""
    if part.type == "input_image":
        url = (part.model_extra or {}).get("image_url")
        if not isinstance(url, str) or not url:
            raise bad_request(
                "an input_image part needs image_url (a data:, http(s):// or file:// URL); file_id is "
                "not supported",
                param,
            )
        return ContentPart(type="image_url", image_url={"url": url})
    if part.type not in TEXT_PARTS or part.text is None:
        raise bad_request(
            f"content part type {part.type!r} is not supported: send input_text and input_image parts",
            f"{param}.type",
        )
    return ContentPart(type="text", text=part.text)


class OpenAIServingResponses:
    def __init__(self, chat: OpenAIServingChat):
        self.chat = chat

    async def create_response(self, req: ResponsesRequest, request_id: str | None = None):
        """A ResponseObject, or (stream=True) an async iterator of SSE events."""
        check_generative(self.chat.engine, "/v1/responses")
        check_unsupported(req)
        tools = chat_tools(req)
        try:
            chat_req = ChatCompletionRequest(
                model=req.model,
                messages=to_messages(req),
                max_completion_tokens=req.max_output_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                stream=req.stream,
                response_format=response_format(req),
                tools=tools,
                # Without tools the Response only repeats tool_choice (its default is "auto").
                tool_choice=chat_tool_choice(req.tool_choice) if tools else None,
                parallel_tool_calls=req.parallel_tool_calls,
                logprobs=_wants_logprobs(req),
                top_logprobs=req.top_logprobs if _wants_logprobs(req) else None,
                add_generation_prompt=not continues_last_message(req),
                continue_final_message=continues_last_message(req),
                truncate_prompt_tokens=self._truncation(req),
                chat_template_kwargs=_template_kwargs(req),
                **{name: getattr(req, name) for name in VLLM_SAMPLING_FIELDS if name in req.model_fields_set},
            )
        except ValidationError as e:  # text.format's keys and vLLM's extras are checked here
            raise _invalid(e) from None
        rid = request_id or req.request_id or "resp_" + uuid.uuid4().hex
        try:
            p = await self.chat.prepare(chat_req, rid)
        except APIError as e:
            raise _renamed(e, 1 if req.instructions else 0) from None
        if req.stream:
            return self._stream(req, chat_req, p)
        return await self._full(req, chat_req, p)

    def _logprobs(self, chat_req: ChatCompletionRequest, comp, token_ids) -> list[dict]:
        """The chat path's token logprobs (the Responses API's Logprob shape is the same)."""
        if not chat_req.logprobs or comp.logprobs is None or not token_ids:
            return []
        return [lp.model_dump() for lp in self.chat._logprobs(chat_req, comp.logprobs, token_ids).content]

    def _truncation(self, req: ResponsesRequest) -> int | None:
        """truncation="auto": vLLM's truncate_prompt_tokens of max_model_len - max_output_tokens (the
        prompt's last tokens that leave room for the answer; at least one token when it is unset)."""
        if req.truncation != "auto":
            return None
        return max(self.chat.engine.model_config.max_model_len - (req.max_output_tokens or 1), 1)

    def _splitter(self, req: ResponsesRequest, p: PreparedChat) -> OutputSplitter:
        return OutputSplitter(
            self.chat.reasoning_parser_cls, p.tool_parser, req.parallel_tool_calls is not False
        )

    async def _full(
        self, req: ResponsesRequest, chat_req: ChatCompletionRequest, p: PreparedChat
    ) -> ResponseObject:
        (_, out) = (await final_outputs(self.chat.engine, p.jobs))[0]
        comp = out.outputs[0]
        split = self._splitter(req, p).split(comp.text)
        status = "incomplete" if comp.finish_reason == "length" else "completed"
        key = _item_key(p)
        output = []
        if split.reasoning:
            output.append(ReasoningItem(id="rs_" + key, content=[ReasoningText(text=split.reasoning)]))
        if split.content or not split.tool_calls:  # as vLLM: no empty message beside the calls
            text = OutputText(
                text=split.content or "", logprobs=self._logprobs(chat_req, comp, comp.token_ids)
            )
            output.append(OutputMessage(id="msg_" + key, status=status, content=[text]))
        output += function_call_items(split.tool_calls, key, status)
        reasoning = self.chat.reasoning_tokens(p, comp.token_ids)
        usage = _usage(len(p.prompt_ids), len(comp.token_ids), out.num_cached_tokens, reasoning)
        return _response(req, p, status, output, usage)

    async def _stream(
        self, req: ResponsesRequest, chat_req: ChatCompletionRequest, p: PreparedChat
    ) -> AsyncIterator[str]:
        events = EventWriter()
        head = _response(req, p, "in_progress", [], None).model_dump()
        yield events.emit("response.created", response=head)
        yield events.emit("response.in_progress", response=head)
        items = OutputItems(events, _item_key(p))
        splitter, num_tokens, cached, reason = self._splitter(req, p), 0, 0, None
        token_ids: list[int] = []  # for the reasoning tokens in usage
        try:
            async for _, out in merge_jobs(self.chat.engine, p.jobs):
                comp = out.outputs[0]
                num_tokens += len(comp.delta_token_ids)
                token_ids += comp.delta_token_ids
                split = splitter.feed(comp.delta_text, final=out.finished)
                items.add_logprobs(self._logprobs(chat_req, comp, list(comp.delta_token_ids)))
                for kind, delta in (("reasoning", split.reasoning), ("message", split.content)):
                    for event in items.feed(kind, delta) if delta else ():
                        yield event
                for part in split.call_deltas:
                    for event in items.feed_call(part):
                        yield event
                if out.finished:
                    cached, reason = out.num_cached_tokens, comp.finish_reason
        except Exception as e:
            err = from_exception(e)
            yield events.emit("error", code=err.code, message=err.message, param=err.param)
            return
        status = "incomplete" if reason == "length" else "completed"
        for event in items.finish(status):
            yield event
        usage = _usage(len(p.prompt_ids), num_tokens, cached, self.chat.reasoning_tokens(p, token_ids))
        final = _response(req, p, status, items.items, usage)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        yield events.emit(kind, response=final.model_dump())


def _item_key(p: PreparedChat) -> str:
    """The request's id without its prefix: output item ids are rs_KEY and msg_KEY."""
    return p.request_id.removeprefix("resp_")


def _usage(input_tokens: int, output_tokens: int, cached: int, reasoning_tokens: int) -> ResponseUsage:
    """`reasoning_tokens`: those inside the reasoning block (reasoning_budget.py), as vLLM counts them."""
    return ResponseUsage(
        input_tokens=input_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached),
        output_tokens=output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
        total_tokens=input_tokens + output_tokens,
    )


def _response(req: ResponsesRequest, p: PreparedChat, status, output, usage) -> ResponseObject:
    return ResponseObject(
        id=p.request_id,
        status=status,
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        model=p.model,
        output=output,
        temperature=p.jobs[0].params.temperature,
        top_p=p.jobs[0].params.top_p,
        usage=usage,
        metadata=req.metadata or {},
        text={"format": fmt.echo() if (fmt := _text_format(req)) else {"type": "text"}},
        tools=req.tools or [],
        tool_choice=req.tool_choice if req.tool_choice is not None else "auto",
        parallel_tool_calls=req.parallel_tool_calls is not False,
        truncation=req.truncation or "disabled",
        user=req.user,
        reasoning=req.reasoning.model_dump(exclude_unset=True) if req.reasoning is not None else None,
        service_tier=req.service_tier or "auto",
        top_logprobs=req.top_logprobs if _wants_logprobs(req) else None,
    )


def _template_kwargs(req: ResponsesRequest) -> dict | None:
    """vLLM's ResponsesRequest.build_chat_params: reasoning.effort is the chat template's
    `reasoning_effort` (gpt-oss's template and others read it); nothing else is added."""
    effort = req.reasoning.effort if req.reasoning is not None else None
    return {"reasoning_effort": effort} if effort is not None else None


def _wants_logprobs(req: ResponsesRequest) -> bool:
    return LOGPROBS_INCLUDE in (req.include or ())


def _text_format(req: ResponsesRequest):
    return req.text.format if req.text is not None else None


def _invalid(e: ValidationError) -> APIError:
    """The 400 of a chat request the Responses request could not become, naming the Responses field."""
    error = e.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else "input"
    name = _PARAMS.get(name, name)
    return bad_request(f"{name}: {error['msg']}", name)


def _renamed(e: APIError, offset: int = 0) -> APIError:
    """An error of the shared chat path with the Responses API's parameter names; `offset`: chat
    messages before input[0] (the instructions' system message), so messages[k] is input[k - offset]."""
    old = (e.param or "").split("[")[0].split(".")[0]
    name = _PARAMS.get(old)
    if name is None:
        return e
    message, param = e.message.replace(old, name), e.param.replace(old, name, 1)
    if old == "messages" and offset:

        def shift(m: re.Match) -> str:
            return f"input[{int(m.group(1)) - offset}]"

        message, param = re.sub(r"input\[(\d+)\]", shift, message), re.sub(r"input\[(\d+)\]", shift, param)
    return APIError(message, e.status, param, e.code, e.type, e.headers)
