"""The resolved engine configuration: what every process runs on.

Built once, in the front end, by `config_resolver.resolve_config`; it crosses to the engine-core process
as is (msgspec, no pickle) and nothing resolves it again. Frozen: a changed setting is a new struct
(`replace`). Leaf module: imports only msgspec, the stdlib-only `threads` and the leaf `speculative_config`.

Attribute names are those of `EngineConfig` with every "auto" and None decided, plus what was read from
the model: `model_path`, `layout`, `hf_config`, `default_sampling_params`. The defaults serve test doubles and stub cores;
`resolve_config` sets every field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from fdcli_engine.speculative_config import SpeculativeConfig
from fdcli_engine.threads import usable_cpu_count


class ResolvedConfig(msgspec.Struct, frozen=True, kw_only=True):
    model: str = ""  # the --model string, or the default model's path
    model_path: Path | None = None  # the path it resolves to (a folder, or a .gguf file)
    layout: str = ""  # loader layout: "hf", "paddle" or "gguf"
    hf_config: dict = msgspec.field(default_factory=dict)  # the model's config (HF config.json keys)
    tokenizer: str | None = None
    served_model_name: str | None = None  # the first of the names given (EngineConfig.served_model_names)
    dtype: str = "float32"
    quantization: str | None = None  # "wint8", "wint4", "gguf" or None (weights as stored, fp32)
    kv_cache_dtype: str = "float32"  # "float32", "bfloat16" or "int8"
    max_model_len: int = 8192
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derived from kv_cache_memory_gb
    kv_cache_memory_gb: float = 2.0
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    seed: int = 0
    # vLLM's --enable-log-requests (and not --disable-log-requests): the front end logs each request's
    # arrival and end at INFO (request_log.py).
    log_requests: bool = False
    max_logprobs: int = 20  # request_limits.check_logprobs
    threads: int | None = None  # as given; num_threads is what the engine uses
    num_threads: int = msgspec.field(default_factory=usable_cpu_count)
    runner: str = "generate"  # "generate" | "pooling"
    convert: str = "none"  # "none" | "embed"
    pooler_config: dict | None = None  # a PoolerConfig as a dict, for the pooling runner
    mm_processor_kwargs: dict | None = None  # the image processor's overrides (processor_overrides.py)
    generation_config: str = "auto"  # as given; what it yields is default_sampling_params
    # {SamplingParams field: value} a request takes for a field it leaves out (generation_config.py):
    # the model's generation_config.json (or --generation-config's) with --override-generation-config.
    default_sampling_params: dict = msgspec.field(default_factory=dict)
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    ips: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    distributed_executor_backend: str = "mp"
    ray_address: str | None = None
    # This process's place in the topology (parallel_config.py); the front end sets them per engine process.
    data_parallel_rank: int = 0
    tensor_parallel_rank: int = 0
    cpus: list[int] | None = None  # the CPUs this engine process's threads use; None: as threads.py decides
    # Tensor parallel: every TP rank's CPUs of this engine (rank 0's first); None: split as
    # parallel_config.tp_cpu_sets decides.
    tp_rank_cpus: list[list[int]] | None = None
    engine_watchdog_timeout: float = 300.0  # seconds; 0: off (core_client.py)
    guided_decoding_backend: str = "auto"  # "auto" | "guidance" | "off" (structured_output/backend.py)
    speculative_config: SpeculativeConfig | None = None  # None: no speculative decoding
    # Prefill/decode disaggregation (kv_transfer/pd/settings.py); the token is not here (environment).
    splitwise_role: str = "mixed"
    cache_transfer_protocol: str = "ipc"
    pd_comm_port: int | None = None
    kv_transfer_host: str = "127.0.0.1"
    router: str | None = None
    # KV offload tiers (kv_offload_options.py): memory GiB (0: off), "int8" or None, file tier dir and GiB.
    swap_space: float = 0.0
    kv_offload_compression: str | None = None
    kv_offload_dir: str | None = None
    kv_offload_dir_gb: float | None = None

    def replace(self, **changes: Any) -> ResolvedConfig:
        return msgspec.structs.replace(self, **changes)

    @property
    def is_c8_kv_cache(self) -> bool:
        return self.kv_cache_dtype == "int8"

    def to_json(self) -> str:
        return _ENCODER.encode(self).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> ResolvedConfig:
        return _DECODER.decode(text)


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is Path:
        return Path(obj)
    raise NotImplementedError(f"cannot decode {kind.__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)
_DECODER = msgspec.json.Decoder(ResolvedConfig, dec_hook=_dec_hook)
