"""FastDeploy's request and response fields that need a rule of their own (docs/request-fields.md)."""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.errors import bad_request


def prompt_text(tokenizer, text: str | None, ids: list[int]) -> str:
    """FastDeploy's `prompt_tokens`: the prompt as the model reads it (the rendered chat, the raw
    prompt), or for a prompt given as token ids their text (special tokens kept, as /detokenize)."""
    return text if text is not None else tokenizer.decode(ids, skip_special_tokens=False)


def check_logprob_post_processing(req, params) -> None:
    """FastDeploy's temp_scaled_logprobs / top_p_normalized_logprobs ask for log-probabilities of the
    logits divided by the temperature / renormalized over the top-p set. fd's logprobs are the
    model's raw ones (vLLM's raw_logprobs mode), which are exactly those at temperature 1 / top_p 1;
    any other value would silently change their meaning, so it is a 400."""
    if params.logprobs is None and params.prompt_logprobs is None:
        return
    if req.temp_scaled_logprobs and params.temperature != 1.0:
        raise bad_request(
            "temp_scaled_logprobs is not supported with temperature != 1: fd returns the model's raw "
            "logprobs (vLLM's --logprobs-mode raw_logprobs); send it false",
            "temp_scaled_logprobs",
        )
    if req.top_p_normalized_logprobs and params.top_p < 1.0:
        raise bad_request(
            "top_p_normalized_logprobs is not supported with top_p < 1: fd returns the model's raw "
            "logprobs (vLLM's --logprobs-mode raw_logprobs); send it false",
            "top_p_normalized_logprobs",
        )
