"""vLLM's `use_beam_search` on /v1/completions and /v1/chat/completions: the request's `n` is the beam
width, each prompt's best `n` beams are its `n` choices (beam_search.py runs the search; the engine
generates one token per live beam a step). The choices arrive finished together, so a stream carries
each one's whole text in one delta. With logprobs (completions' `logprobs`, chat's `top_logprobs`) each
choice carries its tokens' logprobs as a sampled request's would: each the model's log-probability of
the token after the beam's prefix (the search's own numbers), with that step's best alternatives.

Fields a sampled request honours but beam search has no place for are refused with a 400 naming them,
where vLLM would drop them silently (stop strings, structured outputs, prompt logprobs, ...)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fdcli_engine.beam_search import BeamSearchParams, completion_outputs, next_token_logprobs, search
from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.protocol import CompletionRequest
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.outputs import RequestOutput

# Request fields that change a sampled answer and mean nothing to beam search: (field, is it set).
_NOT_WITH_BEAMS = {
    "stop": lambda v: bool(v),
    "stop_token_ids": lambda v: bool(v),
    "bad_words": lambda v: bool(v),
    "bad_words_token_ids": lambda v: bool(v),
    "logit_bias": lambda v: bool(v),
    "min_tokens": lambda v: bool(v),
    "prompt_logprobs": lambda v: v is not None,
    "response_format": lambda v: v is not None and v.type != "text",
    "guided_json": lambda v: v is not None,
    "guided_regex": lambda v: v is not None,
    "guided_choice": lambda v: v is not None,
    "guided_grammar": lambda v: v is not None,
    "structural_tag": lambda v: v is not None,
    "structured_outputs": lambda v: v is not None,
    "tool_choice": lambda v: v not in (None, "none", "auto"),
    "reasoning_max_tokens": lambda v: v is not None,
    "thinking_token_budget": lambda v: v not in (None, -1),
    "response_max_tokens": lambda v: v is not None,
}


def beam_params(req, max_tokens: int, max_logprobs: int) -> BeamSearchParams | None:
    """The request's BeamSearchParams (None without use_beam_search); a 400 for a field it cannot honour."""
    if not req.use_beam_search:
        return None
    for name, is_set in _NOT_WITH_BEAMS.items():
        if is_set(getattr(req, name, None)):
            raise bad_request(f"{name} does not combine with use_beam_search: leave it out", name)
    if isinstance(req, CompletionRequest) and req.echo and req.logprobs is not None:
        # A completion's echoed prompt has prompt logprobs, which the search never computes (vLLM
        # fails the request on an assertion). Chat's echo has no logprobs.
        raise bad_request("echo with logprobs does not combine with use_beam_search: leave out echo", "echo")
    try:
        params = BeamSearchParams(
            beam_width=req.n,
            max_tokens=max_tokens,
            ignore_eos=req.ignore_eos,
            temperature=req.temperature or 0.0,
            length_penalty=req.length_penalty,
            include_stop_str_in_output=req.include_stop_str_in_output,
        )
        params.check_width(max_logprobs)
    except InvalidRequestError as e:
        raise bad_request(str(e), e.param) from None
    return params


async def beam_outputs(engine, jobs) -> AsyncIterator[tuple]:
    """(job, finished RequestOutput) for each choice of the jobs' beam searches (Job.beam set on all):
    one search per prompt, the prompts' searches concurrent, a prompt's choices yielded when its
    search ends. Jobs come from fan_out: prompt k's choice i is job k * n + i."""
    prompts: dict[int, list] = {}
    for job in jobs:
        prompts.setdefault(job.prompt_idx, []).append(job)
    tasks = [asyncio.create_task(_search_one(engine, choices)) for choices in prompts.values()]
    try:
        for done in asyncio.as_completed(tasks):
            for pair in await done:
                yield pair
    finally:
        for task in tasks:
            task.cancel()


async def _search_one(engine, choices) -> list[tuple]:
    first = choices[0]
    params: BeamSearchParams = first.beam
    # The request's logprobs count (None: not asked), as build_params put it in every job's params.
    num_logprobs = first.params.logprobs
    step_params = params.step_params(num_logprobs)
    step = search([first.prompt_ids], params, set(engine.tokenizer.eos_token_ids))
    round_no = 0
    try:
        batch = next(step)
        while True:
            ids = [f"{first.request_id}-beam{round_no}-{j}" for j in range(len(batch))]
            outs = await asyncio.gather(
                *(_one_token(engine, t, step_params, rid) for t, rid in zip(batch, ids))
            )
            round_no += 1
            batch = step.send([next_token_logprobs(o) for o in outs])
    except StopIteration as stop:
        [beams] = stop.value
    decode = engine.tokenizer.backend.decode  # an id past the vocabulary is no text, as in streams
    comps = completion_outputs(beams, len(first.prompt_ids), decode, num_logprobs)
    return [
        (
            job,
            RequestOutput(
                request_id=job.request_id,
                prompt=job.prompt,
                prompt_token_ids=job.prompt_ids,
                outputs=[comp],
                finished=True,
            ),
        )
        for job, comp in zip(choices, comps)
    ]


async def _one_token(engine, tokens: list[int], params, request_id: str) -> RequestOutput:
    final = None
    async for out in engine.generate(tokens, params, request_id, None):
        final = out
    return final
