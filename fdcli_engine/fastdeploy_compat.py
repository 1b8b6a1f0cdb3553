"""FastDeploy's launch flags that mean nothing here, or name features fd has not built yet.

`python -m fastdeploy.entrypoints.openai.api_server ...` lines run as `fd serve ...`: every flag of
FastDeploy's ERNIE-4.5 best-practice pages parses (tests/cli/fixtures/fastdeploy_launch_lines.txt).
Each option below is an `EngineConfig` field under FastDeploy's name and value type; None means "not
given". Three kinds:
- meaningless on this device or in this process layout (CUDA graphs, GPU memory fraction, queue
  ports): accepted, one log line each saying so;
- FastDeploy's prefill/decode plumbing that fd's design replaces (`--innode-prefill-ports`: the router
  pairs instances) is accepted beside `--router` and refused, naming `--router`, without it.

Leaf module: `EngineConfig.validate` calls `check_fastdeploy_options` (pure, before paddle loads);
`config_resolver.resolve_config` logs `fastdeploy_notes` once and leaves these fields out of the
ResolvedConfig, since no process acts on them.
"""

from __future__ import annotations

from typing import Any

from fdcli_engine.errors import ConfigError

# EngineConfig fields that exist only for FastDeploy's launch lines (never in the ResolvedConfig).
COMPAT_FIELDS = (
    "load_choices",
    "use_cudagraph",
    "graph_optimization_config",
    "gpu_memory_utilization",
    "kv_cache_ratio",
    "engine_worker_queue_port",
    "cache_queue_port",
    "innode_prefill_ports",
    "enable_custom_all_reduce",
)
# Options given as JSON text on the command line (FastDeploy parses them with json.loads).
JSON_FIELDS = ("graph_optimization_config", "speculative_config")  # speculative_config: an fd option
# FastDeploy's own name for an fd option: the same meaning under another flag.
ALIASES = {"num_gpu_blocks_override": "num_kv_blocks"}

LOAD_CHOICES = ("default", "default_v1")
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

_NO_EFFECT = {
    "use_cudagraph": "--use-cudagraph has no effect on CPU (there are no CUDA graphs to capture)",
    "graph_optimization_config": "--graph-optimization-config has no effect on CPU (no graph capture or "
    "compilation backend here)",
    "gpu_memory_utilization": "--gpu-memory-utilization has no effect on CPU: the KV cache takes "
    "--kv-cache-memory-gb of memory (or --num-kv-blocks blocks)",
    "kv_cache_ratio": "--kv-cache-ratio has no effect: fd's scheduler shares one KV cache between prefill "
    "and decode",
    "engine_worker_queue_port": "--engine-worker-queue-port has no effect: the server and its engine core "
    "talk over IPC sockets, not TCP ports",
    "cache_queue_port": "--cache-queue-port has no effect: fd runs no cache-transfer process (a decode "
    "instance receives KV blocks on --pd-comm-port)",
    "enable_custom_all_reduce": "--enable-custom-all-reduce has no effect: fd's tensor-parallel ranks on "
    "one host always all-reduce through shared memory",
}


def check_fastdeploy_options(config: Any) -> None:
    """ConfigError for a value FastDeploy itself would refuse, or a topology fd has not built yet."""
    _need(
        config.innode_prefill_ports is None or config.router is not None or config.splitwise_role == "mixed",
        "--innode-prefill-ports is not supported: fd pairs prefill and decode instances through `fd "
        "router`; start every instance with --router HOST:PORT",
    )
    _need(
        config.load_choices is None or config.load_choices in LOAD_CHOICES,
        f"--load-choices {config.load_choices!r}: use default or default_v1 (fd has one loader)",
    )
    for name in ("gpu_memory_utilization", "kv_cache_ratio"):
        value = getattr(config, name)
        flag = "--" + name.replace("_", "-")
        _need(value is None or 0 < value <= 1, f"{flag} must be in (0, 1], got {value}")
    for name in ("engine_worker_queue_port", "cache_queue_port", "innode_prefill_ports"):
        parse_ports(name, getattr(config, name))
    for name in JSON_FIELDS:
        value = getattr(config, name)
        flag = "--" + name.replace("_", "-")
        _need(value is None or isinstance(value, dict), f"{flag} must be a JSON object")


def fastdeploy_notes(config: Any) -> list[str]:
    """One line for each given option that changes nothing here, saying why (logged at start)."""
    notes = []
    if config.load_choices is not None:
        notes.append(
            f"--load-choices {config.load_choices}: fd has one weight loader (HF, Paddle and GGUF "
            "checkpoints); the option has no effect"
        )
    for name, line in _NO_EFFECT.items():
        value = getattr(config, name)
        if value is not None and value is not False:
            notes.append(line)
    if config.innode_prefill_ports is not None:
        notes.append(
            "--innode-prefill-ports has no effect: the router (--router) pairs prefill and decode instances"
        )
    return notes


def parse_ports(name: str, value: Any) -> list[int]:
    """FastDeploy's port lists: an int, or "7013" / "7013,7014" (one port per data-parallel rank)."""
    if value is None:
        return []
    parts = [value] if isinstance(value, int) else str(value).split(",")
    try:
        ports = [int(str(p).strip()) for p in parts]
    except ValueError:
        ports = []
    flag = "--" + name.replace("_", "-")
    _need(
        bool(ports) and all(0 < p < 65536 for p in ports),
        f"{flag} must be a port or a comma-separated list of ports, got {value!r}",
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


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)
