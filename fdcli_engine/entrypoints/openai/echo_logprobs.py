"""Prompt logprobs in responses: vLLM's `prompt_logprobs` field, and the legacy completions logprobs of
an echoed prompt (what lm-evaluation-harness reads for loglikelihood tasks).

Legacy format, as vLLM writes it: one entry per prompt token then per generated token; the first prompt
token has no logprob (nothing predicts it), so its token_logprobs entry and top_logprobs entry are null;
every other entry's top_logprobs holds the token itself and the top-k, logprobs floored at -9999.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.protocol import CompletionLogprobs, PromptLogprob, PromptLogprobsOut
from fdcli_engine.entrypoints.openai.serving_common import completion_logprobs, token_id_text, token_text
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.outputs import PromptLogprobs
from fdcli_engine.request_limits import check_logit_bias, check_logprobs

FLOOR = -9999.0  # OpenAI's stand-in for -inf in JSON


def prompt_logprobs_out(tokenizer, prompt_logprobs: PromptLogprobs | None) -> PromptLogprobsOut | None:
    if prompt_logprobs is None:
        return None
    return [
        None
        if entry is None
        else {
            tid: PromptLogprob(
                logprob=max(lp.logprob, FLOOR), rank=lp.rank, decoded_token=token_text(tokenizer, lp)
            )
            for tid, lp in entry.items()
        }
        for entry in prompt_logprobs
    ]


def echoed_prompt_logprobs(
    tokenizer, prompt_ids: list[int], prompt_logprobs: PromptLogprobs, as_ids: bool = False
) -> CompletionLogprobs:
    """The legacy logprobs of the prompt tokens, text offsets from 0 ("token_id:N" texts with `as_ids`)."""
    out = CompletionLogprobs()
    offset = 0
    for tid, entry in zip(prompt_ids, prompt_logprobs):
        if entry is None:
            if as_ids:
                text = token_id_text(tid)
            else:
                text = (
                    tokenizer.decode([tid], skip_special_tokens=False) if tid < tokenizer.vocab_size else ""
                )
            logprob, tops = None, None
        else:
            own = entry[tid]
            text = token_text(tokenizer, own, as_ids)
            logprob = max(own.logprob, FLOOR)
            tops = {token_text(tokenizer, lp, as_ids): max(lp.logprob, FLOOR) for lp in entry.values()}
        out.tokens.append(text)
        out.token_logprobs.append(logprob)
        out.top_logprobs.append(tops)
        out.text_offset.append(offset)
        offset += len(text)
    return out


def echo_logprobs(
    tokenizer,
    prompt_ids: list[int],
    prompt_logprobs: PromptLogprobs,
    entries,
    token_ids: list[int],
    as_ids: bool = False,
) -> CompletionLogprobs:
    """The echoed prompt's logprobs followed by those of the generated `token_ids`."""
    out = echoed_prompt_logprobs(tokenizer, prompt_ids, prompt_logprobs, as_ids)
    if token_ids:
        start = out.text_offset[-1] + len(out.tokens[-1]) if out.tokens else 0
        gen = completion_logprobs(tokenizer, entries, token_ids, start, as_ids)
        out.tokens += gen.tokens
        out.token_logprobs += gen.token_logprobs
        out.top_logprobs += gen.top_logprobs
        out.text_offset += gen.text_offset
    return out


def check_logit_bias_vocab(params, model_config) -> None:
    """check_logit_bias against the served model, as a 400."""
    try:
        check_logit_bias(params.logit_bias, model_config.vocab_size)
    except InvalidRequestError as e:
        raise bad_request(str(e), e.param) from None


def check_logprob_limits(params, model_config, chat: bool = False) -> None:
    """check_logprobs against the server's --max-logprobs, as a 400 naming the request's field."""
    try:
        check_logprobs(params.logprobs, params.prompt_logprobs, model_config.max_logprobs, chat)
    except InvalidRequestError as e:
        raise bad_request(str(e), e.param) from None


def check_prompt_logprobs(req) -> None:
    """vLLM's rule: the prompt_logprobs field has no place in a stream (echo's legacy logprobs do)."""
    if req.stream and req.prompt_logprobs:
        raise bad_request(
            "prompt_logprobs are not available when stream=true; send the request without streaming",
            "prompt_logprobs",
        )
