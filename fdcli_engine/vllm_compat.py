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

The rest of `vllm serve`'s flags are rows of VLLM_FLAG_TABLE (below): each an EngineConfig field (its base
class VllmFlagFields is built from the table) and an option of the "vLLM compatibility" panel, with a
no-effect line or a refusal naming what to use; `check_vllm_options` and `vllm_notes` cover them too.

Leaf module: `EngineConfig.validate` calls `check_vllm_options` (pure, before paddle loads);
`config_resolver.resolve_config` calls `check_load_format` with the model's layout, logs `vllm_notes`
once and leaves these fields out of the ResolvedConfig, since no process acts on them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

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
    check_vllm_flags(config)


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
    return notes + vllm_flag_notes(config)


def _is_path(model: str | None) -> bool:
    """Whether --model names a file or folder (else: the default model, or a hub id from the cache)."""
    return model is None or Path(model).expanduser().exists()


# ---- the rest of `vllm serve`'s flags (vLLM's EngineArgs.add_cli_args, FrontendArgs, make_arg_parser) --
# Each is an EngineConfig field (VllmFlagFields, built from this table) under vLLM's name; the CLI type is
# vLLM's (a JSON object arrives as text: JSON_FLAG_FIELDS; nargs='+': a list). Two kinds:
# - NOTE: accepted, one log line at start saying why it changes nothing here;
# - REFUSE: a feature fd lacks that would change results or endpoints: one error naming what to use.
# A value in `silent` (and False, None) is what fd always does: accepted without a word.
NOTE, REFUSE = "note", "refuse"


@dataclass(frozen=True)
class VllmFlag:
    type: Any  # the command-line type: bool, int, float, str, dict (JSON text), list (nargs='+')
    kind: str  # NOTE or REFUSE
    why: str  # the reason, after "has no effect: " or "is not supported: "
    silent: tuple = ()


_GPU = "fd runs on CPU (no CUDA graphs, GPU kernels or GPU memory to tune)"
_EAGER = "fd runs the model eagerly (no compilation, no graphs to capture)"
_NO_DOWNLOAD = "fd never downloads (it reads local files and the Hugging Face cache as they are)"
_MM = "fd's image inputs are preprocessed in the request, with the model's own preprocessor settings"
_METRICS = "fd exports no traces or extra metrics (read /metrics)"
NO_LORA = (
    "fd has no LoRA adapters; merge the adapter into the base weights (peft's merge_and_unload) and "
    "serve the merged folder"
)
_CODE = "fd loads no Python code from options (its models, parsers and processors are built in)"
_MAMBA = "fd serves no Mamba/SSM models"
_OFFLOAD = "fd's weights are in CPU memory already"
_NO_CP = "fd has no context parallelism; use --tensor-parallel-size or --data-parallel-size"
_NO_LOG = "fd logs no prompts or outputs (--enable-log-requests logs ids, params and token counts)"

VLLM_FLAG_TABLE: dict[str, VllmFlag] = {
    # server (FrontendArgs, make_arg_parser)
    "api_server_count": VllmFlag(int, NOTE, "one API server process serves every connection", (1,)),
    "grpc": VllmFlag(bool, REFUSE, "fd serves HTTP only; drop --grpc and use the OpenAI HTTP API"),
    "lora_modules": VllmFlag(list, REFUSE, NO_LORA),
    "default_chat_template_kwargs": VllmFlag(
        dict, REFUSE, "fd has no server-wide chat_template_kwargs; send chat_template_kwargs in each request"
    ),
    "exclude_tools_when_tool_choice_none": VllmFlag(
        bool, REFUSE, "fd renders a request's tools whatever its tool_choice; leave out tools instead"
    ),
    "tool_server": VllmFlag(
        str, REFUSE, "fd runs no built-in or MCP tool servers; run tools in the client (tool_calls)"
    ),
    "max_log_len": VllmFlag(int, NOTE, _NO_LOG),
    "enable_prompt_tokens_details": VllmFlag(
        bool, NOTE, "fd always reports usage.prompt_tokens_details.cached_tokens"
    ),
    "enable_per_request_metrics": VllmFlag(bool, NOTE, _METRICS),
    "enable_tokenizer_info_endpoint": VllmFlag(
        bool, REFUSE, "fd has no /tokenizer_info endpoint; use /tokenize and /detokenize"
    ),
    "enable_log_outputs": VllmFlag(bool, NOTE, _NO_LOG),
    "enable_log_deltas": VllmFlag(bool, NOTE, _NO_LOG, (True,)),
    "cohere_is_reasoning_model": VllmFlag(bool, NOTE, "fd has no Cohere endpoints", (True,)),
    "cohere_format": VllmFlag(str, NOTE, "fd has no Cohere endpoints", ("cmd4",)),
    "log_error_stack": VllmFlag(bool, NOTE, "fd logs each unexpected server error with its traceback"),
    "tokens_only": VllmFlag(bool, REFUSE, "fd serves the full OpenAI API; drop --tokens-only"),
    "fingerprint_mode": VllmFlag(str, NOTE, "fd's responses carry no system_fingerprint", ("none",)),
    "fingerprint_value": VllmFlag(str, NOTE, "fd's responses carry no system_fingerprint"),
    "data_parallel_supervisor_port": VllmFlag(int, NOTE, "fd has no multi-port external load-balancer mode"),
    "dp_supervisor_probe_interval_s": VllmFlag(
        float, NOTE, "fd has no multi-port external load-balancer mode"
    ),
    "dp_supervisor_probe_timeout_s": VllmFlag(
        float, NOTE, "fd has no multi-port external load-balancer mode"
    ),
    "dp_supervisor_probe_failure_threshold": VllmFlag(
        int, NOTE, "fd has no multi-port external load-balancer mode"
    ),
    "uds": VllmFlag(str, REFUSE, "fd listens on TCP; use --host and --port"),
    "disable_access_log_for_endpoints": VllmFlag(str, NOTE, "fd's server writes no access log"),
    "enable_ssl_refresh": VllmFlag(bool, NOTE, "fd reads the SSL files once at start (restart to renew)"),
    "middleware": VllmFlag(list, REFUSE, _CODE),
    "enable_offline_docs": VllmFlag(bool, NOTE, "fd's /docs page is FastAPI's own"),
    "enable_flash_late_interaction": VllmFlag(bool, NOTE, _GPU, (True,)),
    # model (ModelConfig)
    "hf_config_path": VllmFlag(
        str, REFUSE, "fd reads the model folder's config.json; change keys with --hf-overrides"
    ),
    "code_revision": VllmFlag(str, NOTE, "fd runs no code from a checkpoint"),
    "tokenizer_revision": VllmFlag(
        str, NOTE, "the tokenizer is read from --tokenizer (or the model) as found"
    ),
    "quantization_config": VllmFlag(dict, REFUSE, "fd's quantization is --quantization wint8, wint4 or gguf"),
    "allow_deprecated_quantization": VllmFlag(bool, NOTE, "fd has no deprecated quantization methods"),
    "enable_return_routed_experts": VllmFlag(bool, REFUSE, "fd does not return MoE routing"),
    "disable_sliding_window": VllmFlag(bool, REFUSE, "fd attends as the model's config.json says"),
    "disable_cascade_attn": VllmFlag(bool, NOTE, _GPU),
    "skip_tokenizer_init": VllmFlag(bool, REFUSE, "fd needs the tokenizer (prompts and outputs are text)"),
    "enable_prompt_embeds": VllmFlag(bool, REFUSE, "fd takes prompts as text or token ids"),
    "config_format": VllmFlag(
        str, REFUSE, "fd reads Hugging Face config.json; use auto or hf", ("auto", "hf")
    ),
    "hf_token": VllmFlag(str, NOTE, _NO_DOWNLOAD),
    "enable_sleep_mode": VllmFlag(bool, REFUSE, "fd has no /sleep and /wake_up; stop and start fd serve"),
    "override_attention_dtype": VllmFlag(str, REFUSE, "fd computes attention in float32"),
    "io_processor_plugin": VllmFlag(str, REFUSE, _CODE),
    "device": VllmFlag(str, NOTE, "fd runs on CPU", ("auto", "cpu")),
    # load (LoadConfig)
    "safetensors_load_strategy": VllmFlag(str, NOTE, "fd memory-maps safetensors files"),
    "model_loader_extra_config": VllmFlag(dict, NOTE, "fd has one loader, without extra settings"),
    "ignore_patterns": VllmFlag(list, NOTE, _NO_DOWNLOAD),
    "use_tqdm_on_load": VllmFlag(bool, NOTE, "fd shows no loading progress bar", (True,)),
    "pt_load_map_location": VllmFlag(str, NOTE, "fd loads no PyTorch .bin files", ("cpu",)),
    # attention, kernels, compilation (AttentionConfig, KernelConfig, CompilationConfig)
    "attention_backend": VllmFlag(str, NOTE, "fd has one CPU attention kernel"),
    "attention_config": VllmFlag(dict, NOTE, "fd has one CPU attention kernel"),
    "kernel_config": VllmFlag(dict, NOTE, _GPU),
    "enable_flashinfer_autotune": VllmFlag(bool, NOTE, _GPU),
    "moe_backend": VllmFlag(str, NOTE, _GPU),
    "compilation_config": VllmFlag(dict, NOTE, _EAGER),
    "optimization_level": VllmFlag(str, NOTE, _EAGER),
    "performance_mode": VllmFlag(str, NOTE, _EAGER),
    "cudagraph_capture_sizes": VllmFlag(list, NOTE, _EAGER),
    "max_cudagraph_capture_size": VllmFlag(int, NOTE, _EAGER),
    "max_seq_len_to_capture": VllmFlag(int, NOTE, _EAGER),
    # reasoning, structured outputs
    "reasoning_parser_plugin": VllmFlag(str, REFUSE, f"{_CODE}; use --reasoning-parser"),
    # cache (CacheConfig)
    "prefix_caching_hash_algo": VllmFlag(str, NOTE, "fd hashes prefix blocks with its own hash"),
    "calculate_kv_scales": VllmFlag(
        bool, NOTE, "fd's int8 KV cache (--kv-cache-dtype int8) scales each token"
    ),
    "kv_sharing_fast_prefill": VllmFlag(bool, NOTE, _GPU),
    "mamba_cache_dtype": VllmFlag(str, NOTE, _MAMBA),
    "mamba_ssm_cache_dtype": VllmFlag(str, NOTE, _MAMBA),
    "mamba_block_size": VllmFlag(int, NOTE, _MAMBA),
    "mamba_cache_mode": VllmFlag(str, NOTE, _MAMBA),
    # weight offload (OffloadConfig)
    "offload_backend": VllmFlag(str, NOTE, _OFFLOAD),
    "cpu_offload_params": VllmFlag(list, NOTE, _OFFLOAD),
    "offload_group_size": VllmFlag(int, NOTE, _OFFLOAD),
    "offload_num_in_group": VllmFlag(int, NOTE, _OFFLOAD),
    "offload_prefetch_step": VllmFlag(int, NOTE, _OFFLOAD),
    "offload_params": VllmFlag(list, NOTE, _OFFLOAD),
    # multimodal (MultiModalConfig; --limit-mm-per-prompt is a serving option, --mm-processor-kwargs
    # FastDeploy's)
    "language_model_only": VllmFlag(bool, NOTE, "fd runs a vision model's text path for text-only requests"),
    "media_io_kwargs": VllmFlag(dict, NOTE, _MM),
    "mm_processor_cache_type": VllmFlag(str, NOTE, _MM),
    "mm_shm_cache_max_object_size_mb": VllmFlag(int, NOTE, _MM),
    "mm_encoder_only": VllmFlag(bool, REFUSE, "fd runs the whole model; drop --mm-encoder-only"),
    "mm_encoder_attn_backend": VllmFlag(str, NOTE, _GPU),
    "interleave_mm_strings": VllmFlag(bool, NOTE, _MM),
    "video_pruning_rate": VllmFlag(float, NOTE, "fd takes no video inputs"),
    # LoRA (LoRAConfig)
    "enable_lora": VllmFlag(bool, REFUSE, NO_LORA),
    "max_loras": VllmFlag(int, REFUSE, NO_LORA),
    "max_lora_rank": VllmFlag(int, REFUSE, NO_LORA),
    "lora_dtype": VllmFlag(str, REFUSE, NO_LORA),
    "enable_tower_connector_lora": VllmFlag(bool, REFUSE, NO_LORA),
    "max_cpu_loras": VllmFlag(int, REFUSE, NO_LORA),
    "fully_sharded_loras": VllmFlag(bool, REFUSE, NO_LORA),
    "default_mm_loras": VllmFlag(dict, REFUSE, NO_LORA),
    "specialize_active_lora": VllmFlag(bool, REFUSE, NO_LORA),
    # observability (ObservabilityConfig)
    "show_hidden_metrics_for_version": VllmFlag(str, NOTE, _METRICS),
    "otlp_traces_endpoint": VllmFlag(str, NOTE, _METRICS),
    "collect_detailed_traces": VllmFlag(list, NOTE, _METRICS),
    "kv_cache_metrics": VllmFlag(bool, NOTE, _METRICS),
    "kv_cache_metrics_sample": VllmFlag(float, NOTE, _METRICS),
    "cudagraph_metrics": VllmFlag(bool, NOTE, _METRICS),
    "enable_layerwise_nvtx_tracing": VllmFlag(bool, NOTE, _GPU),
    "enable_mfu_metrics": VllmFlag(bool, NOTE, _METRICS),
    "enable_logging_iteration_details": VllmFlag(bool, NOTE, _METRICS),
    "aggregate_engine_logging": VllmFlag(bool, NOTE, "fd logs no periodic engine statistics (/metrics)"),
    # scheduler (SchedulerConfig)
    "scheduling_policy": VllmFlag(
        str,
        REFUSE,
        "fd schedules first come, first served (a request's priority is ignored); use fcfs",
        ("fcfs",),
    ),
    "scheduler_cls": VllmFlag(str, REFUSE, _CODE),
    "disable_hybrid_kv_cache_manager": VllmFlag(bool, NOTE, "fd has one KV cache manager"),
    "async_scheduling": VllmFlag(bool, NOTE, "fd schedules each step after the last one's outputs"),
    "stream_interval": VllmFlag(int, NOTE, "fd streams every token as it is sampled", (1,)),
    "num_scheduler_steps": VllmFlag(int, NOTE, "fd schedules every step", (1,)),
    "use_v2_block_manager": VllmFlag(bool, NOTE, "fd has one block manager"),
    # the engine as a whole (VllmConfig and the rest)
    "kv_events_config": VllmFlag(dict, REFUSE, "fd publishes no KV-cache events"),
    "ec_transfer_config": VllmFlag(dict, REFUSE, "fd transfers no encoder caches"),
    "additional_config": VllmFlag(dict, NOTE, "fd reads no platform plugin settings"),
    "profiler_config": VllmFlag(dict, NOTE, "fd has no /start_profile; profile the process with py-spy"),
    "weight_transfer_config": VllmFlag(dict, REFUSE, "fd loads the weights once at start"),
    "fail_on_environ_validation": VllmFlag(bool, NOTE, "fd validates no VLLM_* environment variables"),
    "shutdown_timeout": VllmFlag(
        int, NOTE, "fd's drain on SIGTERM is --timeout-graceful-shutdown SECONDS", (0,)
    ),
    # parallelism (ParallelConfig) beyond --tensor-parallel-size / --data-parallel-size
    "decode_context_parallel_size": VllmFlag(int, REFUSE, _NO_CP, (1,)),
    "prefill_context_parallel_size": VllmFlag(int, REFUSE, _NO_CP, (1,)),
    "dcp_kv_cache_interleave_size": VllmFlag(int, NOTE, _NO_CP, (1,)),
    "cp_kv_cache_interleave_size": VllmFlag(int, NOTE, _NO_CP, (1,)),
    "all2all_backend": VllmFlag(str, NOTE, "fd's expert-parallel ranks combine experts by all-reduce"),
    "enable_dbo": VllmFlag(bool, NOTE, _GPU),
    "dbo_decode_token_threshold": VllmFlag(int, NOTE, _GPU),
    "dbo_prefill_token_threshold": VllmFlag(int, NOTE, _GPU),
    "enable_elastic_ep": VllmFlag(bool, REFUSE, "fd's ranks are fixed at start; restart with new sizes"),
    "expert_placement_strategy": VllmFlag(
        str, NOTE, "fd places each rank's experts in one contiguous block", ("linear",)
    ),
    "max_parallel_loading_workers": VllmFlag(int, NOTE, "each fd rank reads its own shard of the weights"),
    "ray_workers_use_nsight": VllmFlag(bool, NOTE, _GPU),
    "worker_cls": VllmFlag(str, REFUSE, _CODE, ("auto",)),
    "worker_extension_cls": VllmFlag(str, REFUSE, _CODE, ("",)),
    "distributed_timeout_seconds": VllmFlag(
        int, NOTE, "fd's ranks are watched by --engine-watchdog-timeout SECONDS"
    ),
}
# Table flags whose command-line value is a JSON object (parsed by merge_engine_options, as FastDeploy's).
JSON_FLAG_FIELDS = tuple(n for n, f in VLLM_FLAG_TABLE.items() if f.type is dict)
# Table flags that take several words (argparse's nargs='+').
LIST_FLAG_FIELDS = tuple(n for n, f in VLLM_FLAG_TABLE.items() if f.type is list)
# The EngineConfig fields of the table (a base class of EngineConfig), None when not given.
VllmFlagFields = dataclasses.make_dataclass(
    "VllmFlagFields",
    [(n, Optional[f.type], dataclasses.field(default=None)) for n, f in VLLM_FLAG_TABLE.items()],  # noqa: UP045
    frozen=True,
)


def _flag_given(name: str, value: Any) -> bool:
    """Given with a value fd does not always act as (False counts where True is the silent one)."""
    silent = VLLM_FLAG_TABLE[name].silent
    if isinstance(value, bool):
        return value not in silent and (value or True in silent)
    return value is not None and value not in silent


def check_vllm_flags(config: Any) -> None:
    """ConfigError for the first given table flag fd refuses, naming what to use."""
    for name, flag in VLLM_FLAG_TABLE.items():
        value = getattr(config, name)
        if flag.kind == REFUSE and _flag_given(name, value):
            shown = "" if value is True else f" {_show(value)}"
            raise ConfigError(f"--{name.replace('_', '-')}{shown} is not supported: {flag.why}")


def vllm_flag_notes(config: Any) -> list[str]:
    """One line for each given table flag that changes nothing here."""
    return [
        f"--{name.replace('_', '-')} has no effect: {flag.why}"
        for name, flag in VLLM_FLAG_TABLE.items()
        if flag.kind == NOTE and flag.why and _flag_given(name, getattr(config, name))
    ]


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)
