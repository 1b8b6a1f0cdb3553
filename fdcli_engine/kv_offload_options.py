"""The KV offload options (--swap-space, --kv-offload-compression, --kv-offload-dir,
--kv-offload-dir-gb) checked and normalized before anything loads. Leaf module (EngineConfig.validate
calls it). What each option does: docs/kv-offload.md and kv_transfer/offload."""

from __future__ import annotations

from typing import Any

from fdcli_engine.errors import need
from fdcli_engine.vllm_kv_connectors import connector_swap_space

DEFAULT_DIR_GB = 8.0
COMPRESSIONS = ("none", "int8")


def kv_offload_options(config: Any) -> dict:
    """The normalized values: swap_space in GiB (0: off), compression "int8" or None, the file tier's
    directory (None: off) and bound."""
    swap = config.swap_space or 0.0
    need(swap >= 0, f"--swap-space must be at least 0 (GiB), got {config.swap_space}")
    vllm_swap = connector_swap_space(config)  # vLLM's names of the memory tier
    if vllm_swap is not None:
        need(
            config.swap_space is None or vllm_swap == swap,
            f"--swap-space {swap:g} and vLLM's --kv-offloading-size / --kv-transfer-config "
            f"OffloadingConnector ({vllm_swap:g} GiB) ask for different memory tiers: give one",
        )
        swap = vllm_swap
    compression = config.kv_offload_compression
    if compression is not None:
        compression = str(compression).lower()
        need(
            compression in COMPRESSIONS,
            f"--kv-offload-compression {config.kv_offload_compression!r}: use none or int8",
        )
        compression = None if compression == "none" else compression
    directory = config.kv_offload_dir or None
    dir_gb = config.kv_offload_dir_gb
    if dir_gb is not None:
        need(directory is not None, "--kv-offload-dir-gb bounds the file tier: give --kv-offload-dir too")
        need(dir_gb > 0, f"--kv-offload-dir-gb must be positive, got {dir_gb}")
    tiers = swap > 0 or directory is not None
    need(
        compression is None or tiers,
        "--kv-offload-compression int8 compresses an offload tier: give --swap-space GB or --kv-offload-dir",
    )
    if tiers:
        # FastDeploy's launch lines pair -tp N with --swap-space: that runs, without the tier (one note
        # at start, kv_offload_notes); the options only fd has are refused.
        need(
            config.tensor_parallel_size == 1 or (directory is None and compression is None),
            "--kv-offload-dir and --kv-offload-compression are not supported with --tensor-parallel-size "
            "> 1 (the KV cache is split across processes)",
        )
        need(
            config.runner != "pooling",
            "KV offload (--swap-space, --kv-offload-dir) needs a generative model: --runner pooling keeps "
            "no KV cache between requests",
        )
    need(
        directory is None or config.data_parallel_size == 1,
        "--kv-offload-dir serves one engine: with --data-parallel-size > 1 use --swap-space only",
    )
    return {
        "swap_space": swap,
        "kv_offload_compression": compression,
        "kv_offload_dir": directory,
        "kv_offload_dir_gb": (dir_gb or DEFAULT_DIR_GB) if directory is not None else None,
    }


def kv_offload_enabled(config: Any) -> bool:
    """Whether the resolved options run an offload tier (see kv_offload_notes for when they do not)."""
    tiers = bool(config.swap_space) or config.kv_offload_dir is not None
    return tiers and config.tensor_parallel_size == 1


def kv_offload_notes(config: Any) -> list[str]:
    """One line per offload option that has no effect here (logged at start)."""
    if config.swap_space and config.tensor_parallel_size > 1:
        return [
            f"--swap-space {config.swap_space:g} has no effect with --tensor-parallel-size "
            f"{config.tensor_parallel_size} (the KV cache is split across processes): evicted KV blocks are "
            "dropped and recomputed when needed (outputs do not change)"
        ]
    return []
