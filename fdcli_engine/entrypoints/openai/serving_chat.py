"""POST /v1/chat/completions, framework-free: messages → chat template → engine → response or SSE."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fdcli_engine.entrypoints.openai.echo_logprobs import (
    check_logit_bias_vocab,
    check_prompt_logprobs,
    prompt_logprobs_out,
)
from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    ChatTokenLogprob,
    DeltaToolCall,
    TopLogprob,
)
from fdcli_engine.entrypoints.openai.serving_common import (
    SSE_DONE,
    EngineClient,
    Job,
    build_params,
    check_generative,
    check_model,
    check_prompt,
    encode,
    fan_out,
    final_outputs,
    logprob_rows,
    make_usage,
    merge_jobs,
    off_loop,
    random_id,
    stream_error,
)
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter, parses_tool_calls
from fdcli_engine.entrypoints.openai.stream_chunks import ChunkWriter, chat_choice, chat_delta
from fdcli_engine.tokenizer.chat_template import RenderLimitError


def messages_to_dicts(messages) -> list[dict]:
    """Plain dicts for the template; text parts are joined with newlines, other part types are a 400."""
    out = []
    for i, m in enumerate(messages):
        if "content" not in m.model_fields_set and not m.tool_calls:
            # Only an assistant message that calls tools may leave content out (as in OpenAI's API).
            raise bad_request(f"messages[{i}].content: Field required", f"messages[{i}].content")
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise bad_request(
                        f"content part type {part.type!r} is not supported: only text parts are",
                        f"messages[{i}].content[{j}].type",
                    )
                texts.append(part.text)
            content = "\n".join(texts)
        d = {"role": m.role, "content": content or ""}
        if m.name:
            d["name"] = m.name
        if m.reasoning_content:
            d["reasoning_content"] = m.reasoning_content
        if m.tool_calls:
            if m.role != "assistant":
                raise bad_request("only assistant messages carry tool_calls", f"messages[{i}].tool_calls")
            d["tool_calls"] = [_template_tool_call(c) for c in m.tool_calls]
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def _template_tool_call(call) -> dict:
    """A tool call as HF chat templates read it: arguments as an object (transformers' convention;
    vLLM does the same), kept as the string when it is not a JSON object."""
    try:
        args = json.loads(call.function.arguments)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the decoder allows
        args = None
    if not isinstance(args, dict):
        args = call.function.arguments
    return {"id": call.id, "type": call.type, "function": {"name": call.function.name, "arguments": args}}


@dataclass(frozen=True)
class PreparedChat:
    """A validated, rendered chat request: what the engine is asked for and how to answer."""

    model: str  # the served name to echo back
    request_id: str
    prompt_ids: list[int]
    jobs: list[Job]  # one per choice
    parse_tools: bool  # whether the output is parsed for tool calls


class OpenAIServingChat:
    def __init__(
        self,
        engine: EngineClient,
        served_model_names: list[str],
        chat_template: str | None = None,
        reasoning_parser_cls=None,
        allow_request_chat_template: bool = False,
        tool_parser_cls=None,
    ):
        self.engine = engine
        self.served_model_names = served_model_names
        self.chat_template = chat_template
        self.reasoning_parser_cls = reasoning_parser_cls
        self.allow_request_chat_template = allow_request_chat_template
        self.tool_parser_cls = tool_parser_cls

    def _check_unsupported(self, req: ChatCompletionRequest) -> None:
        if req.response_format is not None and req.response_format.type != "text":
            raise bad_request(
                f"response_format {req.response_format.type!r} is not supported yet (structured outputs); "
                "use 'text'",
                "response_format",
            )
        check_prompt_logprobs(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs requires logprobs=true", "top_logprobs")
        self.check_request_template(req.chat_template)
        if req.stream_options is not None and not req.stream:
            raise bad_request("stream_options is only allowed with stream=true", "stream_options")

    def check_request_template(self, chat_template: str | None) -> None:
        if chat_template is not None and not self.allow_request_chat_template:
            raise bad_request(
                "request-supplied chat templates are disabled; start the server with "
                "--trust-request-chat-template to allow them",
                "chat_template",
            )

    def render(self, req: ChatCompletionRequest) -> tuple[str, list[int]]:
        """The prompt text and ids the template produces for these messages."""
        tok = self.engine.tokenizer
        kwargs = dict(req.chat_template_kwargs or {})
        for reserved in ("messages", "add_generation_prompt", "chat_template", "tokenize", "tools"):
            if reserved in kwargs:
                hint = ": send them in the request's tools field" if reserved == "tools" else ""
                raise bad_request(
                    f"chat_template_kwargs may not set {reserved!r}{hint}", "chat_template_kwargs"
                )
        if req.continue_final_message and req.add_generation_prompt:
            raise bad_request(
                "continue_final_message needs add_generation_prompt=false", "continue_final_message"
            )
        try:
            rendered = tok.apply_chat_template(
                messages_to_dicts(req.messages),
                add_generation_prompt=req.add_generation_prompt,
                chat_template=req.chat_template or self.chat_template,
                **({"tools": [t.model_dump(exclude_none=True) for t in req.tools]} if req.tools else {}),
                **kwargs,
            )
        except RenderLimitError as e:
            raise bad_request(str(e), "chat_template") from None
        except Exception as e:
            if hasattr(e, "status"):
                raise
            raise bad_request(f"the chat template failed on these messages: {e}", "messages") from None
        if isinstance(rendered, list):
            return tok.decode(rendered), list(rendered)
        # The template writes the special tokens (BOS, role markers) itself.
        return rendered, encode(tok, rendered, add_special_tokens=False)

    async def prepare(self, req: ChatCompletionRequest, request_id: str | None = None) -> PreparedChat:
        model = check_model(req.model, self.served_model_names)
        check_generative(self.engine, "/v1/chat/completions")
        self._check_unsupported(req)
        parse_tools = parses_tool_calls(req, self.tool_parser_cls)
        prompt, prompt_ids = await off_loop(self.render, req)
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = check_prompt(prompt_ids, limit, self.engine.model_config, param, "messages")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = build_params(
            req, self.engine.tokenizer, max_tokens, logprobs, prompt_logprobs=req.prompt_logprobs
        )
        check_logit_bias_vocab(params, self.engine.model_config)
        rid = request_id or req.request_id or random_id("chatcmpl")
        jobs = fan_out(rid, [(prompt, prompt_ids)], params, req.n)
        return PreparedChat(model, rid, prompt_ids, jobs, parse_tools)

    async def create_chat_completion(self, req: ChatCompletionRequest, request_id: str | None = None):
        """A ChatCompletionResponse, or (stream=True) an async iterator of SSE strings."""
        p = await self.prepare(req, request_id)
        if req.stream:
            return self._stream(req, p.model, p.request_id, p.prompt_ids, p.jobs, p.parse_tools)
        return await self._full(req, p.model, p.request_id, p.prompt_ids, p.jobs, p.parse_tools)

    def _splitter(self, req, parse_tools: bool) -> OutputSplitter:
        """One choice's output splitter; it parses tool calls only when the request asked for that."""
        return OutputSplitter(
            self.reasoning_parser_cls,
            self.tool_parser_cls if parse_tools else None,
            parallel_tool_calls=req.parallel_tool_calls is not False,
        )

    def _logprobs(self, entries, token_ids) -> ChatLogprobs:
        content = [
            ChatTokenLogprob(
                token=text,
                logprob=logprob,
                bytes=list(text.encode()),
                top_logprobs=[TopLogprob(token=t, logprob=v, bytes=list(t.encode())) for t, v in tops],
            )
            for text, logprob, tops in logprob_rows(self.engine.tokenizer, entries, token_ids)
        ]
        return ChatLogprobs(content=content)

    async def _full(self, req, model, rid, prompt_ids, jobs, parse_tools=False) -> ChatCompletionResponse:
        finals = await final_outputs(self.engine, jobs)
        choices, completion_tokens, cached = [], 0, 0
        for index in sorted(finals):
            _, out = finals[index]
            comp = out.outputs[0]
            completion_tokens += len(comp.token_ids)
            cached = max(cached, out.num_cached_tokens)
            split = self._splitter(req, parse_tools).split(comp.text)
            lps = None
            if req.logprobs and comp.logprobs is not None:
                lps = self._logprobs(comp.logprobs, comp.token_ids)
            message = ChatResponseMessage(
                content=split.content,
                reasoning_content=split.reasoning,
                tool_calls=split.tool_calls or None,
            )
            choices.append(
                ChatChoice(
                    index=index,
                    message=message,
                    logprobs=lps,
                    finish_reason=_finish_reason(comp.finish_reason, split.tool_calls),
                    stop_reason=comp.stop_reason,
                    token_ids=list(comp.token_ids) if req.return_token_ids else None,
                )
            )
        usage = make_usage({0: len(prompt_ids)}, {0: cached}, completion_tokens)
        return ChatCompletionResponse(
            id=rid,
            model=model,
            choices=choices,
            usage=usage,
            prompt_token_ids=prompt_ids if req.return_token_ids else None,
            prompt_logprobs=prompt_logprobs_out(
                self.engine.tokenizer, finals[min(finals)][1].prompt_logprobs
            ),
        )

    async def _stream(self, req, model, rid, prompt_ids, jobs, parse_tools=False) -> AsyncIterator[str]:
        if parse_tools:
            parsers = {j.index: self._splitter(req, True) for j in jobs}
        elif self.reasoning_parser_cls:
            parsers = {j.index: self.reasoning_parser_cls() for j in jobs}
        else:
            parsers = {}
        completion_tokens, cached = 0, 0
        writer = ChunkWriter(rid, "chat.completion.chunk", model)
        try:
            for job in jobs:  # OpenAI opens every choice with a role-only delta
                yield writer.chunk([chat_choice(job.index, chat_delta(role="assistant", content=""))])
            async for job, out in merge_jobs(self.engine, jobs):
                comp = out.outputs[0]
                new_ids = list(comp.delta_token_ids)
                completion_tokens += len(new_ids)
                reasoning, content, calls = None, comp.delta_text, []
                if parsers:  # a splitter or a reasoning parser: both return a ParsedOutput
                    split = parsers[job.index].feed(comp.delta_text, final=out.finished)
                    reasoning, content, calls = split.reasoning or None, split.content, split.tool_calls
                lps = None
                if req.logprobs and comp.logprobs is not None and new_ids:
                    lps = self._logprobs(comp.logprobs, new_ids)
                if out.finished:
                    cached = max(cached, out.num_cached_tokens)
                elif not content and not reasoning and lps is None:
                    continue
                delta = chat_delta(content=content or None, reasoning_content=reasoning)
                if calls:  # the last text, then the calls (each whole, with its index), then the finish
                    if content or reasoning:
                        yield writer.chunk([chat_choice(job.index, delta)])
                    calls_delta = chat_delta(tool_calls=_delta_calls(calls))
                    yield writer.chunk([chat_choice(job.index, calls_delta)])
                    delta = chat_delta()
                finish = _finish_reason(comp.finish_reason, calls) if out.finished else None
                ids = new_ids if req.return_token_ids else None
                yield writer.chunk([chat_choice(job.index, delta, lps, finish, ids)])
            if req.stream_options and req.stream_options.include_usage:
                usage = make_usage({0: len(prompt_ids)}, {0: cached}, completion_tokens)
                yield writer.chunk([], usage)
        except Exception as e:
            yield stream_error(e, "chat", rid)
        yield SSE_DONE


def _finish_reason(engine_reason: str | None, tool_calls) -> str | None:
    """The choice's finish_reason: "tool_calls" when the model stopped after calling tools; a cut-off
    ("length") or aborted output keeps its reason (the calls parsed from it are still returned)."""
    return "tool_calls" if tool_calls and engine_reason == "stop" else engine_reason


def _delta_calls(calls) -> list[DeltaToolCall]:
    return [
        DeltaToolCall(index=k, id=c.id, type="function", function=c.function.model_dump())
        for k, c in enumerate(calls)
    ]
