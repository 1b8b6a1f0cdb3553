"""vLLM's launch flags that fd has no concept for, or only one value of, in one place.

`vllm serve MODEL ...` lines run as `fd serve MODEL ...` (tests/cli/fixtures/vllm_launch_lines.txt).
Each option below is an `EngineConfig` field under vLLM's name and value type; None means "not given".
Three kinds:
- no effect here (fd never runs model code, never downloads, captures no graphs, logs no requests):
  accepted, one log line each saying so and why;
- one value fd has (`--pipeline-parallel-size 1`, `--tokenizer-mode auto`): accepted, any other value
  refused naming what to use instead;
- checked against the model (`--load-format safetensors` on a GGUF file is refused).
Flags of vLLM with a real effect here live with their concept: --max-logprobs (request_limits),
--served-model-name (several names), --root-path, --disable-uvicorn-access-log and
--enable-request-id-headers (fd serve's server options); `parse_human_int` reads vLLM's 32k / 1M sizes.

Leaf module: `EngineConfig.validate` calls `check_vllm_options` (pure, before paddle loads);
`config_resolver.resolve_config` calls `check_load_format` with the model's layout, logs `vllm_notes`
once and leaves these fields out of the ResolvedConfig, since no process acts on them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fdcli_engine.errors import ConfigError, need

# EngineConfig fields that exist only for vLLM's launch lines (never in the ResolvedConfig).
VLLM_FIELDS = (
    "trust_remote_code",
    "enforce_eager",
    "revision",
    "download_dir",
    "load_format",
    "tokenizer_mode",
    "pipeline_parallel_size",
    "chat_template_content_format",
    "enable_log_requests",
    "disable_log_requests",
    "disable_log_stats",
    # multimodal launch flags (vLLM's processor cache, memory profiling, encoder sharding)
    "mm_processor_cache_gb",
    "disable_mm_preprocessor_cache",
    "skip_mm_profiling",
    "mm_encoder_tp_mode",
    "enable_mm_embeds",
    # data-parallel and KV-connector launch flags (vllm_kv_connectors.py reads the connector ones)
    "cpu_offload_gb",
    "data_parallel_size_local",
    "data_parallel_start_rank",
    "data_parallel_address",
    "data_parallel_rpc_port",
    "data_parallel_backend",
    "external_data_parallel_rank",
    "data_parallel_external_lb",
    "data_parallel_hybrid_lb",
    "headless",
    "kv_cache_memory_bytes",
    "kv_transfer_config",
    "kv_offloading_size",
    "kv_offloading_backend",
)
# Integer options vLLM parses as human-readable sizes (its human_readable_int): 32k, 1M, 25.6k.
HUMAN_INT_FIELDS = ("max_model_len", "max_num_batched_tokens", "kv_cache_memory_bytes")
# vLLM's --max-model-len -1 / auto (its human_readable_int_or_auto): the model's own limit.
MAX_MODEL_LEN_AUTO = -1
# vLLM's --dtype spellings and fd's name for each (fd decides in EngineConfig.validate what runs here).
DTYPE_NAMES = {
    "auto": "auto",
    "float": "float32",
    "float32": "float32",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
}
# --load-format values and the loader layouts each names ("auto": whatever the checkpoint is).
LOAD_FORMATS = {"auto": None, "safetensors": ("hf", "paddle"), "gguf": ("gguf",)}
TOKENIZER_MODES = ("auto", "hf")
CONTENT_FORMATS = ("auto", "string", "openai")
MM_ENCODER_TP_MODES = ("weights", "data")

# fd serve's --disable-uvicorn-access-log (its server writes no access log at all).
ACCESS_LOG_NOTE = (
    "--disable-uvicorn-access-log has no effect: fd's server writes no uvicorn access log (requests are "
    "counted on /metrics)"
)

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

_NO_EFFECT = {
    "trust_remote_code": "--trust-remote-code has no effect: fd never runs code from a checkpoint (its "
    "architectures are fd's own, fdcli_engine/models)",
    "enforce_eager": "--enforce-eager has no effect: fd always runs eagerly on CPU (there are no graphs to "
    "capture)",
    "disable_log_stats": "--disable-log-stats has no effect: fd logs no periodic engine statistics (read "
    "them from /metrics)",
    "mm_processor_cache_gb": "--mm-processor-cache-gb has no effect: fd keeps no processor cache (a picture "
    "already cached by prefix caching skips the vision encoder)",
    "disable_mm_preprocessor_cache": "--disable-mm-preprocessor-cache has no effect: fd keeps no processor "
    "cache",
    "skip_mm_profiling": "--skip-mm-profiling has no effect: fd sizes its KV cache from --num-kv-blocks / "
    "--kv-cache-memory-gb, without a profiling run",
    "mm_encoder_tp_mode": "--mm-encoder-tp-mode has no effect: fd runs vision models unsharded "
    "(--tensor-parallel-size 1)",
    "data_parallel_address": "--data-parallel-address has no effect: every --data-parallel-size rank runs "
    "on this machine and talks to the front end over IPC",
    "data_parallel_rpc_port": "--data-parallel-rpc-port has no effect: every --data-parallel-size rank runs "
    "on this machine and talks to the front end over IPC",
}
# vLLM's multi-node data parallel; fd's data-parallel ranks all run under one fd serve.
_DP_NODES = (
    "fd runs every --data-parallel-size rank on this machine under one fd serve; to spread replicas over "
    "machines run one fd serve per machine, each with --router HOST:PORT, behind `fd router`"
)


def parse_human_int(name: str, value: Any) -> int:
    """vLLM's human-readable integers: 32768, 32k (x1000), 32K (x1024), 1m / 1M, 25.6k (decimals only
    with the decimal suffixes k, m, g, t). ConfigError naming --`name` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    flag = "--" + name.replace("_", "-")
    text = str(value).strip()
    if name == "max_model_len" and text.lower() == "auto":
        return MAX_MODEL_LEN_AUTO  # vLLM's human_readable_int_or_auto; -1 parses as itself below
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)([kmgtKMGT]?)", text)
    if m is None or isinstance(value, bool):
        raise ConfigError(
            f"{flag} must be an integer such as 32768, 32k (32000) or 32K (32768), got {value!r}"
        )
    number, suffix = m.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise ConfigError(
            f"{flag} {text}: decimals go only with k, m, g or t (x1000 each); did you mean "
            f"{number}{suffix.lower()}?"
        )
    return int(number) * _BINARY.get(suffix, 1)


def check_vllm_options(config: Any) -> None:
    """ConfigError for a value vLLM itself would refuse, or one fd has no implementation of."""
    pp = config.pipeline_parallel_size
    need(
        pp is None or pp == 1,
        f"--pipeline-parallel-size {pp} is not supported: fd has no pipeline parallelism; split the model "
        "over processes with --tensor-parallel-size, or run copies with --data-parallel-size",
    )
    need(
        config.load_format is None or config.load_format in LOAD_FORMATS,
        f"--load-format {config.load_format!r} is not supported: fd loads safetensors folders and GGUF "
        "files; use auto (the checkpoint's own format), safetensors or gguf",
    )
    need(
        config.tokenizer_mode is None or config.tokenizer_mode in TOKENIZER_MODES,
        f"--tokenizer-mode {config.tokenizer_mode!r} is not supported: fd reads the checkpoint's "
        "tokenizer.json (or a GGUF file's vocabulary); use auto or hf",
    )
    need(
        not config.enable_mm_embeds,
        "--enable-mm-embeds is not supported: fd reads pictures, not precomputed embeddings; send "
        "image_url parts",
    )
    need(
        config.mm_encoder_tp_mode is None or config.mm_encoder_tp_mode in MM_ENCODER_TP_MODES,
        f"--mm-encoder-tp-mode {config.mm_encoder_tp_mode!r}: use weights or data",
    )
    need(
        config.mm_processor_cache_gb is None or config.mm_processor_cache_gb >= 0,
        f"--mm-processor-cache-gb must be 0 or more, got {config.mm_processor_cache_gb}",
    )
    need(
        config.chat_template_content_format is None or config.chat_template_content_format in CONTENT_FORMATS,
        f"--chat-template-content-format {config.chat_template_content_format!r}: use auto, string or openai",
    )
    _check_data_parallel(config)


def _check_data_parallel(config: Any) -> None:
    """vLLM's multi-node data-parallel flags: the values that describe one machine run, others refused."""
    local = config.data_parallel_size_local
    need(
        local is None or local == config.data_parallel_size,
        f"--data-parallel-size-local {local} with --data-parallel-size {config.data_parallel_size} is not "
        f"supported: {_DP_NODES}",
    )
    start = config.data_parallel_start_rank
    need(start in (None, 0), f"--data-parallel-start-rank {start} is not supported: {_DP_NODES}")
    need(not config.headless, f"--headless is not supported: {_DP_NODES}")
    external = [
        flag
        for flag, given in (
            (
                f"--data-parallel-rank {config.external_data_parallel_rank}",
                config.external_data_parallel_rank is not None,
            ),
            ("--data-parallel-external-lb", config.data_parallel_external_lb),
            ("--data-parallel-hybrid-lb", config.data_parallel_hybrid_lb),
        )
        if given
    ]
    need(
        not external,
        f"{', '.join(external)}: not supported: fd serve balances its own --data-parallel-size ranks; behind "
        "an external load balancer run one fd serve per replica (--data-parallel-size 1), or put `fd router` "
        "in front of them",
    )
    backend = config.data_parallel_backend
    need(
        backend in (None, "mp"),
        f"--data-parallel-backend {backend} is not supported: fd's data-parallel ranks are processes (mp)"
        + (
            "; Ray runs fd run-batch's engines (--distributed-executor-backend ray)"
            if backend == "ray"
            else ""
        ),
    )


def kv_cache_memory_gb(config: Any) -> float:
    """The KV cache's GiB: vLLM's --kv-cache-memory-bytes when given (it names the same memory in bytes,
    per rank as fd's --kv-cache-memory-gb), else --kv-cache-memory-gb."""
    size = config.kv_cache_memory_bytes
    if size is None:
        return config.kv_cache_memory_gb
    need(size > 0, f"--kv-cache-memory-bytes must be positive, got {size}")
    return size / 2**30


def check_load_format(load_format: str | None, layout: str) -> None:
    """--load-format safetensors or gguf must name the checkpoint's format (fd converts nothing)."""
    layouts = LOAD_FORMATS.get(load_format or "auto")
    need(
        layouts is None or layout in layouts,
        f"--load-format {load_format} does not match the model, a {'GGUF file' if layout == 'gguf' else 'safetensors folder'}: "
        "use --load-format auto",
    )


def vllm_notes(config: Any) -> list[str]:
    """One line for each given option that changes nothing here, saying why (logged at start)."""
    notes = [line for name, line in _NO_EFFECT.items() if getattr(config, name)]
    if config.cpu_offload_gb:
        notes.append(
            f"--cpu-offload-gb {config.cpu_offload_gb:g} has no effect: fd's weights are in host memory "
            "already (there is no GPU memory to extend)"
        )
    if _is_path(config.model):
        for flag, value in (("--revision", config.revision), ("--download-dir", config.download_dir)):
            if value is not None:
                notes.append(
                    f"{flag} {value} has no effect: the model is a local file or folder, served as it is (the flag picks "
                    "the snapshot of a Hugging Face id in the local cache)"
                )
    if config.load_format not in (None, "auto"):
        notes.append(f"--load-format {config.load_format}: fd reads the checkpoint's own format (it matches)")
    if config.tokenizer_mode == "hf":
        notes.append("--tokenizer-mode hf: fd's one tokenizer (the checkpoint's tokenizer.json), as auto")
    if config.chat_template_content_format in ("string", "openai"):
        notes.append(
            f"--chat-template-content-format {config.chat_template_content_format} has no effect: fd renders "
            "a text-only content list as one string and keeps the parts as a list when it holds images "
            "(what HF chat templates read)"
        )
    return notes


def _is_path(model: str | None) -> bool:
    """Whether --model names a file or folder (else: the default model, or a hub id from the cache)."""
    return model is None or Path(model).expanduser().exists()
