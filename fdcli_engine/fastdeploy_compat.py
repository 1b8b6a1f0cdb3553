"""FastDeploy's launch flags that mean nothing here, or name features fd has not built yet.

`python -m fastdeploy.entrypoints.openai.api_server ...` lines run as `fd serve ...`: every flag of
FastDeploy's server (EngineArgs.add_cli_args and the api_server's parser) is an fd option, an alias of
one (ALIASES), or one of COMPAT_FIELDS, and every launch line of FastDeploy's docs parses
(tests/cli/fixtures/fastdeploy_launch_lines.txt). Each option below is an `EngineConfig` field under
FastDeploy's name and value type; None means "not given". Kinds:
- meaningless on this device or in this process layout (CUDA graphs, GPU memory fraction, queue
  ports, api-server workers), or what fd always does (--enable-logprob: logprobs are always there):
  accepted, one log line each saying so (_NO_EFFECT; a value fd always acts as is silent, _FD_DOES);
- a feature fd lacks whose value would change the results (--dynamic-load-weight, a Redis scheduler,
  early stopping, custom logits processors): refused with one line naming what to use instead;
- FastDeploy's prefill/decode plumbing that fd's design replaces (`--innode-prefill-ports`: the router
  pairs instances) is accepted beside `--router` and refused, naming `--router`, without it.

Leaf module: `EngineConfig.validate` calls `check_fastdeploy_options` (pure, before paddle loads);
`config_resolver.resolve_config` logs `fastdeploy_notes` once and leaves these fields out of the
ResolvedConfig, since no process acts on them.
"""

from __future__ import annotations

from typing import Any

from fdcli_engine.errors import need

# EngineConfig fields that exist only for FastDeploy's launch lines (never in the ResolvedConfig): every
# flag of FastDeploy's server (engine/args_utils.py's EngineArgs.add_cli_args and the api_server's own
# parser) that fd has no option of its own for. Order: FastDeploy's argument groups.
COMPAT_FIELDS = (
    # server
    "workers",
    "controller_port",
    "enable_mm_output",
    "timeout",
    # model (--revision: vllm_compat.py, the same flag)
    "model_config_name",
    "tokenizer_base_url",
    "task",
    "use_warmup",
    "max_encoder_cache",
    "max_processor_cache",
    "enable_mm",
    "tool_parser_plugin",
    "dynamic_load_weight",
    "load_strategy",
    "rsync_config",
    "plas_attention_config",
    "guided_decoding_disable_any_whitespace",
    "enable_logprob",
    "enable_keep_sampling_mask",
    "logprobs_mode",
    "enable_early_stop",
    "early_stop_config",
    "lm_head_fp32",
    "logits_processors",
    "enable_entropy",
    "model_impl",
    "use_cudagraph",
    "graph_optimization_config",
    # parallel
    "enable_custom_all_reduce",
    "disable_custom_all_reduce",
    "enable_flashinfer_allreduce_fusion",
    "use_internode_ll_two_stage",
    "disable_sequence_parallel_moe",
    "gpu_memory_utilization",
    "local_data_parallel_id",
    "enable_eplb",
    "eplb_config",
    "routing_replay_config",
    "enable_chunked_moe",
    "chunked_moe_size",
    "shutdown_comm_group_if_worker_idle",
    # load, cache
    "load_choices",
    "kv_cache_ratio",
    "prealloc_dec_block_slot_num_threshold",
    "cache_queue_port",
    "static_decode_blocks",
    "kvcache_storage_backend",
    "write_policy",
    "engine_worker_queue_port",
    # performance
    "enable_output_caching",
    "max_num_partial_prefills",
    "max_long_partial_prefills",
    "long_prefill_token_threshold",
    "disable_chunked_mm_input",
    # splitwise
    "innode_prefill_ports",
    "rdma_comm_ports",
    # scheduler
    "scheduler_name",
    *(f"scheduler_{k}" for k in ("max_size", "ttl", "host", "port", "db", "password", "topic")),
    *(f"scheduler_{k}" for k in ("min_load_score", "load_shards_num", "sync_period", "expire_period")),
    "scheduler_release_load_expire_period",
    *(f"scheduler_{k}" for k in ("reader_parallel", "writer_parallel")),
    *(f"scheduler_{k}" for k in ("reader_batch_size", "writer_batch_size")),
    "enable_overlap_schedule",
)
# Options given as JSON text on the command line (FastDeploy parses them with json.loads).
JSON_FIELDS = (
    "graph_optimization_config",
    "speculative_config",  # an fd option
    "mm_processor_kwargs",  # an fd option
    "rsync_config",
    "plas_attention_config",
    "early_stop_config",
    "eplb_config",
    "routing_replay_config",
)
# FastDeploy's own name for an fd option: the same meaning under another flag.
ALIASES = {"num_gpu_blocks_override": "num_kv_blocks"}

LOAD_CHOICES = ("default", "default_v1")
MODEL_IMPLS = ("auto", "fastdeploy", "paddleformers")
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
# FastDeploy's logits processor that fd has built in: a request's logit_bias always applies here.
LOGIT_BIAS_PROCESSOR = "fastdeploy.model_executor.logits_processor:LogitBiasLogitsProcessor"
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
# FastDeploy's --quantization names that fd has no kernels for (fd has wint8, wint4 and gguf).
FASTDEPLOY_ONLY_QUANTIZATIONS = (
    "wint2",
    "w4a8",
    "w4afp8",
    "wfp8afp8",
    "block_wise_fp8",
    "tensor_wise_fp8",
    "mix_quant",
    "w8a8",
)

_MOE = "fd's MoE layers run one kernel path on CPU"
_SCHED = "fd's scheduler admits by --max-num-seqs and --max-num-batched-tokens"
# One line for each option that changes nothing here, logged when the option is given with a value
# other than the one fd always acts as (None, False and _FD_DOES's value are silent).
_NO_EFFECT = {
    "workers": "--workers has no effect: fd serves every connection from one API server process (bound by "
    "--max-concurrency)",
    "controller_port": "--controller-port has no effect: fd has no controller server",
    "enable_mm_output": "--enable-mm-output has no effect: fd's responses carry text only",
    "timeout": "--timeout has no effect: fd runs no gunicorn workers to restart (--engine-watchdog-timeout "
    "stops a frozen engine)",
    "task": "--task generate has no effect: fd picks the runner with --runner (default auto)",
    "use_warmup": "--use-warmup has no effect: fd serves without a warm-up pass",
    "max_encoder_cache": "--max-encoder-cache has no effect: fd keeps no encoder cache",
    "max_processor_cache": "--max-processor-cache has no effect: fd keeps no processor cache",
    "enable_mm": "--enable-mm has no effect: fd reads from the model's config whether it takes images",
    "load_strategy": "--load-strategy has no effect: fd loads the weights once at start",
    "rsync_config": "--rsync-config has no effect: fd loads the weights once at start",
    "enable_logprob": "--enable-logprob has no effect: logprobs are always available in fd (a request asks "
    "for them with logprobs / top_logprobs)",
    "lm_head_fp32": "--lm-head-fp32 has no effect: fd computes the LM head in float32 (a GGUF file's head "
    "keeps its own blocks)",
    "model_impl": "--model-impl has no effect: fd has one implementation of each architecture",
    "use_cudagraph": "--use-cudagraph has no effect on CPU (there are no CUDA graphs to capture)",
    "graph_optimization_config": "--graph-optimization-config has no effect on CPU (no graph capture or "
    "compilation backend here)",
    "enable_custom_all_reduce": "--enable-custom-all-reduce has no effect: fd's tensor-parallel ranks on "
    "one host always all-reduce through shared memory",
    "disable_custom_all_reduce": "--disable-custom-all-reduce has no effect: fd's tensor-parallel ranks on "
    "one host always all-reduce through shared memory",
    "enable_flashinfer_allreduce_fusion": "--enable-flashinfer-allreduce-fusion has no effect on CPU (no "
    "FlashInfer)",
    "use_internode_ll_two_stage": f"--use-internode-ll-two-stage has no effect: {_MOE}",
    "disable_sequence_parallel_moe": f"--disable-sequence-parallel-moe has no effect: {_MOE}",
    "gpu_memory_utilization": "--gpu-memory-utilization has no effect on CPU: the KV cache takes "
    "--kv-cache-memory-gb of memory (or --num-kv-blocks blocks)",
    "local_data_parallel_id": "--local-data-parallel-id 0 has no effect: one fd serve runs every "
    "--data-parallel-size rank",
    "enable_eplb": f"--enable-eplb has no effect: {_MOE} (no expert load balancing)",
    "eplb_config": f"--eplb-config has no effect: {_MOE} (no expert load balancing)",
    "enable_chunked_moe": f"--enable-chunked-moe has no effect: {_MOE}",
    "chunked_moe_size": f"--chunked-moe-size has no effect: {_MOE}",
    "shutdown_comm_group_if_worker_idle": "--shutdown-comm-group-if-worker-idle has no effect: fd loads the "
    "weights once and keeps its ranks' groups until it stops",
    "kv_cache_ratio": "--kv-cache-ratio has no effect: fd's scheduler shares one KV cache between prefill "
    "and decode",
    "prealloc_dec_block_slot_num_threshold": "--prealloc-dec-block-slot-num-threshold has no effect: fd "
    "allocates a decode block when a sequence needs it",
    "cache_queue_port": "--cache-queue-port has no effect: fd runs no cache-transfer process (a decode "
    "instance receives KV blocks on --pd-comm-port)",
    "static_decode_blocks": "--static-decode-blocks has no effect: fd allocates a decode block when a "
    "sequence needs it",
    "write_policy": "--write-policy has no effect: fd has no KV-cache storage backend (--kv-offload-dir is "
    "its file tier)",
    "engine_worker_queue_port": "--engine-worker-queue-port has no effect: the server and its engine core "
    "talk over IPC sockets, not TCP ports",
    "enable_output_caching": "--no-enable-output-caching has no effect: fd's prefix cache always keeps the "
    "full blocks of generated tokens",
    "max_num_partial_prefills": f"--max-num-partial-prefills has no effect: {_SCHED}",
    "max_long_partial_prefills": f"--max-long-partial-prefills has no effect: {_SCHED}",
    "long_prefill_token_threshold": f"--long-prefill-token-threshold has no effect: {_SCHED}",
    "disable_chunked_mm_input": "--disable-chunked-mm-input has no effect: fd prefills a prompt's images "
    "in one step",
    "innode_prefill_ports": "--innode-prefill-ports has no effect: the router (--router) pairs prefill and "
    "decode instances",
    "rdma_comm_ports": "--rdma-comm-ports has no effect: fd has no RDMA transfer (KV blocks travel by ipc "
    "or tcp)",
    "enable_overlap_schedule": "--enable-overlap-schedule has no effect: fd schedules each step after the "
    "last one's outputs",
}
# FastDeploy's scheduler tuning (its local queue and its Redis-backed global/splitwise schedulers).
SCHEDULER_TUNING = tuple(f for f in COMPAT_FIELDS if f.startswith("scheduler_") and f != "scheduler_name")
# The value of an option that is what fd always does: given, it is silent.
_FD_DOES = {
    "controller_port": -1,
    "model_config_name": "config.json",
    "logprobs_mode": "raw_logprobs",
    "scheduler_name": "local",
}


def check_fastdeploy_options(config: Any) -> None:
    """ConfigError for a value FastDeploy itself would refuse, or a feature fd has not built."""
    need(
        config.innode_prefill_ports is None or config.router is not None or config.splitwise_role == "mixed",
        "--innode-prefill-ports is not supported: fd pairs prefill and decode instances through `fd "
        "router`; start every instance with --router HOST:PORT",
    )
    need(
        config.load_choices is None or config.load_choices in LOAD_CHOICES,
        f"--load-choices {config.load_choices!r}: use default or default_v1 (fd has one loader)",
    )
    for name in ("gpu_memory_utilization", "kv_cache_ratio"):
        value = getattr(config, name)
        need(value is None or 0 < value <= 1, f"{_flag(name)} must be in (0, 1], got {value}")
    for name in ("engine_worker_queue_port", "cache_queue_port", "innode_prefill_ports", "rdma_comm_ports"):
        parse_ports(name, getattr(config, name))
    for name in JSON_FIELDS:
        value = getattr(config, name)
        need(value is None or isinstance(value, dict), f"{_flag(name)} must be a JSON object")
    _check_choices(config)
    _check_missing_features(config)


def _check_choices(config: Any) -> None:
    """Values outside FastDeploy's own choices, or choices whose result fd does not give."""
    need(
        config.model_impl is None or config.model_impl in MODEL_IMPLS,
        f"--model-impl {config.model_impl!r}: use auto, fastdeploy or paddleformers",
    )
    need(
        config.task in (None, "generate"),
        f"--task {config.task!r} is not supported: use --runner pooling (with --convert embed for a "
        "generation model) for embeddings and rewards",
    )
    need(
        config.model_config_name in (None, "config.json"),
        f"--model-config-name {config.model_config_name!r} is not supported: fd reads the model folder's "
        "config.json",
    )
    need(
        config.logprobs_mode in (None, "raw_logprobs"),
        f"--logprobs-mode {config.logprobs_mode!r} is not supported: fd returns raw_logprobs (the model's "
        "log-softmax before temperature, penalties and logit_bias)"
        if config.logprobs_mode in LOGPROBS_MODES
        else f"--logprobs-mode {config.logprobs_mode!r}: use one of {', '.join(LOGPROBS_MODES)}",
    )
    need(
        config.write_policy in (None, "write_through"),
        f"--write-policy {config.write_policy!r}: use write_through",
    )
    value = config.guided_decoding_disable_any_whitespace
    need(
        value is None or isinstance(value, bool) or str(value).lower() in _TRUE + _FALSE,
        f"--guided-decoding-disable-any-whitespace {value!r}: use true or false",
    )
    need(
        config.local_data_parallel_id in (None, 0),
        f"--local-data-parallel-id {config.local_data_parallel_id} is not supported: one fd serve runs "
        "every --data-parallel-size rank behind one port; start one server",
    )


def _check_missing_features(config: Any) -> None:
    """Options that ask for something fd has not built and that would change the results."""
    need(
        config.scheduler_name in (None, "local"),
        f"--scheduler-name {config.scheduler_name} is not supported: fd has one local scheduler per server; "
        "spread requests over servers with `fd router` (each instance started with --router HOST:PORT)",
    )
    need(
        not config.dynamic_load_weight,
        "--dynamic-load-weight is not supported: fd loads the weights once at start; restart fd serve to "
        "serve new weights",
    )
    need(
        config.tokenizer_base_url is None,
        "--tokenizer-base-url is not supported: fd tokenizes in process; use --tokenizer PATH",
    )
    need(
        config.tool_parser_plugin is None,
        "--tool-parser-plugin is not supported: fd's tool parsers are built in; use --tool-call-parser "
        "(e.g. hermes, qwen3_coder, ernie-x1; docs/tool-calling.md lists them)",
    )
    need(
        config.plas_attention_config is None,
        "--plas-attention-config is not supported: fd computes full attention (no PLAS sparse attention)",
    )
    early = config.enable_early_stop or bool((config.early_stop_config or {}).get("enable_early_stop"))
    need(
        not early,
        "early stopping (--enable-early-stop, or enable_early_stop in --early-stop-config) is not supported: fd ends a sequence at a stop string, a stop "
        "token or max_tokens; use stop or max_tokens in the request",
    )
    for name, what in (
        ("enable_keep_sampling_mask", "the sampling mask of each token"),
        ("enable_entropy", "the entropy of each token"),
    ):
        need(not getattr(config, name), f"{_flag(name)} is not supported: fd does not return {what}")
    need(
        config.routing_replay_config is None,
        "--routing-replay-config is not supported: fd does not record MoE routing",
    )
    need(
        config.kvcache_storage_backend is None,
        f"--kvcache-storage-backend {config.kvcache_storage_backend} is not supported: fd's KV blocks go to "
        "--swap-space (memory) and --kv-offload-dir DIR (files)",
    )
    others = [p for p in config.logits_processors or () if p != LOGIT_BIAS_PROCESSOR]
    need(
        not others,
        f"--logits-processors {' '.join(others)} is not supported: fd runs no custom logits processors "
        "(a request's logit_bias is built in)",
    )


def fastdeploy_notes(config: Any) -> list[str]:
    """One line for each given option that changes nothing here, saying why (logged at start)."""
    notes = []
    if config.load_choices is not None:
        notes.append(
            f"--load-choices {config.load_choices}: fd has one weight loader (HF, Paddle and GGUF "
            "checkpoints); the option has no effect"
        )
    for name, line in _NO_EFFECT.items():
        if _given(name, getattr(config, name)):
            notes.append(line)
    value = config.guided_decoding_disable_any_whitespace
    if value is not None:
        notes.append(
            f"--guided-decoding-disable-any-whitespace {value}: fd's JSON grammars never allow free "
            "whitespace between tokens (llguidance, whitespace_flexible off); the option has no effect"
        )
    if config.early_stop_config is not None:  # enabled: refused above
        notes.append("--early-stop-config has no effect: early stopping is off (fd has none)")
    if config.logits_processors:  # anything but the logit-bias processor: refused above
        notes.append("--logits-processors: fd applies a request's logit_bias without a processor; no effect")
    tuning = [_flag(n) for n in SCHEDULER_TUNING if getattr(config, n) is not None]
    if tuning:
        notes.append(
            f"{', '.join(tuning)}: no effect; they tune FastDeploy's request queue and Redis schedulers, and "
            f"{_SCHED} (--max-queue-size bounds its queue)"
        )
    return notes


def _given(name: str, value: Any) -> bool:
    if name == "enable_output_caching":
        return value is False  # True is what fd always does
    if name == "shutdown_comm_group_if_worker_idle":
        return value is not None  # either value: fd keeps its groups
    return value is not None and value is not False and value != _FD_DOES.get(name, object())


def parse_ports(name: str, value: Any) -> list[int]:
    """FastDeploy's port lists: an int, or "7013" / "7013,7014" (one port per data-parallel rank)."""
    if value is None:
        return []
    parts = [value] if isinstance(value, int) else str(value).split(",")
    try:
        ports = [int(str(p).strip()) for p in parts]
    except ValueError:
        ports = []
    need(
        bool(ports) and all(0 < p < 65536 for p in ports),
        f"{_flag(name)} must be a port or a comma-separated list of ports, got {value!r}",
    )
    return ports


def quantization_error(name: object) -> str:
    """The one-line refusal of a --quantization name fd lacks, naming the ones it has."""
    have = "auto, wint8, wint4, gguf or none"
    if str(name).lower() in FASTDEPLOY_ONLY_QUANTIZATIONS:
        return (
            f"--quantization {name} is a FastDeploy GPU method fd has no kernels for; use {have} "
            "(wint8/wint4: weight-only int8/int4, FastDeploy's names)"
        )
    return f"--quantization {name!r} is not supported: use {have}"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
