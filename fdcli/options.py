"""Options shared by several commands, declared once.

Pattern (Typer has no option groups):
- Every engine flag is an `Annotated` alias below (`ModelOpt`, `MaxModelLenOpt`, ...). A command that
  needs one flag uses the alias as its parameter annotation.
- A command that starts an engine (serve, run-batch, bench latency/throughput) decorates itself with
  `@engine_options`. The decorator appends all engine flags plus `--config FILE.yaml` to the command's
  signature (Typer reads `__signature__`) and calls the command with one extra keyword argument,
  `engine_args: dict`, the merged result of `engine_config_from_cli`:

      @app.command()
      @engine_options
      def serve(port: PortOpt = 8000, *, engine_args: dict) -> None:
          config = resolve_config(EngineConfig.from_dict(engine_args))

  The command must declare the keyword-only parameter `engine_args` (it is hidden from the CLI).

Invariant: every CLI default is None, meaning "not given", so that a YAML file fills what the flags left
out and explicit flags win; EngineConfig then applies its own defaults (shown in the help text).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperCommand

from fdcli.console import error_boundary
from fdcli.dotted_options import dotted_argv
from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ConfigError
from fdcli_engine.fastdeploy_compat import ALIASES, COMPAT_FIELDS, JSON_FIELDS, SCHEDULER_TUNING
from fdcli_engine.vllm_compat import (
    HUMAN_INT_FIELDS,
    JSON_FLAG_FIELDS,
    LIST_FLAG_FIELDS,
    NOTE,
    VLLM_FIELDS,
    VLLM_FLAG_TABLE,
    parse_human_int,
)

ENGINE_PANEL = "Engine options"
PARALLEL_PANEL = "Parallel engines"

ConfigFileOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--config",
        help="YAML file of engine options (keys as flag names); flags override it.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
ModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help="HF folder or .gguf file. Default: the installed SmolLM2-135M GGUF.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
TokenizerOpt = Annotated[
    Optional[str],
    typer.Option(
        "--tokenizer",
        help="Tokenizer folder or .gguf file. Default: the model's own.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
ServedModelNameOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--served-model-name",
        help="Model name(s) the API takes, as vLLM: --served-model-name a b; the first is reported in "
        "responses, all are listed by /v1/models. Default: derived from --model.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
# Sizes as vLLM reads them (32k = 32000, 32K = 32768): text here, parsed by merge_engine_options.
MaxModelLenOpt = Annotated[
    Optional[str],
    typer.Option(
        "--max-model-len",
        metavar="INTEGER",
        help="Context length (vLLM's sizes: 32k = 32000, 32K = 32768; -1 or auto: the model's limit). "
        "Default: the model's limit, capped at 8192.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
MaxNumSeqsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--max-num-seqs", help="Most sequences in one batch. (default: 64)", rich_help_panel=ENGINE_PANEL
    ),
]
MaxNumBatchedTokensOpt = Annotated[
    Optional[str],
    typer.Option(
        "--max-num-batched-tokens",
        metavar="INTEGER",
        help="Token budget of one engine step (2k, 2K as --max-model-len). (default: 2048)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
BlockSizeOpt = Annotated[
    Optional[int],
    typer.Option(
        "--block-size", help="Tokens per KV-cache block (8-128). (default: 16)", rich_help_panel=ENGINE_PANEL
    ),
]
NumKvBlocksOpt = Annotated[
    Optional[int],
    typer.Option(
        "--num-kv-blocks",
        "--num-gpu-blocks-override",
        help="KV-cache blocks (FastDeploy and vLLM: --num-gpu-blocks-override). Default: from "
        "--kv-cache-memory-gb.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
# KV offload tiers (docs/kv-offload.md).
SwapSpaceOpt = Annotated[
    Optional[float],
    typer.Option(
        "--swap-space",
        help="GiB of memory for KV blocks evicted from the cache or freed by preemption; they come back "
        "on a prefix hit or a resume. (default: 0, off)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
KvOffloadCompressionOpt = Annotated[
    Optional[str],
    typer.Option(
        "--kv-offload-compression",
        help="none or int8: store offloaded fp32/bf16 blocks as int8 codes with per-token scales (the C8 "
        "cache's encoding, ~3.8x smaller than fp32). (default: none)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
KvOffloadDirOpt = Annotated[
    Optional[str],
    typer.Option(
        "--kv-offload-dir",
        help="Directory for a file tier of KV blocks that survives a restart with the same model.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
KvOffloadDirGbOpt = Annotated[
    Optional[float],
    typer.Option(
        "--kv-offload-dir-gb",
        help="GiB the file tier may hold in --kv-offload-dir. (default: 8)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
KvCacheMemoryGbOpt = Annotated[
    Optional[float],
    typer.Option(
        "--kv-cache-memory-gb",
        help="Memory for the KV cache in GiB. (default: 2.0)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
EnablePrefixCachingOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        help="Reuse KV blocks of shared prompt prefixes. (default: enabled)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
EnableChunkedPrefillOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--enable-chunked-prefill/--no-enable-chunked-prefill",
        help="Split long prompts across steps. (default: enabled)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
SeedOpt = Annotated[
    Optional[int], typer.Option("--seed", help="Random seed. (default: 0)", rich_help_panel=ENGINE_PANEL)
]
DtypeOpt = Annotated[
    Optional[str],
    typer.Option(
        "--dtype",
        help="float32 (vLLM: float) or auto; half, float16 and bfloat16 are not supported yet. "
        "(default: float32)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
ThreadsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--threads", help="CPU threads. Default: the CPUs this process may use.", rich_help_panel=ENGINE_PANEL
    ),
]
QuantizationOpt = Annotated[
    Optional[str],
    typer.Option(
        "--quantization",
        "-q",
        help="auto (GGUF files keep their quantized blocks), gguf, wint8, wint4 or none (float32).",
        rich_help_panel=ENGINE_PANEL,
    ),
]
KvCacheDtypeOpt = Annotated[
    Optional[str],
    typer.Option(
        "--kv-cache-dtype",
        help="auto (bfloat16 for a GGUF model on its own blocks, else float32), float32, bfloat16 (values "
        "rounded to bf16: 2x the tokens per GiB, faster "
        "long-context decode), or int8: the C8 cache, int8 values with a scale per token and KV head, "
        "~3.8x more tokens per GiB. (default: auto)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
RunnerOpt = Annotated[
    Optional[str],
    typer.Option("--runner", help="auto, generate or pooling. (default: auto)", rich_help_panel=ENGINE_PANEL),
]
ConvertOpt = Annotated[
    Optional[str],
    typer.Option("--convert", help="auto, none or embed. (default: auto)", rich_help_panel=ENGINE_PANEL),
]
PoolerConfigOpt = Annotated[
    Optional[str],
    typer.Option(
        "--pooler-config",
        "--override-pooler-config",
        help='Pooler settings as JSON, e.g. \'{"pooling_type": "MEAN"}\'.',
        rich_help_panel=ENGINE_PANEL,
    ),
]
# The model's sampling defaults (fdcli_engine/generation_config.py; docs/request-fields.md).
GenerationConfigOpt = Annotated[
    Optional[str],
    typer.Option(
        "--generation-config",
        help="Sampling defaults for request fields left out: auto (the model's generation_config.json: "
        "temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens as max_tokens), vllm "
        "(fd's own), or a folder holding generation_config.json. (default: auto)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
OverrideGenerationConfigOpt = Annotated[
    Optional[str],
    typer.Option(
        "--override-generation-config",
        help="Sampling defaults as JSON over --generation-config's, e.g. '{\"temperature\": 0.5}'.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
TensorParallelSizeOpt = Annotated[
    Optional[int],
    typer.Option(
        "--tensor-parallel-size",
        "-tp",
        help="Ranks (processes) each engine's model is split over. (default: 1)",
        rich_help_panel=PARALLEL_PANEL,
    ),
]
DataParallelSizeOpt = Annotated[
    Optional[int],
    typer.Option(
        "--data-parallel-size",
        "-dp",
        help="Engine cores under one front end, each with its own KV cache and CPUs. (default: 1)",
        rich_help_panel=PARALLEL_PANEL,
    ),
]
EnableExpertParallelOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--enable-expert-parallel",
        "-ep",
        help="Shard MoE experts over the tensor-parallel ranks.",
        rich_help_panel=PARALLEL_PANEL,
    ),
]
IpsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--ips",
        help="FastDeploy's node list host1,host2 (this node among them).",
        rich_help_panel=PARALLEL_PANEL,
    ),
]
NnodesOpt = Annotated[
    Optional[int],
    typer.Option(
        "--nnodes", "-n", help="Machines the ranks spread over. (default: 1)", rich_help_panel=PARALLEL_PANEL
    ),
]
NodeRankOpt = Annotated[
    Optional[int],
    typer.Option(
        "--node-rank",
        "-r",
        help="This machine's index, 0 to nnodes-1. (default: 0)",
        rich_help_panel=PARALLEL_PANEL,
    ),
]
MasterAddrOpt = Annotated[
    Optional[str],
    typer.Option(
        "--master-addr",
        help="Rendezvous address of node 0. (default: 127.0.0.1)",
        rich_help_panel=PARALLEL_PANEL,
    ),
]
MasterPortOpt = Annotated[
    Optional[int],
    typer.Option("--master-port", help="Rendezvous port on node 0.", rich_help_panel=PARALLEL_PANEL),
]
DistributedExecutorBackendOpt = Annotated[
    Optional[str],
    typer.Option(
        "--distributed-executor-backend",
        help="mp (processes here; uni: the same with one rank) or ray (fd run-batch: Ray actors, one engine each). (default: mp)",
        rich_help_panel=PARALLEL_PANEL,
    ),
]
RayAddressOpt = Annotated[
    Optional[str],
    typer.Option(
        "--ray-address",
        help="Ray cluster to join (default: start a local one).",
        rich_help_panel=PARALLEL_PANEL,
    ),
]
EngineWatchdogTimeoutOpt = Annotated[
    Optional[float],
    typer.Option(
        "--engine-watchdog-timeout",
        help="Seconds a busy engine may make no progress before it is judged frozen: the server then "
        "fails its requests (503) and stops; 0 turns the watchdog off. (default: 300)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
SpeculativeConfigOpt = Annotated[
    Optional[str],
    typer.Option(
        "--speculative-config",
        help='Speculative decoding, a JSON object: {"method": "ngram" (or ngram_match) | "mtp" | '
        '"draft_model" | "eagle" | "eagle3", "num_speculative_tokens": N, ...}; docs/speculative-decoding.md. '
        "Outputs are those of decoding without it.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
MmProcessorKwargsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--mm-processor-kwargs",
        help="The image processor's settings for every request, as JSON: '{\"max_pixels\": 802816}' "
        "(also min_pixels, FastDeploy's image_min_pixels / image_max_pixels); a request's own "
        "mm_processor_kwargs work within them.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
HfOverridesOpt = Annotated[
    Optional[str],
    typer.Option(
        "--hf-overrides",
        help="Keys laid over the model's config (config.json, or a GGUF file's metadata) before it is "
        "read, as JSON: '{\"max_position_embeddings\": 4096}', or dotted: --hf-overrides.rope_theta 1e6. "
        "An object for a sub-config (text_config, vision_config) merges into it.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
GuidedDecodingBackendOpt = Annotated[
    Optional[str],
    typer.Option(
        "--guided-decoding-backend",
        help="Structured outputs' grammar backend: auto (llguidance), guidance, xgrammar (not available "
        "here) or off (constrained requests are a 400). (default: auto)",
        rich_help_panel=ENGINE_PANEL,
    ),
]
StructuredOutputsConfigOpt = Annotated[
    Optional[str],
    typer.Option(
        "--structured-outputs-config",
        help='vLLM\'s form, a JSON object: \'{"backend": "guidance"}\', or dotted: '
        "--structured-outputs-config.backend guidance (sets --guided-decoding-backend).",
        rich_help_panel=ENGINE_PANEL,
    ),
]

# FastDeploy's launch flags that fd has no option of its own for: every flag of FastDeploy's server is
# either an fd option or one of these (fdcli_engine.fastdeploy_compat says what each does here: most have
# no effect on CPU and say so in one log line; a feature fd lacks is refused). Names and value types are
# FastDeploy's (JSON objects and port lists arrive as text and are parsed by merge_engine_options).
COMPAT_PANEL = "FastDeploy compatibility"


def _compat(*names: str, help: str) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=COMPAT_PANEL)


_NONE = "No effect (logged)"
_CPU = "No effect on CPU (logged)."
_MOE = "No effect: one MoE kernel path on CPU (logged)."
_SCHED = "No effect: FastDeploy's scheduler tuning (logged)."
_REFUSED = "Not supported here: refused at start, naming what to use."
# field -> (value type on the command line, help). The flag is the field with dashes (FastDeploy's
# `--lm_head-fp32` arrives as --lm-head-fp32: fd serve takes underscores in flag names as dashes).
_COMPAT_TABLE: dict[str, tuple[Any, str]] = {
    "workers": (int, f"{_NONE}: one API server process serves every connection."),
    "controller_port": (int, f"{_NONE}: no controller server."),
    "enable_mm_output": (bool, f"{_NONE}: responses carry text only."),
    "timeout": (int, f"{_NONE}: no gunicorn workers (--engine-watchdog-timeout)."),
    "model_config_name": (str, "config.json (the only one fd reads)."),
    "tokenizer_base_url": (str, f"{_REFUSED} (--tokenizer)"),
    "task": (str, "generate (no effect; --runner picks the runner)."),
    "use_warmup": (int, f"{_NONE}: no warm-up pass."),
    "max_encoder_cache": (int, f"{_NONE}."),
    "max_processor_cache": (float, f"{_NONE}."),
    "enable_mm": (bool, f"{_NONE}: the model's config says whether it takes images."),
    "tool_parser_plugin": (str, f"{_REFUSED} (--tool-call-parser)"),
    "dynamic_load_weight": (bool, f"{_REFUSED} (weights load once at start)"),
    "load_strategy": (str, f"{_NONE}: weights load once at start."),
    "rsync_config": (str, f"JSON object. {_NONE}: weights load once at start."),
    "plas_attention_config": (str, f"JSON object. {_REFUSED} (full attention)"),
    "guided_decoding_disable_any_whitespace": (
        str,
        "true or false. No effect: fd's JSON never has free whitespace (logged).",
    ),
    "enable_logprob": (bool, f"{_NONE}: logprobs are always available."),
    "enable_keep_sampling_mask": (bool, _REFUSED),
    "logprobs_mode": (str, "raw_logprobs (what fd returns); other modes are refused."),
    "enable_early_stop": (bool, f"{_REFUSED} (stop / max_tokens)"),
    "early_stop_config": (str, "JSON object; enable_early_stop true is refused, otherwise no effect."),
    "lm_head_fp32": (bool, f"{_NONE}: the LM head computes in float32."),
    "logits_processors": (
        list[str],
        f"FastDeploy's LogitBiasLogitsProcessor: no effect (logit_bias is built in); others: {_REFUSED}",
    ),
    "enable_entropy": (bool, _REFUSED),
    "model_impl": (str, f"auto, fastdeploy or paddleformers. {_NONE}."),
    "use_cudagraph": (bool, _CPU),
    "graph_optimization_config": (str, f"JSON object. {_CPU}"),
    "enable_custom_all_reduce": (bool, f"{_NONE}: ranks all-reduce through shared memory."),
    "disable_custom_all_reduce": (bool, f"{_NONE}: ranks all-reduce through shared memory."),
    "enable_flashinfer_allreduce_fusion": (bool, _CPU),
    "use_internode_ll_two_stage": (bool, _MOE),
    "disable_sequence_parallel_moe": (bool, _MOE),
    "gpu_memory_utilization": (float, f"{_CPU} Size the KV cache with --kv-cache-memory-gb."),
    "local_data_parallel_id": (int, "0 (no effect); one fd serve runs every data-parallel rank."),
    "enable_eplb": (bool, _MOE),
    "eplb_config": (str, f"JSON object. {_MOE}"),
    "routing_replay_config": (str, f"JSON object. {_REFUSED}"),
    "enable_chunked_moe": (bool, _MOE),
    "chunked_moe_size": (int, _MOE),
    "shutdown_comm_group_if_worker_idle": (bool, f"{_NONE}: weights load once at start."),
    "load_choices": (str, "default or default_v1; fd has one loader (no effect)."),
    "kv_cache_ratio": (float, f"{_NONE}: one KV cache serves prefill and decode."),
    "prealloc_dec_block_slot_num_threshold": (int, f"{_NONE}."),
    "cache_queue_port": (str, f"{_NONE}: fd runs no cache-transfer process."),
    "static_decode_blocks": (int, f"{_NONE}."),
    "kvcache_storage_backend": (str, f"{_REFUSED} (--swap-space, --kv-offload-dir)"),
    "write_policy": (str, f"write_through. {_NONE}."),
    "engine_worker_queue_port": (str, f"{_NONE}: the engine core talks over IPC sockets."),
    "enable_output_caching": (bool, "Always on in fd's prefix cache (--no-…: logged, no effect)."),
    "max_num_partial_prefills": (int, _SCHED),
    "max_long_partial_prefills": (int, _SCHED),
    "long_prefill_token_threshold": (int, _SCHED),
    "disable_chunked_mm_input": (bool, f"{_NONE}."),
    "innode_prefill_ports": (str, "No effect beside --router (the router pairs the instances)."),
    "rdma_comm_ports": (str, f"{_NONE}: no RDMA (ipc or tcp)."),
    "scheduler_name": (str, "local (fd's one scheduler); global, splitwise, dp: refused (use `fd router`)."),
    "enable_overlap_schedule": (bool, f"{_NONE}."),
}
_SCHED_TYPES = {"host": str, "password": str, "topic": str, "min_load_score": float}
for _name in SCHEDULER_TUNING:
    _COMPAT_TABLE[_name] = (_SCHED_TYPES.get(_name.removeprefix("scheduler_"), int), _SCHED)
# FastDeploy's argparse.BooleanOptionalAction flags: --x and --no-x.
_BOTH_WAYS = ("enable_output_caching", "shutdown_comm_group_if_worker_idle")


def _compat_names(name: str) -> str:
    flag = name.replace("_", "-")
    return f"--{flag}/--no-{flag}" if name in _BOTH_WAYS else f"--{flag}"


COMPAT_FLAGS: dict[str, Any] = {
    name: Annotated[Optional[tp], _compat(_compat_names(name), help=text)]  # noqa: UP045
    for name, (tp, text) in _COMPAT_TABLE.items()
}
assert set(COMPAT_FLAGS) == set(COMPAT_FIELDS), "one flag per FastDeploy compatibility field"

# vLLM's launch flags (fdcli_engine.vllm_compat says what each does here: most have no effect and say
# so in one log line). Their names and value types are vLLM's. --max-logprobs has its real effect.
VLLM_PANEL = "vLLM compatibility"


def vllm_option(*names: str, help: str, **kw) -> Any:
    """A vLLM flag in the one "vLLM compatibility" help panel (fd serve, run-batch, bench)."""
    return typer.Option(*names, help=help, rich_help_panel=VLLM_PANEL, **kw)


VLLM_FLAGS: dict[str, Any] = {
    "max_logprobs": Annotated[
        Optional[int],
        vllm_option(
            "--max-logprobs",
            help="Most logprobs / top_logprobs / prompt_logprobs a request may ask "
            "for, 0-20; more is a 400. (default: 20)",
        ),
    ],
    "trust_remote_code": Annotated[
        Optional[bool],
        vllm_option("--trust-remote-code", help="No effect: fd never runs code from a checkpoint."),
    ],
    "enforce_eager": Annotated[
        Optional[bool], vllm_option("--enforce-eager", help="No effect: fd always runs eagerly on CPU.")
    ],
    "revision": Annotated[
        Optional[str],
        vllm_option(
            "--revision", help="Snapshot of a Hugging Face model id in the local cache (default main)."
        ),
    ],
    "download_dir": Annotated[
        Optional[str],
        vllm_option("--download-dir", help="Hugging Face cache to find a model id in (fd never downloads)."),
    ],
    "load_format": Annotated[
        Optional[str],
        vllm_option(
            "--load-format", help="auto, safetensors or gguf (must match the model); fd reads its format."
        ),
    ],
    "tokenizer_mode": Annotated[
        Optional[str], vllm_option("--tokenizer-mode", help="auto or hf (fd's one tokenizer).")
    ],
    "pipeline_parallel_size": Annotated[
        Optional[int],
        vllm_option(
            "--pipeline-parallel-size",
            "-pp",
            help="1 only: use --tensor-parallel-size / --data-parallel-size.",
        ),
    ],
    "chat_template_content_format": Annotated[
        Optional[str],
        vllm_option(
            "--chat-template-content-format",
            help="auto, string or openai; fd decides per message (no effect).",
        ),
    ],
    "enable_log_requests": Annotated[
        Optional[bool],
        vllm_option(
            "--enable-log-requests",
            help="Log each request's id, params and prompt length at INFO when it arrives, and when it ends.",
        ),
    ],
    "disable_log_requests": Annotated[
        Optional[bool], vllm_option("--disable-log-requests", help="Keep the request log off (the default).")
    ],
    "disable_log_stats": Annotated[
        Optional[bool],
        vllm_option("--disable-log-stats", help="No effect: fd logs no periodic stats (/metrics)."),
    ],
    "mm_processor_cache_gb": Annotated[
        Optional[float],
        vllm_option("--mm-processor-cache-gb", help="No effect: fd keeps no processor cache."),
    ],
    "disable_mm_preprocessor_cache": Annotated[
        Optional[bool],
        vllm_option("--disable-mm-preprocessor-cache", help="No effect: fd keeps no processor cache."),
    ],
    "skip_mm_profiling": Annotated[
        Optional[bool], vllm_option("--skip-mm-profiling", help="No effect: fd runs no memory profiling.")
    ],
    "mm_encoder_tp_mode": Annotated[
        Optional[str],
        vllm_option("--mm-encoder-tp-mode", help="weights or data; no effect (vision models run unsharded)."),
    ],
    "enable_mm_embeds": Annotated[
        Optional[bool], vllm_option("--enable-mm-embeds", help="Not supported: send image_url parts.")
    ],
    "cpu_offload_gb": Annotated[
        Optional[float],
        vllm_option("--cpu-offload-gb", help="No effect: fd's weights are in host memory already."),
    ],
    "data_parallel_size_local": Annotated[
        Optional[int],
        vllm_option(
            "--data-parallel-size-local",
            "-dpl",
            help="Must equal --data-parallel-size: fd runs every rank on this machine.",
        ),
    ],
    "data_parallel_start_rank": Annotated[
        Optional[int],
        vllm_option("--data-parallel-start-rank", "-dpr", help="0 only: every rank runs on this machine."),
    ],
    "data_parallel_address": Annotated[
        Optional[str],
        vllm_option("--data-parallel-address", "-dpa", help="No effect: the ranks talk over IPC here."),
    ],
    "data_parallel_rpc_port": Annotated[
        Optional[int],
        vllm_option("--data-parallel-rpc-port", "-dpp", help="No effect: the ranks talk over IPC here."),
    ],
    "data_parallel_backend": Annotated[
        Optional[str],
        vllm_option("--data-parallel-backend", "-dpb", help="mp only: the ranks are processes here."),
    ],
    "external_data_parallel_rank": Annotated[
        Optional[int],
        vllm_option("--data-parallel-rank", "-dpn", help="Refused: fd serve balances its own ranks."),
    ],
    "data_parallel_external_lb": Annotated[
        Optional[bool],
        vllm_option(
            "--data-parallel-external-lb/--no-data-parallel-external-lb",
            "-dpe",
            help="Refused: fd serve balances its own ranks.",
        ),
    ],
    "data_parallel_hybrid_lb": Annotated[
        Optional[bool],
        vllm_option(
            "--data-parallel-hybrid-lb/--no-data-parallel-hybrid-lb",
            "-dph",
            help="Refused: fd serve balances its own ranks.",
        ),
    ],
    "headless": Annotated[
        Optional[bool],
        vllm_option("--headless", help="Refused: every rank runs under one fd serve on this machine."),
    ],
    "kv_cache_memory_bytes": Annotated[
        Optional[str],
        vllm_option(
            "--kv-cache-memory-bytes",
            metavar="INTEGER",
            help="The KV cache in bytes (4G = 4 GiB, 4g = 4e9): fd's --kv-cache-memory-gb.",
        ),
    ],
    "kv_transfer_config": Annotated[
        Optional[str],
        vllm_option(
            "--kv-transfer-config",
            help="vLLM's KV connector, JSON: OffloadingConnector is --swap-space; others are refused, "
            "naming fd's equivalent.",
        ),
    ],
    "kv_offloading_size": Annotated[
        Optional[float],
        vllm_option("--kv-offloading-size", help="GiB of CPU memory for KV blocks: fd's --swap-space."),
    ],
    "kv_offloading_backend": Annotated[
        Optional[str],
        vllm_option("--kv-offloading-backend", help="native (fd's memory tier); lmcache is refused."),
    ],
}
assert set(VLLM_FLAGS) - {"max_logprobs"} == set(VLLM_FIELDS), "one flag per vLLM compatibility field"

# The rest of vLLM's flags, one option per row of vllm_compat.VLLM_FLAG_TABLE: a bool is --x/--no-x (vLLM's
# BooleanOptionalAction), a JSON object is text, nargs='+' a list; vLLM's short names beside.
_VLLM_SHORT = {
    "api_server_count": "-asc",
    "compilation_config": "-cc",
    "attention_config": "-ac",
    "decode_context_parallel_size": "-dcp",
    "prefill_context_parallel_size": "-pcp",
}
_CLI_TYPES = {dict: str, list: list[str]}


def _vllm_table_option(name: str) -> Any:
    row = VLLM_FLAG_TABLE[name]
    flag = name.replace("_", "-")
    names = [f"--{flag}/--no-{flag}" if row.type is bool else f"--{flag}"]
    names += [_VLLM_SHORT[name]] if name in _VLLM_SHORT else []
    what = "JSON object. " if row.type is dict else ""
    text = f"No effect: {row.why} (logged)." if row.kind == NOTE else f"Not supported ({row.why})."
    return Annotated[Optional[_CLI_TYPES.get(row.type, row.type)], vllm_option(*names, help=what + text)]  # noqa: UP045


VLLM_FLAGS.update({name: _vllm_table_option(name) for name in VLLM_FLAG_TABLE})

# Prefill/decode disaggregation (FastDeploy's flags; docs/disaggregation.md).
PD_PANEL = "Prefill/decode disaggregation"


def _pd(*names: str, help: str, **kw) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=PD_PANEL, **kw)


PD_FLAGS: dict[str, Any] = {
    "splitwise_role": Annotated[
        Optional[str],
        _pd("--splitwise-role", help="mixed (default), prefill or decode (behind `fd router`)."),
    ],
    "cache_transfer_protocol": Annotated[
        Optional[str],
        _pd("--cache-transfer-protocol", help="How KV blocks travel: ipc (one host, default) or tcp."),
    ],
    "pd_comm_port": Annotated[
        Optional[int],
        _pd("--pd-comm-port", help="Decode: the port KV blocks arrive on (default: a free one)."),
    ],
    "kv_transfer_host": Annotated[
        Optional[str],
        _pd(
            "--kv-transfer-host",
            help="Decode: the address the tcp transfer socket binds (default 127.0.0.1).",
        ),
    ],
    "kv_transfer_token": Annotated[
        Optional[str],
        _pd(
            "--kv-transfer-token",
            help="Shared secret of every instance's KV transfers (required off loopback). Default: "
            "$FD_KV_TRANSFER_TOKEN (prefer it: a flag is visible to every user in ps).",
            envvar="FD_KV_TRANSFER_TOKEN",
        ),
    ],
    "router": Annotated[
        Optional[str], _pd("--router", help="HOST:PORT of `fd router`: register there and heartbeat.")
    ],
}

# The serving layer's options (fdcli_engine.entrypoints.openai.serving_options), declared once for
# `fd serve` and `fd run-batch`; the served model name is the engine flag --served-model-name.
SERVING_PANEL = "Serving options"

ChatTemplateOpt = Annotated[
    Optional[str],
    typer.Option(
        "--chat-template",
        help="Chat template file (or inline Jinja) instead of the model's.",
        rich_help_panel=SERVING_PANEL,
    ),
]
ReasoningParserOpt = Annotated[
    Optional[str],
    typer.Option(
        "--reasoning-parser",
        help="Split out reasoning_content: qwen3, deepseek_r1, ernie-x1, mistral, seed_oss (docs/tool-calling.md lists every vLLM name).",
        rich_help_panel=SERVING_PANEL,
    ),
]
ToolCallParserOpt = Annotated[
    Optional[str],
    typer.Option(
        "--tool-call-parser",
        help="Parse tool calls from the output (tool_choice auto): hermes, llama3_json, mistral, pythonic, qwen3_coder, deepseek_v3, kimi_k2, glm45, ernie-x1, … (docs/tool-calling.md lists all).",
        rich_help_panel=SERVING_PANEL,
    ),
]
AutoToolChoiceOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--enable-auto-tool-choice",
        help="vLLM's switch for tool_choice auto; accepted, needs --tool-call-parser (which alone enables it).",
        rich_help_panel=SERVING_PANEL,
    ),
]
TrustTemplateOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--trust-request-chat-template",
        help="Allow requests to supply their own chat_template.",
        rich_help_panel=SERVING_PANEL,
    ),
]
StrictFieldsOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--strict-request-fields",
        help="Refuse unknown request fields with OpenAI's 400 instead of ignoring them (named in the "
        "fd-ignored-fields response header).",
        rich_help_panel=SERVING_PANEL,
    ),
]
ResponseRoleOpt = Annotated[
    Optional[str],
    typer.Option(
        "--response-role",
        help="vLLM's: role of a chat answer when the request has add_generation_prompt (its default); "
        "otherwise the answer continues the last message, in its role. (default: assistant)",
        rich_help_panel=SERVING_PANEL,
    ),
]

# --- image inputs (docs/images.md): front-end settings, carried by ServingOptions ---
AllowedLocalMediaOpt = Annotated[
    Optional[str],
    typer.Option(
        "--allowed-local-media-path",
        help="Let image_url parts read local files (file://) under this folder; off by default.",
        rich_help_panel=SERVING_PANEL,
    ),
]
AllowedMediaDomainsOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--allowed-media-domains",
        help="Hosts image_url parts may fetch from over http(s) (repeat or comma-separate); none by default.",
        rich_help_panel=SERVING_PANEL,
    ),
]
LimitMmOpt = Annotated[
    Optional[str],
    typer.Option(
        "--limit-mm-per-prompt",
        help="Most images one request may carry, as JSON: '{\"image\": 4}' (or image=4; default 16).",
        rich_help_panel=SERVING_PANEL,
    ),
]
# --- end image inputs ---

# EngineConfig field -> CLI alias. Order is the order in --help.
ENGINE_FLAGS: dict[str, Any] = {
    "model": ModelOpt,
    "tokenizer": TokenizerOpt,
    "served_model_name": ServedModelNameOpt,
    "max_model_len": MaxModelLenOpt,
    "max_num_seqs": MaxNumSeqsOpt,
    "max_num_batched_tokens": MaxNumBatchedTokensOpt,
    "block_size": BlockSizeOpt,
    "num_kv_blocks": NumKvBlocksOpt,
    "kv_cache_memory_gb": KvCacheMemoryGbOpt,
    "swap_space": SwapSpaceOpt,
    "kv_offload_compression": KvOffloadCompressionOpt,
    "kv_offload_dir": KvOffloadDirOpt,
    "kv_offload_dir_gb": KvOffloadDirGbOpt,
    "enable_prefix_caching": EnablePrefixCachingOpt,
    "enable_chunked_prefill": EnableChunkedPrefillOpt,
    "seed": SeedOpt,
    "dtype": DtypeOpt,
    "threads": ThreadsOpt,
    "quantization": QuantizationOpt,
    "kv_cache_dtype": KvCacheDtypeOpt,
    "runner": RunnerOpt,
    "convert": ConvertOpt,
    "pooler_config": PoolerConfigOpt,
    "generation_config": GenerationConfigOpt,
    "override_generation_config": OverrideGenerationConfigOpt,
    "tensor_parallel_size": TensorParallelSizeOpt,
    "data_parallel_size": DataParallelSizeOpt,
    "enable_expert_parallel": EnableExpertParallelOpt,
    "ips": IpsOpt,
    "nnodes": NnodesOpt,
    "node_rank": NodeRankOpt,
    "master_addr": MasterAddrOpt,
    "master_port": MasterPortOpt,
    "distributed_executor_backend": DistributedExecutorBackendOpt,
    "ray_address": RayAddressOpt,
    "engine_watchdog_timeout": EngineWatchdogTimeoutOpt,
    "guided_decoding_backend": GuidedDecodingBackendOpt,
    "speculative_config": SpeculativeConfigOpt,
    "mm_processor_kwargs": MmProcessorKwargsOpt,
    "hf_overrides": HfOverridesOpt,
    **PD_FLAGS,
    **COMPAT_FLAGS,
    **VLLM_FLAGS,
}
assert set(ENGINE_FLAGS) <= EngineConfig.field_names(), "every engine flag must be an EngineConfig field"
# Flags (and YAML keys) that set EngineConfig fields under another name; merge_engine_options maps them.
ENGINE_FORM_FLAGS: dict[str, Any] = {
    "structured_outputs_config": StructuredOutputsConfigOpt,
}
ALL_ENGINE_FLAGS: dict[str, Any] = {
    **ENGINE_FLAGS,
    **ENGINE_FORM_FLAGS,
}  # what a command that starts an engine takes

# vLLM's --structured-outputs-config keys: `backend` is honoured; the others are accepted and have
# no effect (one backend, so no fallback; llguidance's JSON is compact); anything else is refused.
SO_CONFIG_KEYS = ("backend", "disable_fallback", "disable_any_whitespace", "disable_additional_properties")
SO_BACKENDS = (
    "auto",
    "guidance",
    "xgrammar",
    "off",
)  # structured_output.BACKEND_NAMES (no llguidance import)


def _structured_outputs_options(merged: dict[str, Any]) -> None:
    """Map --structured-outputs-config onto guided_decoding_backend in `merged` (in place); the name
    itself is checked by EngineConfig.validate, before paddle or llguidance load."""
    if "structured_outputs_config" in merged:
        config = _parse_json("structured_outputs_config", merged.pop("structured_outputs_config"))
        unknown = sorted(set(config) - set(SO_CONFIG_KEYS))
        if unknown:
            raise ConfigError(
                f"--structured-outputs-config: unknown key(s) {', '.join(unknown)}; fd reads "
                f"{', '.join(SO_CONFIG_KEYS)} (a reasoning parser is --reasoning-parser)"
            )
        backend = config.get("backend")
        if backend is not None:
            given = merged.get("guided_decoding_backend")
            if given is not None and given != backend:
                raise ConfigError(
                    f"--structured-outputs-config backend {backend!r} contradicts "
                    f"--guided-decoding-backend {given!r}: give one"
                )
            merged["guided_decoding_backend"] = backend


# Engine options whose value is a JSON object: text on the command line, a mapping in YAML.
JSON_OPTION_FIELDS = (
    "pooler_config",
    "override_generation_config",
    "hf_overrides",
    "kv_transfer_config",
    *JSON_FIELDS,
    *JSON_FLAG_FIELDS,
)


def _load_yaml(config_file: Path) -> dict[str, Any]:
    import yaml  # lazy: only commands given --config pay for it

    try:
        text = Path(config_file).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read --config {str(config_file)!r}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {str(config_file)!r} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {str(config_file)!r} must hold a mapping of option: value")
    return data


def _parse_json(name: str, value: Any) -> Any:
    """A JSON-object option given as text (a flag) or as a mapping (YAML, keyword arguments)."""
    if value is None or isinstance(value, dict):
        return value
    flag = "--" + name.replace("_", "-")
    if not isinstance(value, str):
        raise ConfigError(f"{flag} must be a JSON object, got {value!r}")
    try:
        parsed = json.loads(value)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{flag} must be a JSON object: {exc}") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{flag} must be a JSON object")
    return parsed


def engine_config_from_cli(config_file: Path | str | None, **flags: Any) -> dict[str, Any]:
    """Merge a YAML file with CLI flags into EngineConfig keyword arguments.

    Flags that are None were not given and do not override the file. Returns a plain dict (keys with
    `_`) so a command may adjust it before building `EngineConfig.from_dict(result)`.
    """
    file_values: dict[str, Any] = {}
    if config_file is not None:
        file_values = {str(k).replace("-", "_"): v for k, v in _load_yaml(Path(config_file)).items()}
    source = f"--config {config_file}" if config_file is not None else "options"
    return merge_engine_options(file_values, flags, source)


def merge_engine_options(file_values: dict[str, Any], flags: dict[str, Any], source: str) -> dict[str, Any]:
    """File values overlaid with the given flags (None: not given), FastDeploy's aliases mapped, JSON
    options parsed, then checked: an unknown key, a wrong type (ConfigError naming the key in `source`)
    and every rule `EngineConfig.validate` checks without the model fail here, before paddle loads."""
    given = {k.replace("-", "_"): v for k, v in flags.items() if v is not None and v != []}
    merged = {**file_values, **given}
    for alias, name in ALIASES.items():
        if alias in merged:
            merged.setdefault(name, merged.pop(alias))
    for name in JSON_OPTION_FIELDS:
        if name in merged:
            merged[name] = _parse_json(name, merged[name])
    _structured_outputs_options(merged)
    for name in HUMAN_INT_FIELDS:
        if merged.get(name) is not None:
            merged[name] = parse_human_int(name, merged[name])
    names = merged.get("served_model_name")
    if isinstance(names, (list, tuple)) and len(names) == 1:  # one name stays a string, as before
        merged["served_model_name"] = names[0]
    elif isinstance(names, tuple):
        merged["served_model_name"] = list(names)
    EngineConfig.from_dict(merged, source=source).validate()
    return merged


def engine_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add every engine flag and --config to a Typer command; pass the merged dict as `engine_args`."""
    # eval_str: resolve string annotations (from __future__ import annotations) in func's own module.
    sig = inspect.signature(func, eval_str=True)
    if "engine_args" not in sig.parameters:
        raise TypeError(f"{func.__name__} must declare a keyword-only parameter `engine_args`")
    own = [p for name, p in sig.parameters.items() if name != "engine_args"]
    # A command may give one of vLLM's frontend flags of the table its own meaning (run-batch's notes).
    flags = {k: v for k, v in ALL_ENGINE_FLAGS.items() if k not in VLLM_FLAG_TABLE or k not in sig.parameters}
    clash = {p.name for p in own} & (set(flags) | {"config"})
    if clash:
        raise TypeError(f"{func.__name__} redeclares engine option(s): {', '.join(sorted(clash))}")
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=alias)
        for name, alias in {"config": ConfigFileOpt, **flags}.items()
    ]
    # Keyword-only parameters must follow positional ones in a valid signature.
    positional = [p for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        engine_kwargs = {name: kwargs.pop(name, None) for name in flags}
        config_file = kwargs.pop("config", None)
        with error_boundary():
            engine_args = engine_config_from_cli(config_file, **engine_kwargs)
        return func(*args, engine_args=engine_args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=positional + keyword + added)  # type: ignore[attr-defined]
    # get_type_hints() reads __annotations__; keep it consistent with the new signature.
    wrapper.__annotations__ = {
        p.name: p.annotation
        for p in wrapper.__signature__.parameters.values()
        if p.annotation is not inspect.Parameter.empty
    }
    del wrapper.__wrapped__  # otherwise inspect.signature would follow it back to `func`
    return wrapper


# ---- CORS (`fd serve`) -------------------------------------------------------------------------------
# vLLM's flag names. fd sends no CORS headers unless --allowed-origins is given (vLLM allows every origin
# by default): a server on loopback should not be callable from whatever web page its user has open.
CORS_PANEL = "CORS options"
CORS_LIST_KEYS = ("allowed_origins", "allowed_methods", "allowed_headers")

AllowedOriginsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--allowed-origins",
        help="Origins browsers may call from, a JSON list, e.g. '[\"http://localhost:3000\"]' or '[\"*\"]'. "
        "(default: none, no CORS headers)",
        rich_help_panel=CORS_PANEL,
    ),
]
AllowedMethodsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--allowed-methods",
        help='HTTP methods allowed cross-origin, a JSON list. (default: ["*"])',
        rich_help_panel=CORS_PANEL,
    ),
]
AllowedHeadersOpt = Annotated[
    Optional[str],
    typer.Option(
        "--allowed-headers",
        help='Request headers allowed cross-origin, a JSON list. (default: ["*"])',
        rich_help_panel=CORS_PANEL,
    ),
]
AllowCredentialsOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--allow-credentials",
        help="Allow cookies and authorization headers cross-origin. (default: off)",
        rich_help_panel=CORS_PANEL,
    ),
]


def parse_cors_list(key: str, value: Any) -> list[str]:
    """A CORS list option: a JSON list as text (the flag) or a YAML list; ConfigError if neither."""
    flag = "--" + key.replace("_", "-")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"{flag} must be a JSON list of strings, e.g. '[\"*\"]'") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{flag} must be a JSON list of strings, e.g. '[\"*\"]'")
    return value


# ---- vLLM's and FastDeploy's command-line habits ---------------------------------------------------
# Options vLLM declares with nargs='+': `--served-model-name a b` takes every word up to the next option.
MULTI_VALUE_FLAGS = ("--served-model-name", *("--" + n.replace("_", "-") for n in LIST_FLAG_FIELDS))


class EngineCommand(TyperCommand):
    """The class of every command that takes the engine options. Before click parses, it takes
    `--load_choices` for `--load-choices`, as FastDeploy's and vLLM's parsers do (FastDeploy's pages
    spell some flags with underscores; only option names change, never values), and spreads vLLM's
    multi-value options, `--served-model-name a b`, into repeated ones (argparse's nargs='+': greedy up
    to the next option, so a positional MODEL goes before it, as with vLLM), and folds vLLM's dotted
    keys of a JSON option, `--structured-outputs-config.backend guidance`, into its JSON
    (fdcli/dotted_options.py)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        try:
            args = engine_argv(args)
        except ValueError as exc:
            ctx.fail(str(exc))  # a usage error: one line, exit 2 (fdcli.console.FdGroup)
        return super().parse_args(ctx, args)


# Options whose value is a JSON object, which vLLM's dotted form may build: `--limit-mm-per-prompt.image
# 2` is `--limit-mm-per-prompt '{"image": 2}'`.
DOTTED_FLAGS = frozenset(
    "--" + n.replace("_", "-")
    for n in (*JSON_OPTION_FIELDS, "structured_outputs_config", "limit_mm_per_prompt")
)
# Options whose value may be left out (argparse's nargs='?'), and the value they then take.
BARE_VALUE = {"--hf-token": "true"}


def engine_argv(args: list[str]) -> list[str]:
    args = dotted_argv(args, DOTTED_FLAGS)
    out: list[str] = []
    multi: str | None = None  # the multi-value option whose words are being read
    wordless = False  # `multi` has no word yet
    for i, arg in enumerate(args):
        if wordless and (arg == "--" or arg.startswith("-") and len(arg) > 1):
            raise ValueError(f"Option '{multi}' requires an argument.")  # click's wording
        if arg == "--":  # everything after it is an argument, not an option
            return out + args[i:]
        if arg.startswith("--") and "_" in arg.partition("=")[0]:
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        if arg in BARE_VALUE and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out += [arg, BARE_VALUE[arg]]
            continue
        if arg.startswith("-") and len(arg) > 1:
            multi = arg if arg in MULTI_VALUE_FLAGS else None
            wordless = multi is not None
            if wordless:
                continue
        elif multi is not None:
            out.append(multi)
            wordless = False
        out.append(arg)
    if wordless:
        raise ValueError(f"Option '{multi}' requires an argument.")
    return out


ModelTagArg = Annotated[
    Optional[str],
    typer.Argument(
        metavar="[MODEL]",
        help="The model, as vLLM's `vllm serve MODEL` (the same as --model).",
        show_default=False,
    ),
]


def with_model_tag(flags: dict[str, Any], model_tag: str | None) -> dict[str, Any]:
    """`fd serve MODEL`: the positional model fills --model; both given and different is an error."""
    if model_tag is None:
        return flags
    model = flags.get("model")
    if model is not None and model != model_tag:
        raise ConfigError(f"the model is given twice, as {model_tag!r} and --model {model!r}: give one")
    return {**flags, "model": model_tag}
