"""vLLM's KV connector options (--kv-transfer-config, --kv-offloading-size, --kv-offloading-backend) read
as fd's: what one of fd's own options does is taken as that option, the rest is refused in one line
naming fd's equivalent.

- CPU offload (vLLM's OffloadingConnector, which `--kv-offloading-backend native --kv-offloading-size GB`
  configures) is fd's memory tier, `--swap-space GB` (docs/kv-offload.md): its size is taken from
  `--kv-offloading-size` or the connector's `cpu_bytes_to_use`.
- Prefill/decode connectors (NixlConnector, P2pNcclConnector, MooncakeConnector, ...) move KV blocks
  between instances that a proxy pairs; fd pairs them with `fd router` and `--splitwise-role`
  (docs/disaggregation.md), its own transfer, so the line to use instead is named.
- LMCache and the storage connectors keep blocks outside the engine: fd's tiers are --swap-space and
  --kv-offload-dir.

Leaf module: `kv_offload_options` (EngineConfig.validate) calls `connector_swap_space`, before paddle
loads; the options themselves never reach the ResolvedConfig (vllm_compat.VLLM_FIELDS).
"""

from __future__ import annotations

from typing import Any

from fdcli_engine.errors import ConfigError, need

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
OFFLOADING_BACKENDS = ("native", "lmcache")
_GIB = 1 << 30

_ROUTER = "`fd router` with `fd serve --splitwise-role {role} --router HOST:PORT` (docs/disaggregation.md)"
_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "prefill|decode"}
_TIERS = "--swap-space GB (memory) and --kv-offload-dir DIR (files), docs/kv-offload.md"
# vLLM's connectors (vllm/distributed/kv_transfer/kv_connector/factory.py) that fd has no use for, and
# what fd has instead. Prefill/decode ones are filled in per role (_ROUTER).
_INSTEAD = {
    "NixlConnector": _ROUTER,
    "P2pNcclConnector": _ROUTER,
    "MooncakeConnector": _ROUTER,
    "MoRIIOConnector": _ROUTER,
    "LMCacheConnectorV1": f"fd's own KV tiers, {_TIERS}",
    "LMCacheMPConnector": f"fd's own KV tiers, {_TIERS}",
    "SharedStorageConnector": "fd's file tier of KV blocks, --kv-offload-dir DIR (docs/kv-offload.md)",
    "ExampleConnector": "fd's file tier of KV blocks, --kv-offload-dir DIR (docs/kv-offload.md)",
    "MultiConnector": f"one KV connector per instance: fd's own KV tiers ({_TIERS}) on a mixed instance, "
    "or its prefill/decode transfer (--splitwise-role with --router)",
}
_UNKNOWN = (
    f"fd's own KV tiers ({_TIERS}) or its prefill/decode transfer, {_ROUTER}; fd loads no connector code"
)


def connector_swap_space(config: Any) -> float | None:
    """GiB of memory tier that vLLM's options ask for (None: they ask for none); ConfigError for an
    option fd does not run, naming what to use instead."""
    from_size = _offloading_size(config)
    from_connector = _transfer_config(config.kv_transfer_config)
    need(
        from_size is None or from_connector is None or from_size == from_connector,
        f"--kv-offloading-size {config.kv_offloading_size} and --kv-transfer-config ask for different "
        "offload sizes: give one",
    )
    return from_size if from_size is not None else from_connector


def _offloading_size(config: Any) -> float | None:
    backend, size = config.kv_offloading_backend, config.kv_offloading_size
    need(
        backend is None or backend in OFFLOADING_BACKENDS,
        f"--kv-offloading-backend {backend!r}: use native (fd's memory tier, as --swap-space GB)",
    )
    need(
        backend != "lmcache",
        f"--kv-offloading-backend lmcache is not supported: use fd's own KV tiers, {_TIERS}",
    )
    need(
        backend is None or size is not None,
        "--kv-offloading-backend needs --kv-offloading-size GB (vLLM's rule); fd's flag is --swap-space GB",
    )
    need(size is None or size >= 0, f"--kv-offloading-size must be at least 0 (GiB), got {size}")
    return None if size is None else float(size)


def _transfer_config(value: Any) -> float | None:
    if value is None:
        return None
    need(isinstance(value, dict), "--kv-transfer-config must be a JSON object")
    connector, role = value.get("kv_connector"), value.get("kv_role")
    need(
        role is None or role in KV_ROLES,
        f"--kv-transfer-config kv_role {role!r}: use kv_producer, kv_consumer or kv_both",
    )
    if connector is None:  # vLLM: no connector, no transfer
        return None
    need(
        role is not None,
        f"--kv-transfer-config: kv_connector {connector} needs kv_role (kv_producer, kv_consumer or kv_both)",
    )
    if connector == "OffloadingConnector":
        return _offloading_connector(value.get("kv_connector_extra_config") or {})
    instead = _INSTEAD.get(connector, _UNKNOWN).format(role=_ROLES[role])
    raise ConfigError(f"--kv-transfer-config kv_connector {connector} is not supported: use {instead}")


def _offloading_connector(extra: Any) -> float:
    need(isinstance(extra, dict), "--kv-transfer-config kv_connector_extra_config must be a JSON object")
    size = extra.get("cpu_bytes_to_use")
    need(
        isinstance(size, (int, float)) and not isinstance(size, bool) and size >= 0,
        "--kv-transfer-config OffloadingConnector: give kv_connector_extra_config.cpu_bytes_to_use "
        "(bytes), or fd's --swap-space GB",
    )
    return size / _GIB
