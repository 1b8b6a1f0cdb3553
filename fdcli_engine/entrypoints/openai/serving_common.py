"""Shared pieces of the framework-free serving layer: request checks that depend on the model,
sampling-parameter building, `n` fan-out and logprob/usage formatting. The engine-client protocol
is api.protocol's, re-exported here.

Nothing here imports FastAPI: `fd run-batch` calls the same code in-process.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from fdcli_engine.api.protocol import EngineClient
from fdcli_engine.entrypoints.openai.errors import APIError, bad_request, from_exception
from fdcli_engine.entrypoints.openai.protocol import (
    CompletionLogprobs,
    CompletionTokensDetails,
    PromptTokensDetails,
    UsageInfo,
)
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.outputs import RequestOutput
from fdcli_engine.request_limits import check_request
from fdcli_engine.request_limits import truncate_limit as _truncate_limit
from fdcli_engine.sampling_params import RequestOutputKind, SamplingParams

__all__ = ["EngineClient"]
logger = logging.getLogger("fd.serve")

# Templating and tokenization run here, not on the event loop: a large prompt or a template that runs
# to its limit (chat_template.py) then delays only its own request, never /health or the streams (small
# prompts excepted: loop_prompts.py). A few threads: the work is mostly GIL-bound, and the admission cap
# bounds the queue.
_PREPARE_WORKERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fd-prepare")


async def off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on a prepare worker thread; its exception is raised here."""
    call = functools.partial(fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_PREPARE_WORKERS, call)


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_model(requested: str | None, served_names: list[str]) -> str:
    """The model name responses report: the first served name, whichever of them the request named (as
    vLLM: --served-model-name a b answers as a); an unknown name is a 404 (None: the first one)."""
    if requested is None or requested == "" or requested in served_names:
        return served_names[0]
    raise APIError(
        f"the model {requested!r} does not exist; this server serves {', '.join(served_names)}",
        404,
        param="model",
        code="model_not_found",
    )


# The routes a pooling server answers, by pooler task (the generation routes answer with this list).
POOLING_ROUTES = {
    "embed": "/v1/embeddings, /v1/score and /rerank",
    "classify": "/v1/classify, /v1/chat/reward, and /v1/score and /rerank for a one-label cross-encoder",
    "reward": "/v1/chat/reward",
    "process_reward": "/v1/chat/reward",
}


def check_generative(engine, route: str) -> None:
    """A 400 naming the pooling task and its routes when `route` (a generation route) reaches a server
    that runs a pooling model, before any template or prompt check could give a misleading error."""
    config = getattr(engine, "config", None)
    if config is None or getattr(config, "runner", None) != "pooling" or not config.pooler_config:
        return
    task = config.pooler_config.get("task", "embed")
    raise bad_request(
        f"{route} generates text, but this server runs a pooling model ({task}, --runner pooling); "
        f"it serves {POOLING_ROUTES.get(task, '/v1/embeddings')}",
        "model",
    )


def encode(tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    try:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    except TypeError:  # a tokenizer whose encode takes no such keyword
        return list(tokenizer.encode(text))


def check_prompt(
    ids: list[int],
    max_tokens: int | None,
    model_config,
    max_tokens_param: str = "max_tokens",
    prompt_param: str = "prompt",
    pooling: bool = False,
) -> int | None:
    """request_limits.check_request against the served model, its InvalidRequestError as a 400.
    Returns the tokens the request may generate (None for pooling): `max_tokens`, else the model's
    default max_tokens (generation_config.py), within the context's room."""
    try:
        return check_request(
            ids,
            max_tokens,
            max_model_len=model_config.max_model_len,
            vocab_size=model_config.vocab_size,
            pooling=pooling,
            prompt_param=prompt_param,
            max_tokens_param=max_tokens_param,
            default_max_tokens=None if pooling else model_config.default_sampling_params.get("max_tokens"),
        )
    except InvalidRequestError as e:
        raise bad_request(str(e), e.param, e.code) from None


def truncate_limit(keep: int | None, max_model_len: int, param: str = "truncate_prompt_tokens") -> int | None:
    """request_limits.truncate_limit, its error a 400."""
    try:
        return _truncate_limit(keep, max_model_len, param)
    except InvalidRequestError as e:
        raise bad_request(str(e), e.param) from None


def truncate_prompt(ids: list[int], keep: int | None, max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens on a generating request: the last `keep` tokens of the prompt
    (-1: the last max_model_len, which the length check then refuses for leaving no room to answer)."""
    limit = truncate_limit(keep, max_model_len)
    return ids if limit is None else ids[-limit:]


# The request fields that take the model's default when left out (generation_config.SAMPLING_KEYS;
# max_tokens is check_prompt's), and those that take SamplingParams' own.
MODEL_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
ENGINE_DEFAULT_FIELDS = ("presence_penalty", "frequency_penalty")


def build_params(
    req,
    tokenizer,
    max_tokens: int,
    logprobs: int | None,
    defaults: dict[str, Any],
    prompt_logprobs: int | None = None,
):
    """SamplingParams from a completion/chat request; engine-side validation failures become 400s.
    A streamed request gets DELTA outputs, any other one FINAL_ONLY (one output, the whole text).
    `max_tokens`: check_prompt's. `defaults`: the model's (ModelConfig.default_sampling_params), for
    each MODEL_DEFAULT_FIELDS field the request leaves out (None); a value it sets always wins."""
    stop = req.stop if isinstance(req.stop, list) else ([req.stop] if req.stop else [])
    values: dict[str, Any] = {
        "n": 1,
        "max_tokens": max_tokens,
        "min_tokens": req.min_tokens,
        "stop": stop,
        "stop_token_ids": list(req.stop_token_ids or []),
        "ignore_eos": req.ignore_eos,
        "logprobs": logprobs,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "skip_special_tokens": req.skip_special_tokens,
        "seed": req.seed,
        "bad_words": list(req.bad_words or []),
        "output_kind": RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY,
        # logit_bias / prompt_logprobs: checked by SamplingParams (the vocabulary: check_logit_bias).
        "logit_bias": req.logit_bias or None,
        "prompt_logprobs": prompt_logprobs,
        "cache_salt": getattr(req, "cache_salt", None),
        "kv_transfer_params": getattr(req, "kv_transfer_params", None),
        # Chat's reasoning budget (the chat route sets where the block lies: reasoning_markers).
        "reasoning_max_tokens": getattr(req, "reasoning_max_tokens", None),
        "thinking_token_budget": getattr(req, "thinking_token_budget", None),
        "response_max_tokens": getattr(req, "response_max_tokens", None),
    }
    if values["kv_transfer_params"] and (getattr(req, "n", None) or 1) != 1:
        raise bad_request("kv_transfer_params needs n = 1 (one transfer per request)", "kv_transfer_params")
    for name in MODEL_DEFAULT_FIELDS + ENGINE_DEFAULT_FIELDS:
        value = getattr(req, name)
        if value is None:
            value = defaults.get(name)
        if value is not None:
            values[name] = value
    try:
        params = SamplingParams(**values)
    except InvalidRequestError as e:
        raise bad_request(str(e), e.param) from None
    params.bad_words_token_ids = params.bad_words_ids(lambda text: encode(tokenizer, text, False))
    params.bad_words_token_ids += [[t] for t in req.bad_words_token_ids or ()]  # FastDeploy's
    return params


@dataclass
class Job:
    """One sequence the engine generates: a (prompt, sample) pair with its choice index."""

    index: int
    prompt_idx: int
    request_id: str
    prompt_ids: list[int]
    prompt: str | None
    params: SamplingParams
    mm_features: list | None = None  # the prompt's images (multimodal.inputs.MultiModalFeature)
    beam: Any = None  # BeamSearchParams: the job is one choice of a beam search (beam_jobs.py)

    def engine_kwargs(self) -> dict:
        """What engine.generate takes besides the ids, params, id and prompt: the images, if any."""
        return {"mm_features": self.mm_features} if self.mm_features else {}


def fan_out(
    request_id: str,
    prompts: list[tuple[str | None, list[int]]],
    params: SamplingParams,
    n: int,
    mm_features: list | None = None,
):
    """Jobs for `n` samples of each prompt: ids `rid` (single job), else `rid-i` / `rid-k-i`; seed + i.
    `mm_features` (one prompt only) ride with every sample."""
    jobs = []
    single = len(prompts) == 1 and n == 1
    for k, (text, ids) in enumerate(prompts):
        for i in range(n):
            child = params.for_sample(i)
            if single:
                rid = request_id
            elif len(prompts) == 1:
                rid = f"{request_id}-{i}"
            else:
                rid = f"{request_id}-{k}-{i}"
            jobs.append(Job(k * n + i, k, rid, ids, text, child, mm_features))
    return jobs


async def merge_jobs(engine: EngineClient, jobs: list[Job]) -> AsyncIterator[tuple[Job, RequestOutput]]:
    """Run every job concurrently and yield outputs as they arrive. Leaving early (client gone, error in
    one job) cancels the others, whose generators then abort their requests in the engine."""
    if jobs and jobs[0].beam is not None:
        from fdcli_engine.entrypoints.openai.beam_jobs import beam_outputs

        async for pair in beam_outputs(engine, jobs):
            yield pair
        return
    if len(jobs) == 1:
        job = jobs[0]
        async for out in engine.generate(
            job.prompt_ids, job.params, job.request_id, job.prompt, **job.engine_kwargs()
        ):
            yield job, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()
    engines = _parent_requests(engine, jobs)

    async def pump(job: Job) -> None:
        try:
            async for out in engines[job.prompt_idx].generate(
                job.prompt_ids, job.params, job.request_id, job.prompt, **job.engine_kwargs()
            ):
                queue.put_nowait((job, out))
            queue.put_nowait(done)
        except BaseException as e:  # noqa: B036 - re-raised in the consumer
            queue.put_nowait(e)

    tasks = [asyncio.create_task(pump(j)) for j in jobs]
    try:
        remaining = len(jobs)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _parent_requests(engine: EngineClient, jobs: list[Job]) -> dict[int, Any]:
    """The engine each prompt's jobs run on: an engine that observes metrics (metrics.ObservedEngine)
    counts a prompt's n samples as one request, as vLLM's ParentRequest does; any other is the engine."""
    sampling = getattr(engine, "parallel_sampling", None)
    n = Counter(job.prompt_idx for job in jobs)
    return {k: engine if sampling is None else sampling(count) for k, count in n.items()}


def batch_deltas(stream, max_tokens: int | None) -> AsyncIterator[tuple[Job, RequestOutput]]:
    """FastDeploy's max_streaming_response_tokens over a DELTA stream of (job, output): a choice's
    first output passes at once (its first token is never held back, so time to first token stays
    what it is); later ones are merged until they hold `max_tokens` tokens or the choice finishes.
    Without batching the stream itself is returned (no generator level per token)."""
    if max_tokens is None or max_tokens <= 1:
        return stream
    return _batched_deltas(stream, max_tokens)


async def _batched_deltas(stream, max_tokens: int) -> AsyncIterator[tuple[Job, RequestOutput]]:
    started: set[int] = set()
    held: dict[int, RequestOutput] = {}
    async for job, out in stream:
        if job.index not in started:
            started.add(job.index)
            yield job, out
            continue
        if job.index in held:
            out = _merge_deltas(held.pop(job.index), out)
        if out.finished or len(out.outputs[0].delta_token_ids) >= max_tokens:
            yield job, out
        else:
            held[job.index] = out


def _merge_deltas(first: RequestOutput, then: RequestOutput) -> RequestOutput:
    """`then` carrying `first`'s delta before its own (text, token ids, logprobs)."""
    a, b = first.outputs[0], then.outputs[0]
    logprobs = None if a.logprobs is None and b.logprobs is None else (a.logprobs or []) + (b.logprobs or [])
    comp = replace(
        b,
        delta_text=a.delta_text + b.delta_text,
        delta_token_ids=list(a.delta_token_ids) + list(b.delta_token_ids),
        logprobs=logprobs,
    )
    return replace(then, outputs=[comp])


async def final_outputs(engine: EngineClient, jobs: list[Job]) -> dict[int, tuple[Job, RequestOutput]]:
    """Every job's finished output, by choice index; an engine failure is raised as its APIError, the
    engine's exception its cause (run-batch retries a line whose data-parallel rank died)."""
    finals = {}
    try:
        async for job, out in merge_jobs(engine, jobs):
            if out.finished:
                finals[job.index] = (job, out)
    except Exception as e:
        raise from_exception(e) from e
    return finals


def stream_error(e: Exception, what: str, request_id: str) -> str:
    """The SSE event that ends a failed stream: the error object (a server-side error is logged)."""
    err = from_exception(e)
    if err.status >= 500:
        logger.error("%s stream %s failed: %s", what, request_id, e)
    return sse(json.dumps(err.to_dict()))


def stream_usage(req, force: bool) -> tuple[bool, bool]:
    """(a final usage chunk, usage on every chunk) of a chat or completions stream, as vLLM's
    should_include_usage: the request's stream_options, or both under --enable-force-include-usage
    (vLLM's chat and completions streams then carry usage on every chunk and at the end)."""
    if force:
        return True, True
    opts = req.stream_options
    return bool(opts and opts.include_usage), bool(opts and opts.continuous_usage_stats)


def tokens_as_ids(req, server_default: bool) -> bool:
    """vLLM's return_tokens_as_token_ids: the request's value, else the server's
    --return-tokens-as-token-ids. Logprobs then name each token "token_id:N" (token_id_text), which
    a client maps back to ids exactly, where a token's text may be an unprintable piece of a character."""
    asked = getattr(req, "return_tokens_as_token_ids", None)
    return server_default if asked is None else asked


def token_id_text(token_id: int) -> str:
    return f"token_id:{token_id}"


def token_text(tokenizer, lp, as_ids: bool = False) -> str:
    """A logprob entry's text ("token_id:N" with `as_ids`); ids past the tokenizer's vocabulary (padded
    embeddings) read as ''."""
    if as_ids:
        return token_id_text(lp.token_id)
    if lp.decoded or lp.token_id >= getattr(tokenizer, "vocab_size", 1 << 62):
        return lp.decoded
    return tokenizer.decode([lp.token_id], skip_special_tokens=False)


def logprob_rows(tokenizer, entries, token_ids: list[int], as_ids: bool = False):
    """Per sampled token: (text, logprob, [(text, logprob) of each top entry]), logprobs floored at -9999;
    each text "token_id:N" with `as_ids`."""
    for tid, entry in zip(token_ids, entries):
        sampled = entry.get(tid) or next(iter(entry.values()))
        tops = [(token_text(tokenizer, lp, as_ids), max(lp.logprob, -9999.0)) for lp in entry.values()]
        yield token_text(tokenizer, sampled, as_ids), max(sampled.logprob, -9999.0), tops


def completion_logprobs(
    tokenizer, entries, token_ids: list[int], start_offset: int, as_ids: bool = False
) -> CompletionLogprobs:
    """The legacy logprobs of `token_ids`; text offsets count each token's text as written (vLLM's
    rule, "token_id:N" included)."""
    out = CompletionLogprobs()
    offset = start_offset
    for text, logprob, tops in logprob_rows(tokenizer, entries, token_ids, as_ids):
        out.tokens.append(text)
        out.token_logprobs.append(logprob)
        out.top_logprobs.append(dict(tops))
        out.text_offset.append(offset)
        offset += len(text)
    return out


def make_usage(
    prompt_lens: dict[int, int],
    cached: dict[int, int],
    completion_tokens: int,
    reasoning_tokens: int | None = None,
) -> UsageInfo:
    """`reasoning_tokens`: chat's under a reasoning parser (None: no completion_tokens_details)."""
    prompt_tokens = sum(prompt_lens.values())
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(cached.values())),
        completion_tokens_details=(
            None if reasoning_tokens is None else CompletionTokensDetails(reasoning_tokens=reasoning_tokens)
        ),
    )


def chunk_usage(prompt_tokens: int, completion_tokens: int) -> UsageInfo:
    """The usage one chunk carries under stream_options.continuous_usage_stats (vLLM's): the choice's
    prompt and the tokens it has generated so far."""
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def sse(payload) -> str:
    body = payload if isinstance(payload, str) else payload.model_dump_json(exclude_none=True)
    return f"data: {body}\n\n"


SSE_DONE = "data: [DONE]\n\n"
