"""What `fd bench serve` does with `vllm bench serve` flags that fd has no engine-side copy of.

Each flag gets its vLLM meaning where fd can give it one (sampling fields and --extra-body in the
request body, --input-len/--output-len onto the datasets' lengths), a one-line note where it can have
no effect here, or a one-line refusal where running without it would measure something else.
"""

from __future__ import annotations

import json
import uuid

from fdcli_engine.errors import ConfigError

# vLLM's sampling flags that travel as body fields (its `sampling_params`, merged under --extra-body).
SAMPLING_FIELDS = ("min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
# --output-len sets every dataset's output length, as in vLLM's serve.py.
OUTPUT_LEN_FIELDS = (
    "random_output_len",
    "sharegpt_output_len",
    "custom_output_len",
    "hf_output_len",
    "prefix_repetition_output_len",
)


def default_request_id_prefix() -> str:
    """vLLM's default: `bench-` and 8 random hex digits, so two runs' request ids never collide."""
    return f"bench-{uuid.uuid4().hex[:8]}-"


def parse_json_object(text: str | None, flag: str, example: str) -> dict:
    """A flag's JSON object (vLLM parses these with json.loads); {} when the flag is not given."""
    if text is None:
        return {}
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} is not valid JSON: {exc.msg} (at character {exc.pos})") from None
    if not isinstance(body, dict):
        raise ConfigError(f"{flag} must be a JSON object, e.g. '{example}'")
    return body


def parse_extra_body(text: str | None) -> dict:
    return parse_json_object(text, "--extra-body", '{"min_tokens": 8}')


def parse_chat_template_kwargs(text: str | None) -> dict:
    """vLLM's --chat-template-kwargs: variables for the chat template the client applies itself
    (the custom dataset); they are not sent to the server, for that use --extra-body
    '{"chat_template_kwargs": {...}}' as vLLM's help says."""
    return parse_json_object(text, "--chat-template-kwargs", '{"enable_thinking": false}')


def request_extra_body(opts, pooling: bool) -> dict:
    """Fields merged into every request body: the sampling flags (not for embeddings, as vLLM sends
    none to its pooling backends), then --extra-body over them."""
    names = () if pooling else SAMPLING_FIELDS
    fields = {name: getattr(opts, name) for name in names if getattr(opts, name) is not None}
    return {**fields, **parse_extra_body(opts.extra_body)}


def default_percentile_metrics(backend: str) -> str:
    """vLLM's --percentile-metrics default: ttft,tpot,itl for generation, e2el for pooling."""
    return "e2el" if backend == "embeddings" else "ttft,tpot,itl"


def random_ignores_eos(opts) -> bool:
    """vLLM sets ignore_eos for the random dataset on its OpenAI-compatible backends, so each
    request generates its full output length (random token prompts often end at once otherwise)."""
    return opts.dataset == "random" and opts.backend != "embeddings"


def apply_general_lengths(opts) -> None:
    """vLLM's --input-len/--output-len: the random dataset's input length, and every dataset's
    output length (they win over the dataset-specific flags, as in vLLM)."""
    if opts.input_len is not None:
        opts.random_input_len = opts.input_len
    if opts.output_len is not None:
        for name in OUTPUT_LEN_FIELDS:
            setattr(opts, name, opts.output_len)


def check_refused(opts) -> None:
    """Flags whose vLLM meaning fd cannot give: one line naming what to use instead."""
    if opts.profile:
        raise ConfigError(
            "--profile is not supported: it drives vLLM's torch profiler endpoints (/start_profile), "
            "which fd's server does not have; profile the server process itself (e.g. py-spy) instead"
        )


def compat_notes(opts) -> list[str]:
    """One line per accepted flag that has no effect in fd, saying why."""
    notes = []
    if opts.tokenizer_mode not in (None, "auto", "hf"):
        notes.append(
            f"note: --tokenizer-mode {opts.tokenizer_mode} has no effect: fd bench reads the tokenizer "
            "from tokenizer.json, the HF folder or the GGUF file (vLLM's 'hf' mode)"
        )
    if opts.trust_remote_code:
        notes.append(
            "note: --trust-remote-code has no effect: fd bench never runs a model's own tokenizer code"
        )
    if opts.use_beam_search:
        notes.append(
            "note: --use-beam-search has no effect, as in vllm bench serve, which sends the same requests "
            "with it; to time beam search run fd bench latency --use-beam-search --n WIDTH"
        )
    if opts.plot_timeline:
        notes.append(
            "note: --plot-timeline has no effect: fd draws no HTML timeline; the terminal chart shows "
            "throughput over time and --save-result --save-detailed keeps each request's timings"
        )
    if opts.backend == "embeddings":
        given = [f"--{n.replace('_', '-')}" for n in SAMPLING_FIELDS if getattr(opts, n) is not None]
        if opts.logprobs is not None:
            given.append("--logprobs")
        if given:
            notes.append(
                f"note: {', '.join(given)} have no effect with the embeddings backend (no tokens are sampled)"
            )
    return notes
