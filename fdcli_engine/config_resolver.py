"""The one resolver: EngineConfig (as the user gave it) -> ResolvedConfig (what every process runs on).

Runs once, in the front end (`LLM()`, `fd serve`, `fd run-batch`, the in-process client's callers); the
engine-core process receives the ResolvedConfig as is. It reads the model (layout, config.json or GGUF
metadata, a sentence-transformers folder), so it sits above the loader and the pooler configuration;
config.py and resolved_config.py import neither.
"""

from __future__ import annotations

import dataclasses
import logging

from fdcli_engine.config import EngineConfig, resolve_model_path
from fdcli_engine.fastdeploy_compat import COMPAT_FIELDS, fastdeploy_notes
from fdcli_engine.generation_config import sampling_defaults
from fdcli_engine.hf_overrides import check_hf_overrides
from fdcli_engine.kv_offload_options import kv_offload_notes
from fdcli_engine.kv_transfer.pd.settings import resolve_pd_options
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.speculative_config import parse_speculative_config
from fdcli_engine.structured_output.backend import check_backend_name
from fdcli_engine.vllm_compat import (
    MAX_MODEL_LEN_AUTO,
    VLLM_FIELDS,
    VLLM_FLAG_TABLE,
    check_load_format,
    vllm_notes,
)

logger = logging.getLogger("fd.config")

_CONTEXT_CAP = 8192  # max_model_len when not given: the model's own limit, capped here


def resolve_config(config: EngineConfig) -> ResolvedConfig:
    """Resolve the model, read its config, decide every "auto", and validate every combination."""
    from fdcli_engine.threads import import_paddle, usable_cpu_count

    # Options that need no model are refused before paddle loads (seconds saved on a typo).
    check_backend_name(config.guided_decoding_backend)
    check_hf_overrides(config.hf_overrides)
    speculative = parse_speculative_config(config.speculative_config)
    model_path = resolve_model_path(config.model, config.revision, config.download_dir)
    defaults, defaults_note = sampling_defaults(
        config.generation_config, config.override_generation_config, model_path
    )
    import_paddle()  # first import, without paddle's start-up banner; the loader imports paddle
    from fdcli_engine.loader import detect_layout, read_model_config
    from fdcli_engine.multimodal.processor import check_processor_overrides, is_multimodal_config
    from fdcli_engine.multimodal.processor_overrides import processor_notes
    from fdcli_engine.pooling.config import resolve_runner

    layout, _ = detect_layout(model_path)
    check_load_format(config.load_format, layout)
    hf_config = read_model_config(model_path, config.hf_overrides)
    config = config.replace(**resolve_runner(config, hf_config, model_path))
    if config.quantization == "auto":
        config = config.replace(quantization="gguf" if model_path.suffix.lower() == ".gguf" else None)
    model_limit = int(hf_config.get("max_position_embeddings") or _CONTEXT_CAP)
    if config.max_model_len is None:
        config = config.replace(max_model_len=min(model_limit, _CONTEXT_CAP))
    elif config.max_model_len == MAX_MODEL_LEN_AUTO:
        config = config.replace(max_model_len=model_limit)
    config = config.validate(model_limit)
    config = _resolve_nodes(config)
    _check_tensor_parallel(config, hf_config, speculative)
    notes = fastdeploy_notes(config) + vllm_notes(config) + kv_offload_notes(config)
    notes += processor_notes(config.mm_processor_kwargs, is_multimodal_config(hf_config))
    check_processor_overrides(hf_config, model_path, config.mm_processor_kwargs)
    notes += [defaults_note] if defaults_note else []
    for note in notes:  # once per start: the front end resolves
        logger.warning(note)
    dropped = (*COMPAT_FIELDS, *VLLM_FIELDS, *VLLM_FLAG_TABLE)
    values = {k: v for k, v in dataclasses.asdict(config).items() if k not in dropped}
    values["served_model_name"] = (config.served_model_names or [None])[0]
    values["log_requests"] = bool(config.enable_log_requests) and not config.disable_log_requests
    del values["kv_transfer_token"], values["override_generation_config"]  # the one in defaults
    del values["hf_overrides"]  # applied: hf_config holds them
    values.update(resolve_pd_options(config))
    values["model"] = config.model if config.model is not None else str(model_path)
    if config.tokenizer:  # a hub id resolves here, where --download-dir is known
        values["tokenizer"] = str(resolve_model_path(config.tokenizer, None, config.download_dir))
    values["speculative_config"] = speculative
    return ResolvedConfig(
        **values,
        model_path=model_path,
        layout=layout,
        hf_config=hf_config,
        num_threads=config.threads or usable_cpu_count(),
        default_sampling_params=defaults,
    )


def _check_tensor_parallel(config: EngineConfig, hf_config: dict, speculative) -> None:
    """--tensor-parallel-size T > 1: the model must split (heads, features, experts), and only the
    generate runner with at most ngram speculation runs sharded (a draft model, an MTP or EAGLE head
    would need its own lockstep ranks; a pooling model's runner has none)."""
    from fdcli_engine.errors import ConfigError
    from fdcli_engine.parallel_config import check_tensor_parallel_model

    tp = config.tensor_parallel_size
    if tp == 1:
        return
    check_tensor_parallel_model(hf_config, config)
    if config.runner == "pooling":
        raise ConfigError(f"--tensor-parallel-size {tp} runs generative models only, not --runner pooling")
    if speculative is not None and speculative.method != "ngram":
        raise ConfigError(
            f"--speculative-config method {speculative.method!r} does not run with --tensor-parallel-size "
            f"{tp}: use ngram, or --tensor-parallel-size 1"
        )


def _resolve_nodes(config: EngineConfig) -> EngineConfig:
    """Several nodes (--nnodes, or --ips): their count, this node's rank and the master address, as
    every process of this node uses them (parallel_config.resolve_nodes checks what they need)."""
    from fdcli_engine.parallel_config import resolve_nodes

    nodes = resolve_nodes(config)
    return config.replace(**nodes) if nodes else config
