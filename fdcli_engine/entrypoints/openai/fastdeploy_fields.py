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


_BOOL_TEXT = {"true": True, "false": False}


def apply_chat_metadata(req) -> None:
    """FastDeploy's older channel for chat options: `metadata.enable_thinking` and
    `metadata.max_streaming_response_tokens` (its docs' `"metadata": {"enable_thinking": false}`).
    Each applies where the request's own field leaves it unset (chat_template_kwargs.enable_thinking,
    max_streaming_response_tokens), the order FastDeploy's serving reads them in. OpenAI's metadata
    values are strings, so "true" / "false" and a decimal count are taken too; other metadata keys
    stay OpenAI's tags (ignored)."""
    meta = req.metadata
    if not isinstance(meta, dict):
        return
    if "enable_thinking" in meta:
        value = meta["enable_thinking"]
        if isinstance(value, str):
            value = _BOOL_TEXT.get(value.strip().lower(), value)
        if not isinstance(value, bool):
            raise bad_request("metadata.enable_thinking must be true or false", "metadata.enable_thinking")
        kwargs = dict(req.chat_template_kwargs or {})
        kwargs.setdefault("enable_thinking", value)
        req.chat_template_kwargs = kwargs
    _streaming_tokens_from(req, meta, "metadata")


def apply_completion_suffix_options(req) -> None:
    """FastDeploy's completions take an object `suffix` as an option channel, of which its serving
    reads max_streaming_response_tokens (applied where the request's own field is unset). OpenAI's
    text suffix is another thing (refused by the serving layer); any other key of the object is a
    400 saying to send it as a field of its own."""
    if not isinstance(req.suffix, dict):
        return
    for key in req.suffix:
        if key != "max_streaming_response_tokens":
            raise bad_request(
                f"suffix.{key} is not supported: send {key} as a request field of its own", f"suffix.{key}"
            )
    _streaming_tokens_from(req, req.suffix, "suffix")
    req.suffix = None


def _streaming_tokens_from(req, options: dict, where: str) -> None:
    if "max_streaming_response_tokens" not in options or req.max_streaming_response_tokens is not None:
        return
    value = options["max_streaming_response_tokens"]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
        raise bad_request(
            f"{where}.max_streaming_response_tokens must be a whole number from 1 to 1048576",
            f"{where}.max_streaming_response_tokens",
        )
    req.max_streaming_response_tokens = value
