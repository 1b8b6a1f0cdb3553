"""Every length, vocabulary and limit rule a request meets, in one pure function.

`check_request` runs where a request enters: the serving layer (the fields of the HTTP body, before
any engine work) and `EngineCore.add_request` (every request, `LLM()`'s included). Each error is an
InvalidRequestError whose `param` names the request field (a 400 at the server). The sampling
parameters' own ranges (n, temperature, logprobs, ...) are checked by SamplingParams itself; the
stopping rules that follow from these limits are documented in step_types.

Leaf module: imports only errors.
"""

from __future__ import annotations

from collections.abc import Sequence

from fdcli_engine.errors import InvalidRequestError

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's error code


def max_output_tokens(
    num_prompt_tokens: int, max_tokens: int | None, max_model_len: int, default_max_tokens: int | None = None
) -> int:
    """Tokens a request may generate: `max_tokens`, else the model's default (generation_config.py),
    within the room the context leaves (vLLM's get_max_tokens)."""
    room = max_model_len - num_prompt_tokens
    limit = max_tokens if max_tokens is not None else default_max_tokens
    return room if limit is None else min(limit, room)


def check_request(
    prompt_token_ids: Sequence[int],
    max_tokens: int | None = None,
    *,
    max_model_len: int,
    vocab_size: int = 0,
    pooling: bool = False,
    prompt_param: str = "prompt",
    max_tokens_param: str = "max_tokens",
    default_max_tokens: int | None = None,
) -> int | None:
    """Raise InvalidRequestError for a request the engine cannot serve; return the number of tokens it
    may generate (None for a pooling request, which generates nothing and ignores max_tokens).
    `default_max_tokens`: the model's default for a request without max_tokens; unlike the request's
    own value it is capped by the room the prompt leaves, never an error.

    `vocab_size` 0: not known yet (the server before the engine is ready); the engine checks again.
    """
    n = len(prompt_token_ids)
    if n == 0:
        message = f"{prompt_param} is empty" if pooling else "the prompt is empty"
        raise InvalidRequestError(message, param=prompt_param)
    if vocab_size:
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"{prompt_param} holds token id {bad}, out of range: outside the vocabulary (size {vocab_size})",
                param=prompt_param,
            )
    if pooling:
        if n > max_model_len:
            raise InvalidRequestError(
                f"{prompt_param} has {n} tokens but this model takes at most {max_model_len}; shorten it or "
                "set truncate_prompt_tokens",
                param=prompt_param,
            )
        return None
    # OpenAI's wording and code, which litellm and other routers match to raise their
    # context-window errors ("This model's maximum context length is", "context_length_exceeded").
    head = f"This model's maximum context length is {max_model_len} tokens. However, "
    if n >= max_model_len:
        raise InvalidRequestError(
            f"{head}your {prompt_param} resulted in {n} tokens. Please reduce the length of the "
            f"{prompt_param} (at least one token must be left for the completion).",
            param=prompt_param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    if max_tokens is not None and n + max_tokens > max_model_len:
        raise InvalidRequestError(
            f"{head}you requested {n + max_tokens} tokens ({n} in the {prompt_param}, {max_tokens} in the "
            f"completion). Please reduce the length of the {prompt_param} or completion: at most "
            f"{max_model_len - n} tokens can be generated ({max_tokens_param}).",
            param=max_tokens_param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    return max_output_tokens(n, max_tokens, max_model_len, default_max_tokens)


def check_logit_bias(logit_bias: dict[int, float] | None, vocab_size: int) -> None:
    """A logit_bias names only tokens of the vocabulary (`vocab_size` 0: not known yet)."""
    if not logit_bias or not vocab_size:
        return
    bad = sorted(t for t in logit_bias if not 0 <= t < vocab_size)
    if bad:
        raise InvalidRequestError(
            f"logit_bias holds token id {bad[0]}, out of range: outside the vocabulary (size {vocab_size})",
            param="logit_bias",
        )


def check_logprobs(
    logprobs: int | None, prompt_logprobs: int | None, max_logprobs: int, chat: bool = False
) -> None:
    """The server's --max-logprobs cap on a request's logprobs (chat: top_logprobs) and prompt_logprobs,
    as vLLM checks it; the fields' own range (0-20) is SamplingParams'."""
    for value, param in (
        (logprobs, "top_logprobs" if chat else "logprobs"),
        (prompt_logprobs, "prompt_logprobs"),
    ):
        if value is not None and value > max_logprobs:
            raise InvalidRequestError(
                f"{param} {value} is more than this server's --max-logprobs {max_logprobs}", param=param
            )


def truncate_limit(keep: int | None, max_model_len: int, param: str = "truncate_prompt_tokens") -> int | None:
    """How many tokens vLLM's truncate_prompt_tokens keeps (None: no truncation; -1: max_model_len).
    Generating and pooling requests share the check; which end they keep differs."""
    if keep is None:
        return None
    if keep == 0 or keep < -1 or keep > max_model_len:
        raise InvalidRequestError(
            f"{param} must be -1 or between 1 and {max_model_len}, got {keep}", param=param
        )
    return max_model_len if keep == -1 else keep
