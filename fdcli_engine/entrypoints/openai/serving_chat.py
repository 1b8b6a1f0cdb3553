"""POST /v1/chat/completions, framework-free: messages → chat template → engine → response or SSE."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fdcli_engine.entrypoints.openai.beam_jobs import beam_params
from fdcli_engine.entrypoints.openai.chat_images import (
    OTHER_MEDIA_PARTS,
    ImageInputs,
    check_truncation,
    image_refs,
    other_media_error,
    part_image_url,
)
from fdcli_engine.entrypoints.openai.echo_logprobs import (
    check_logit_bias_vocab,
    check_logprob_limits,
    check_prompt_logprobs,
    prompt_logprobs_out,
)
from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.fastdeploy_fields import (
    apply_chat_metadata,
    check_logprob_post_processing,
    prompt_text,
)
from fdcli_engine.entrypoints.openai.loop_prompts import chat_on_loop
from fdcli_engine.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    ChatTokenLogprob,
    TopLogprob,
)
from fdcli_engine.entrypoints.openai.reasoning import check_budget_has_parser, reasoning_markers
from fdcli_engine.entrypoints.openai.serving_common import (
    SSE_DONE,
    EngineClient,
    Job,
    batch_deltas,
    build_params,
    check_generative,
    check_model,
    check_prompt,
    chunk_usage,
    encode,
    fan_out,
    final_outputs,
    logprob_rows,
    make_usage,
    merge_jobs,
    off_loop,
    random_id,
    stream_error,
    stream_usage,
    tokens_as_ids,
    truncate_prompt,
)
from fdcli_engine.entrypoints.openai.serving_tools import (
    OutputSplitter,
    tool_call_parser,
    tool_choice_constraint,
    tools_in_system_prompt,
)
from fdcli_engine.entrypoints.openai.stream_chunks import (
    ChunkWriter,
    chat_choice,
    chat_delta,
    with_token_fields,
)
from fdcli_engine.entrypoints.openai.structured_outputs import StructuredOutputs
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.multimodal.content_parts import IMAGE_URL_PARTS, TEXT_PARTS
from fdcli_engine.reasoning_budget import reasoning_token_count
from fdcli_engine.tokenizer.chat_render import render_chat


def template_kwargs(req: ChatCompletionRequest) -> dict:
    """The chat template's extra variables, as vLLM's ChatCompletionRequest.build_chat_params makes
    them: chat_template_kwargs, then `documents` (RAG) and `reasoning_effort` over them, and
    `enable_thinking` from reasoning_effort where chat_template_kwargs leaves it unset (templates such
    as Gemma's and Qwen3's read it; "none" turns thinking off)."""
    kwargs = dict(req.chat_template_kwargs or {})
    if req.documents is not None:
        kwargs["documents"] = req.documents
    if req.reasoning_effort is not None:
        kwargs["reasoning_effort"] = req.reasoning_effort
        kwargs.setdefault("enable_thinking", req.reasoning_effort != "none")
    return kwargs


def messages_to_dicts(messages) -> list[dict]:
    """Plain dicts for the template. Text parts are joined with newlines; a message with image_url
    parts keeps its parts as a list, each image as {"type": "image"} (what HF chat templates read);
    any other part type is a 400."""
    out = []
    for i, m in enumerate(messages):
        if "content" not in m.model_fields_set and not m.tool_calls:
            # Only an assistant message that calls tools may leave content out (as in OpenAI's API).
            raise bad_request(f"messages[{i}].content: Field required", f"messages[{i}].content")
        content = m.content
        if isinstance(content, list):
            content = _template_parts(content, i)
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


def _template_parts(parts, i: int) -> str | list[dict]:
    """A content list as the template reads it: the joined text, or (with images) the list of parts."""
    texts, has_image = [], False
    for j, part in enumerate(parts):
        if part.type in IMAGE_URL_PARTS:
            part_image_url(part, f"messages[{i}].content[{j}]")
            has_image = True
        elif part.type in OTHER_MEDIA_PARTS:
            raise other_media_error(part.type, f"messages[{i}].content[{j}]")
        elif part.type not in TEXT_PARTS or part.text is None:
            raise bad_request(
                f"content part type {part.type!r} is not supported: use text or image_url parts",
                f"messages[{i}].content[{j}].type",
            )
        else:
            texts.append(part.text)
    if not has_image:
        return "\n".join(texts)
    return [
        {"type": "image"} if p.type in IMAGE_URL_PARTS else {"type": "text", "text": p.text} for p in parts
    ]


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
    prompt: str | None  # the rendered prompt (None: given as token ids)
    jobs: list[Job]  # one per choice
    tool_parser: object | None  # what reads tool calls from the output (serving_tools.tool_call_parser)


class OpenAIServingChat:
    def __init__(
        self,
        engine: EngineClient,
        served_model_names: list[str],
        chat_template: str | None = None,
        reasoning_parser_cls=None,
        allow_request_chat_template: bool = False,
        tool_parser_cls=None,
        structured_outputs: StructuredOutputs | None = None,
        images: ImageInputs | None = None,
        tokens_as_ids: bool = False,
        response_role: str = "assistant",
        force_include_usage: bool = False,
    ):
        self.engine = engine
        self.response_role = response_role  # vLLM's --response-role (fd run-batch): see role_of
        self.tokens_as_ids = tokens_as_ids  # --return-tokens-as-token-ids: the requests' default
        self.force_include_usage = force_include_usage  # --enable-force-include-usage: streams end with usage
        # Image parts: the media policy, the per-request limit and the model's processor.
        self.images = images or ImageInputs(engine)
        # The grammar checks, shared with completions when build_serving passes them.
        self.structured_outputs = structured_outputs or StructuredOutputs(engine)
        self.served_model_names = served_model_names
        self.chat_template = chat_template
        self.reasoning_parser_cls = reasoning_parser_cls
        self.allow_request_chat_template = allow_request_chat_template
        self.tool_parser_cls = tool_parser_cls

    def role_of(self, req: ChatCompletionRequest) -> str:
        """The role of the answer's message, as vLLM decides it: --response-role when the prompt asks
        for a new turn (add_generation_prompt), else the role of the last message, which it continues."""
        return req.messages[-1].role if req.messages and not req.add_generation_prompt else self.response_role

    def echo_text(self, req: ChatCompletionRequest) -> str:
        """vLLM's chat `echo`: the last message's text (text parts joined by newlines) when the answer
        is in that message's role (role_of), else nothing."""
        if not req.echo or not req.messages or req.messages[-1].role != self.role_of(req):
            return ""
        content = req.messages[-1].content
        if isinstance(content, list):
            return "\n".join(p.text for p in content if p.type == "text" and p.text)
        return content or ""

    def _check_unsupported(self, req: ChatCompletionRequest) -> None:
        check_prompt_logprobs(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs requires logprobs=true", "top_logprobs")
        self.check_request_template(req.chat_template)
        if req.stream_options is not None and not req.stream:
            raise bad_request("stream_options is only allowed with stream=true", "stream_options")
        if not req.messages and req.prompt_token_ids is None:
            raise bad_request(
                "messages: List should have at least 1 item after validation, not 0", "messages"
            )

    def check_request_template(self, chat_template: str | None) -> None:
        if chat_template is not None and not self.allow_request_chat_template:
            raise bad_request(
                "request-supplied chat templates are disabled; start the server with "
                "--trust-request-chat-template to allow them",
                "chat_template",
            )

    def render(self, req: ChatCompletionRequest, tool_parser=None) -> tuple[str, list[int]]:
        """The prompt text and ids the template produces for these messages (tokenizer/chat_render.py:
        the rule the offline LLM.chat follows too)."""
        tok = self.engine.tokenizer
        kwargs = template_kwargs(req)

        def tools_to_system(messages: list[dict], tools: list[dict]) -> list[dict]:
            parser = tool_parser
            if parser is None and req.tool_choice in (None, "auto") and self.tool_parser_cls:
                parser = self.tool_parser_cls()  # /tokenize: count what a chat request renders
            return tools_in_system_prompt(messages, tools, parser)

        try:
            rendered, ids = render_chat(
                tok,
                messages_to_dicts(req.messages),
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template=req.chat_template or self.chat_template,
                chat_template_kwargs=kwargs,
                tools=[t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None,
                tools_to_system=tools_to_system,
            )
        except InvalidRequestError as e:
            raise bad_request(str(e), e.param) from None
        if ids is not None:
            return rendered, ids
        # The template writes the special tokens (BOS, role markers) itself; vLLM's add_special_tokens
        # (chat requests only) adds the tokenizer's own as well.
        return rendered, encode(tok, rendered, add_special_tokens=req.add_special_tokens)

    def _prompt(self, req: ChatCompletionRequest, tool_parser=None) -> tuple[str | None, list[int]]:
        """The prompt (text or None, ids), with FastDeploy's completion_token_ids (a resumed answer's ids)
        after it: those ids are the prompt's end, so the text is then None (the ids' text is theirs)."""
        text, ids = self._prompt_of_messages(req, tool_parser)
        if req.completion_token_ids:
            return None, ids + list(req.completion_token_ids)
        return text, ids

    def _prompt_of_messages(
        self, req: ChatCompletionRequest, tool_parser=None
    ) -> tuple[str | None, list[int]]:
        """The prompt (text or None, ids): FastDeploy's prompt_token_ids replace the messages, its
        disable_chat_template takes the first message's content as the raw prompt; else the template's."""
        if req.prompt_token_ids is not None:
            return None, list(req.prompt_token_ids)
        if req.disable_chat_template:
            text = messages_to_dicts(req.messages[:1])[0]["content"]
            if not isinstance(text, str):
                raise bad_request(
                    "disable_chat_template takes a text message; images need the template", "messages"
                )
            return text, encode(self.engine.tokenizer, text)
        return self.render(req, tool_parser)

    async def prepare(self, req: ChatCompletionRequest, request_id: str | None = None) -> PreparedChat:
        model = check_model(req.model, self.served_model_names)
        check_generative(self.engine, "/v1/chat/completions")
        # --- tools: tool_choice "required" / named is forced by a grammar (serving_tools.py) ---
        tool_constraint = tool_choice_constraint(req)
        # --- end tools ---
        apply_chat_metadata(req)
        self._check_unsupported(req)
        tool_parser = tool_call_parser(req, self.tool_parser_cls)
        refs = image_refs(req.messages)
        if refs and (req.prompt_token_ids is not None or req.disable_chat_template):
            raise bad_request(
                "image parts need the chat template and the messages' own prompt", refs[0].param
            )
        images = await self.images.load(refs)  # each checked, then the model (a 400 naming the part)
        if chat_on_loop(req, images):
            prompt, prompt_ids = self._prompt(req, tool_parser)
        else:
            prompt, prompt_ids = await off_loop(self._prompt, req, tool_parser)
        features = None
        if images:
            prompt_ids, features = await off_loop(
                self.images.expand, prompt_ids, images, req.mm_processor_kwargs, refs[0].param
            )
        rendered_len = len(prompt_ids)
        prompt_ids = truncate_prompt(
            prompt_ids, req.truncate_prompt_tokens, self.engine.model_config.max_model_len
        )
        check_truncation(rendered_len, len(prompt_ids), bool(features))
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = check_prompt(prompt_ids, limit, self.engine.model_config, param, "messages")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        defaults = self.engine.model_config.default_sampling_params
        params = build_params(
            req, self.engine.tokenizer, max_tokens, logprobs, defaults, prompt_logprobs=req.prompt_logprobs
        )
        if tool_parser is not None:
            # vLLM's rule while tools are on: keep special tokens in the text, since many tokenizers
            # mark a tool call's tags special (Mistral's [TOOL_CALLS], Jamba's <tool_calls>, Hermes
            # models' <tool_call>) and the parser must see them.
            params.skip_special_tokens = False
        if self.reasoning_parser_cls is not None and self.reasoning_parser_cls.keeps_special_tokens:
            # The reasoning tags are special tokens (Mistral's [THINK]): decoding must keep them for
            # the parser to split the reasoning out.
            params.skip_special_tokens = False
        check_logit_bias_vocab(params, self.engine.model_config)
        check_logprob_limits(params, self.engine.model_config, chat=True)
        check_logprob_post_processing(req, params)
        params.reasoning_markers = self._reasoning_markers(prompt, req.chat_template)
        check_budget_has_parser(req, self.reasoning_parser_cls)
        # A constraint starts after the reasoning block (vLLM's behaviour); from the first token when
        # no reasoning is coming.
        start_after = [] if params.reasoning_markers is None else list(params.reasoning_markers.end)
        params.structured_outputs = await self.structured_outputs.params_for(req, start_after)
        if tool_constraint is not None:  # tools: the forced tool choice's grammar
            tool_constraint.start_after_token_ids = start_after
            await self.structured_outputs.check_tools(tool_constraint)
            params.structured_outputs = tool_constraint
        rid = request_id or req.request_id or random_id("chatcmpl")
        jobs = fan_out(rid, [(prompt, prompt_ids)], params, req.n, features)
        beam = beam_params(req, max_tokens, self.engine.model_config.max_logprobs)
        if beam is not None and features:
            raise bad_request("use_beam_search takes text messages, not images", "use_beam_search")
        for job in jobs:
            job.beam = beam
        return PreparedChat(model, rid, prompt_ids, prompt, jobs, tool_parser)

    async def create_chat_completion(self, req: ChatCompletionRequest, request_id: str | None = None):
        """A ChatCompletionResponse, or (stream=True) an async iterator of SSE strings."""
        p = await self.prepare(req, request_id)
        if req.stream:
            return self._stream(req, p)
        return await self._full(req, p)

    def _reasoning_markers(self, prompt: str | None, request_template: str | None):
        """Where the reasoning block will lie in the output (reasoning.reasoning_markers)."""
        template = (
            request_template or self.chat_template or getattr(self.engine.tokenizer, "chat_template", None)
        )
        tok = self.engine.tokenizer
        return reasoning_markers(self.reasoning_parser_cls, lambda t: encode(tok, t, False), prompt, template)

    @staticmethod
    def reasoning_tokens(p: PreparedChat, token_ids) -> int:
        """A choice's tokens inside its reasoning block (reasoning_budget.py)."""
        markers = p.jobs[0].params.reasoning_markers
        return 0 if markers is None else reasoning_token_count(list(token_ids), markers)

    def _details(self, reasoning_tokens: int) -> int | None:
        """usage.completion_tokens_details.reasoning_tokens, as vLLM reports it under a reasoning parser."""
        return reasoning_tokens if self.reasoning_parser_cls is not None else None

    def _splitter(self, req, tool_parser) -> OutputSplitter:
        """One choice's output splitter; it parses tool calls only when the request asked for that."""
        return OutputSplitter(
            self.reasoning_parser_cls, tool_parser, parallel_tool_calls=req.parallel_tool_calls is not False
        )

    def _logprobs(self, req, entries, token_ids) -> ChatLogprobs:
        """OpenAI's chat logprobs: exactly `num_top` alternatives per position, best first. The engine's
        entry is the sampled token followed by the top k, so it holds k + 1 tokens when the sampled one
        is not among the top k: that one stays in `logprob` and is not an alternative."""
        content, num_top = [], req.top_logprobs or 0
        as_ids = tokens_as_ids(req, self.tokens_as_ids)
        for text, logprob, tops in logprob_rows(self.engine.tokenizer, entries, token_ids, as_ids):
            best = sorted(tops, key=lambda t: -t[1])[:num_top]
            content.append(
                ChatTokenLogprob(
                    token=text,
                    logprob=logprob,
                    bytes=list(text.encode()),
                    top_logprobs=[TopLogprob(token=t, logprob=v, bytes=list(t.encode())) for t, v in best],
                )
            )
        return ChatLogprobs(content=content)

    async def _full(self, req, p: PreparedChat) -> ChatCompletionResponse:
        prompt_ids, tool_parser = p.prompt_ids, p.tool_parser
        finals = await final_outputs(self.engine, p.jobs)
        ids = req.return_token_ids
        prompt = prompt_text(self.engine.tokenizer, p.prompt, prompt_ids) if ids else None
        choices, completion_tokens, cached = [], 0, 0
        reasoning_tokens = 0
        echo = self.echo_text(req)
        for index in sorted(finals):
            _, out = finals[index]
            comp = out.outputs[0]
            completion_tokens += len(comp.token_ids)
            reasoning_tokens += self.reasoning_tokens(p, comp.token_ids)
            cached = max(cached, out.num_cached_tokens)
            split = self._splitter(req, tool_parser).split(comp.text)
            lps = None
            if req.logprobs and comp.logprobs is not None:
                lps = self._logprobs(req, comp.logprobs, comp.token_ids)
            message = ChatResponseMessage(
                role=self.role_of(req),
                content=echo + (split.content or "") if echo else split.content,
                reasoning_content=split.reasoning,
                tool_calls=split.tool_calls or None,
                # FastDeploy's return_token_ids fields; completion_tokens: the raw output, unparsed.
                prompt_token_ids=prompt_ids if ids else None,
                completion_token_ids=list(comp.token_ids) if ids else None,
                prompt_tokens=prompt,
                completion_tokens=comp.text if ids else None,
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
        usage = make_usage(
            {0: len(prompt_ids)}, {0: cached}, completion_tokens, self._details(reasoning_tokens)
        )
        return ChatCompletionResponse(
            id=p.request_id,
            model=p.model,
            choices=choices,
            usage=usage,
            prompt_token_ids=prompt_ids if req.return_token_ids else None,
            prompt_logprobs=prompt_logprobs_out(
                self.engine.tokenizer, finals[min(finals)][1].prompt_logprobs
            ),
        )

    async def _stream(self, req, p: PreparedChat) -> AsyncIterator[str]:
        rid, prompt_ids, jobs, tool_parser = p.request_id, p.prompt_ids, p.jobs, p.tool_parser
        if tool_parser is not None:
            parsers = {j.index: self._splitter(req, tool_parser) for j in jobs}
        elif self.reasoning_parser_cls:
            parsers = {j.index: self.reasoning_parser_cls() for j in jobs}
        else:
            parsers = {}
        completion_tokens, cached = 0, 0
        generated: dict[int, int] = {}  # tokens per choice so far; a choice's key: its role chunk is out
        output_ids: dict[int, list[int]] = {}  # each choice's ids, for its reasoning tokens
        include_usage, continuous = stream_usage(req, self.force_include_usage)
        writer = ChunkWriter(rid, "chat.completion.chunk", p.model)
        echo = self.echo_text(req)
        prompt = prompt_text(self.engine.tokenizer, p.prompt, prompt_ids) if req.return_token_ids else None

        def usage_of(index: int):  # every chunk's usage under continuous_usage_stats, else none
            return chunk_usage(len(prompt_ids), generated[index]) if continuous else None

        try:
            outputs = batch_deltas(merge_jobs(self.engine, jobs), req.max_streaming_response_tokens)
            async for job, out in outputs:
                if job.index not in generated:
                    # OpenAI opens every choice with a role-only delta; sent with the choice's first
                    # output, after prefill (as vLLM), so clients measure time to first token honestly.
                    generated[job.index] = 0
                    role = chat_delta(role=self.role_of(req), content="")
                    if req.return_token_ids:  # FastDeploy's: the prompt rides on the role delta
                        role = with_token_fields(role, prompt_token_ids=prompt_ids, prompt_tokens=prompt)
                    yield writer.chunk([chat_choice(job.index, role)], usage_of(job.index))
                    if echo:
                        yield writer.chunk(
                            [chat_choice(job.index, chat_delta(content=echo))], usage_of(job.index)
                        )
                comp = out.outputs[0]
                new_ids = list(comp.delta_token_ids)
                completion_tokens += len(new_ids)
                generated[job.index] += len(new_ids)
                if self.reasoning_parser_cls is not None:
                    output_ids.setdefault(job.index, []).extend(new_ids)
                reasoning, content, calls, call_parts = None, comp.delta_text, [], []
                if parsers:  # a splitter or a reasoning parser: both return a ParsedOutput
                    split = parsers[job.index].feed(comp.delta_text, final=out.finished)
                    reasoning, content, calls = split.reasoning or None, split.content, split.tool_calls
                    call_parts = split.call_deltas
                lps = None
                if req.logprobs and comp.logprobs is not None and new_ids:
                    lps = self._logprobs(req, comp.logprobs, new_ids)
                if out.finished:
                    cached = max(cached, out.num_cached_tokens)
                elif not content and not reasoning and lps is None and not call_parts:
                    if not (req.return_token_ids and new_ids):  # ids without text still go out
                        continue
                # The text, then each tool-call part in its own chunk (as OpenAI sends them), then
                # the finish in a chunk of its own after calls; logprobs, token ids and the finish
                # ride on the last chunk.
                text = chat_delta(content=content or None, reasoning_content=reasoning or None)
                deltas = [text] if text else []
                deltas += [chat_delta(tool_calls=[part]) for part in call_parts]
                if not deltas or (out.finished and call_parts):
                    deltas.append(chat_delta())
                finish = _finish_reason(comp.finish_reason, calls) if out.finished else None
                ids = new_ids if req.return_token_ids else None
                if ids is not None:  # FastDeploy's: the new ids and their raw text, on the last delta
                    deltas[-1] = with_token_fields(
                        deltas[-1], completion_token_ids=ids, completion_tokens=comp.delta_text
                    )
                for k, delta in enumerate(deltas):
                    last = k == len(deltas) - 1
                    choice = chat_choice(
                        job.index,
                        delta,
                        lps if last else None,
                        finish if last else None,
                        ids if last else None,
                    )
                    yield writer.chunk([choice], usage_of(job.index))
            if include_usage:
                reasoning_tokens = sum(self.reasoning_tokens(p, ids) for ids in output_ids.values())
                details = self._details(reasoning_tokens)
                usage = make_usage({0: len(prompt_ids)}, {0: cached}, completion_tokens, details)
                yield writer.chunk([], usage)
        except Exception as e:
            yield stream_error(e, "chat", rid)
        yield SSE_DONE


def _finish_reason(engine_reason: str | None, tool_calls) -> str | None:
    """The choice's finish_reason: "tool_calls" when the model stopped after calling tools; a cut-off
    ("length") or aborted output keeps its reason (the calls parsed from it are still returned)."""
    return "tool_calls" if tool_calls and engine_reason == "stop" else engine_reason
