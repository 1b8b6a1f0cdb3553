"""POST /v1/completions, framework-free: request model in, response model or SSE chunks out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from fdcli_engine.entrypoints.openai.beam_jobs import beam_params
from fdcli_engine.entrypoints.openai.echo_logprobs import (
    check_logit_bias_vocab,
    check_logprob_limits,
    check_prompt_logprobs,
    echo_logprobs,
    prompt_logprobs_out,
)
from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.fastdeploy_fields import (
    apply_completion_suffix_options,
    check_logprob_post_processing,
    prompt_text,
)
from fdcli_engine.entrypoints.openai.loop_prompts import prepared_on_loop
from fdcli_engine.entrypoints.openai.protocol import CompletionChoice, CompletionRequest, CompletionResponse
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
    completion_logprobs,
    encode,
    fan_out,
    final_outputs,
    make_usage,
    merge_jobs,
    off_loop,
    random_id,
    stream_error,
    stream_usage,
    tokens_as_ids,
    truncate_prompt,
)
from fdcli_engine.entrypoints.openai.stream_chunks import ChunkWriter, completion_choice
from fdcli_engine.entrypoints.openai.structured_outputs import StructuredOutputs


@dataclass(frozen=True)
class PreparedCompletion:
    """A validated, tokenized completion request."""

    model: str  # the served name to echo back
    request_id: str
    prompts: list[tuple[str | None, list[int]]]  # (text or None for token ids, token ids) per prompt
    jobs: list[Job]  # n per prompt, each with its own max_tokens


class OpenAIServingCompletion:
    def __init__(
        self,
        engine: EngineClient,
        served_model_names: list[str],
        structured_outputs: StructuredOutputs | None = None,
        tokens_as_ids: bool = False,
        force_include_usage: bool = False,
        reasoning_parser_cls=None,
        chat_template: str | None = None,
    ):
        self.engine = engine
        self.served_model_names = served_model_names
        self.tokens_as_ids = tokens_as_ids  # --return-tokens-as-token-ids: the requests' default
        self.force_include_usage = force_include_usage  # --enable-force-include-usage: streams end with usage
        # A completion's text is not split into reasoning and content, so a constraint starts at the
        # first generated token; the reasoning parser (and the template saying whether the model
        # thinks) only place the block for vLLM's thinking_token_budget.
        self.structured_outputs = structured_outputs or StructuredOutputs(engine)
        self.reasoning_parser_cls = reasoning_parser_cls
        self.chat_template = chat_template

    def _check_unsupported(self, req: CompletionRequest) -> None:
        apply_completion_suffix_options(req)
        if req.suffix:
            raise bad_request("suffix is not supported", "suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise bad_request("best_of must equal n (fd does not rank candidates)", "best_of")
        check_prompt_logprobs(req)
        if req.max_tokens == 0 and not req.echo:
            raise bad_request(
                "max_tokens must be at least 1 (0 is allowed only with echo=true)", "max_tokens"
            )
        if req.stream_options is not None and not req.stream:
            raise bad_request("stream_options is only allowed with stream=true", "stream_options")

    def _prompts(self, req: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        """(text, ids) per prompt; (None, ids) for a prompt given as token ids (FastDeploy's
        prompt_token_ids replace `prompt`)."""
        p = req.prompt if req.prompt_token_ids is None else req.prompt_token_ids
        texts = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else p
        prompts = [
            (t, encode(self.engine.tokenizer, t)) if isinstance(t, str) else (None, list(t)) for t in texts
        ]
        # vLLM's truncate_prompt_tokens: the last k tokens; the echoed text is then that of the ids.
        keep, max_len = req.truncate_prompt_tokens, self.engine.model_config.max_model_len
        return (
            prompts if keep is None else [(None, truncate_prompt(ids, keep, max_len)) for _, ids in prompts]
        )

    async def prepare(self, req: CompletionRequest, request_id: str | None = None) -> PreparedCompletion:
        """Validate and tokenize."""
        model = check_model(req.model, self.served_model_names)
        check_generative(self.engine, "/v1/completions")
        self._check_unsupported(req)
        # Token ids and one short text on the loop, anything else on a prepare worker (loop_prompts.py).
        on_loop = prepared_on_loop(req.prompt)
        prompts = self._prompts(req) if on_loop else await off_loop(self._prompts, req)
        # echo with max_tokens=0 (vLLM's rule): one token is generated, and only the prompt is returned.
        wanted = 1 if echo_only(req) else req.max_tokens
        max_tokens = [check_prompt(ids, wanted, self.engine.model_config) for _, ids in prompts]
        # With max_tokens=None each prompt may fill its own room; the per-job value is set below.
        params = build_params(
            req,
            self.engine.tokenizer,
            min(max_tokens),
            req.logprobs,
            self.engine.model_config.default_sampling_params,
            prompt_logprobs=prompt_logprobs_of(req),
        )
        check_logit_bias_vocab(params, self.engine.model_config)
        check_logprob_limits(params, self.engine.model_config)
        check_logprob_post_processing(req, params)
        params.structured_outputs = await self.structured_outputs.params_for(req)
        rid = request_id or req.request_id or random_id("cmpl")
        jobs = fan_out(rid, prompts, params, req.n)
        check_budget_has_parser(req, self.reasoning_parser_cls)
        for job in jobs:
            job.params.max_tokens = max_tokens[job.prompt_idx]
            if job.params.reasoning_budget is not None:
                job.params.reasoning_markers = self._reasoning_markers(*prompts[job.prompt_idx])
            job.beam = beam_params(req, job.params.max_tokens, self.engine.model_config.max_logprobs)
        return PreparedCompletion(model, rid, prompts, jobs)

    def _reasoning_markers(self, text: str | None, ids: list[int]):
        """Where the reasoning block will lie in a prompt's output (reasoning.reasoning_markers)."""
        tok = self.engine.tokenizer
        return reasoning_markers(
            self.reasoning_parser_cls,
            lambda t: encode(tok, t, False),
            text if text is not None else prompt_text(tok, None, ids),
            self.chat_template or getattr(tok, "chat_template", None),
        )

    async def create_completion(self, req: CompletionRequest, request_id: str | None = None):
        """A CompletionResponse, or (stream=True) an async iterator of SSE strings."""
        p = await self.prepare(req, request_id)
        if req.stream:
            return self._stream(req, p.model, p.request_id, p.prompts, p.jobs)
        return await self._full(req, p.model, p.request_id, p.prompts, p.jobs)

    def _echo_text(self, prompts, prompt_idx: int) -> str:
        text, ids = prompts[prompt_idx]
        return text if text is not None else self.engine.tokenizer.decode(ids)

    def _prompt_tokens(self, prompts, prompt_idx: int) -> str:
        """FastDeploy's `prompt_tokens` of a prompt (return_token_ids)."""
        text, ids = prompts[prompt_idx]
        return prompt_text(self.engine.tokenizer, text, ids)

    async def _full(self, req, model, rid, prompts, jobs) -> CompletionResponse:
        finals = await final_outputs(self.engine, jobs)
        choices, completion_tokens, cached = [], 0, {}
        tok = self.engine.tokenizer
        for index in sorted(finals):
            job, out = finals[index]
            comp = out.outputs[0]
            token_ids, text = ([], "") if echo_only(req) else (comp.token_ids, comp.text)
            completion_tokens += len(token_ids)
            cached[job.prompt_idx] = max(cached.get(job.prompt_idx, 0), out.num_cached_tokens)
            prefix = self._echo_text(prompts, job.prompt_idx) if req.echo else ""
            lps = self._logprobs(req, job, out, token_ids, 0)
            choices.append(
                CompletionChoice(
                    index=index,
                    text=prefix + text,
                    logprobs=lps,
                    prompt_logprobs=prompt_logprobs_out(tok, out.prompt_logprobs),
                    finish_reason=comp.finish_reason,
                    stop_reason=comp.stop_reason,
                    prompt_token_ids=job.prompt_ids if req.return_token_ids else None,
                    token_ids=list(token_ids) if req.return_token_ids else None,
                    # FastDeploy's return_token_ids fields (the generated text without the echo).
                    completion_token_ids=list(token_ids) if req.return_token_ids else None,
                    prompt_tokens=self._prompt_tokens(prompts, job.prompt_idx)
                    if req.return_token_ids
                    else None,
                    completion_tokens=text if req.return_token_ids else None,
                )
            )
        prompt_lens = {k: len(ids) for k, (_, ids) in enumerate(prompts)}
        usage = make_usage(prompt_lens, cached, completion_tokens)
        return CompletionResponse(id=rid, model=model, choices=choices, usage=usage)

    def _logprobs(self, req, job, out, token_ids, offset: int, with_prompt: bool = True):
        """The choice's legacy logprobs: the echoed prompt's (when `with_prompt`) then `token_ids`'."""
        comp, tok = out.outputs[0], self.engine.tokenizer
        if req.logprobs is None:
            return None
        as_ids = tokens_as_ids(req, self.tokens_as_ids)
        if req.echo and with_prompt and out.prompt_logprobs is not None:
            return echo_logprobs(
                tok, job.prompt_ids, out.prompt_logprobs, comp.logprobs or [], token_ids, as_ids
            )
        if comp.logprobs is None or not token_ids:
            return None
        return completion_logprobs(tok, comp.logprobs, token_ids, offset, as_ids)

    async def _stream(self, req, model, rid, prompts, jobs) -> AsyncIterator[str]:
        started: set[int] = set()
        offsets: dict[int, int] = {}
        cached: dict[int, int] = {}
        completion_tokens = 0
        generated: dict[int, int] = {}  # tokens per choice so far (continuous_usage_stats)
        include_usage, continuous = stream_usage(req, self.force_include_usage)
        writer = ChunkWriter(rid, "text_completion", model)
        # The request's constants, read once: the loop below runs once per streamed token.
        prompt_only, with_ids, with_lps = echo_only(req), req.return_token_ids, req.logprobs is not None
        try:
            outputs = batch_deltas(merge_jobs(self.engine, jobs), req.max_streaming_response_tokens)
            async for job, out in outputs:
                comp = out.outputs[0]
                text, new_ids = comp.delta_text, list(comp.delta_token_ids)
                if prompt_only:
                    text, new_ids = "", []
                first = job.index not in started
                generated_text = text
                if first:
                    started.add(job.index)
                    if req.echo:
                        text = self._echo_text(prompts, job.prompt_idx) + text
                completion_tokens += len(new_ids)
                generated[job.index] = generated.get(job.index, 0) + len(new_ids)
                if not text and not new_ids and not out.finished and not (first and with_ids):
                    continue
                lps = None
                if with_lps and (first or new_ids):
                    lps = self._logprobs(req, job, out, new_ids, offsets.get(job.index, 0), first)
                if lps is not None:
                    offsets[job.index] = offsets.get(job.index, 0) + sum(len(t) for t in lps.tokens)
                choice = completion_choice(
                    job.index,
                    text,
                    lps,
                    comp.finish_reason if out.finished else None,
                    comp.stop_reason if out.finished else None,
                    new_ids if with_ids else None,
                    # vLLM's and FastDeploy's: the prompt's ids (and FastDeploy's its text) come first.
                    job.prompt_ids if with_ids and first else None,
                    self._prompt_tokens(prompts, job.prompt_idx) if with_ids and first else None,
                    generated_text if with_ids else None,
                )
                if out.finished:
                    cached[job.prompt_idx] = max(cached.get(job.prompt_idx, 0), out.num_cached_tokens)
                usage = chunk_usage(len(job.prompt_ids), generated[job.index]) if continuous else None
                yield writer.chunk([choice], usage)
            if include_usage:
                prompt_lens = {k: len(ids) for k, (_, ids) in enumerate(prompts)}
                usage = make_usage(prompt_lens, cached, completion_tokens)
                yield writer.chunk([], usage)
        except Exception as e:
            yield stream_error(e, "completion", rid)
        yield SSE_DONE


def echo_only(req: CompletionRequest) -> bool:
    """echo with max_tokens=0: the response holds the prompt (and its logprobs) and nothing generated."""
    return req.echo and req.max_tokens == 0


def prompt_logprobs_of(req: CompletionRequest) -> int | None:
    """vLLM's rule: prompt_logprobs as asked, else with echo the legacy logprobs count."""
    if req.prompt_logprobs is not None:
        return req.prompt_logprobs
    return req.logprobs if req.echo else None
