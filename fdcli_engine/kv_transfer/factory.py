"""The KV connector an engine's options ask for (None: blocks never leave the pool)."""

from __future__ import annotations

GiB = 1 << 30


def make_connector(config):
    if getattr(config, "splitwise_role", "mixed") in ("prefill", "decode"):
        from fdcli_engine.kv_transfer.pd.connector import make_pd_connector

        return make_pd_connector(config)  # check_pd_options refuses an offload tier beside it
    from fdcli_engine.kv_offload_options import kv_offload_enabled

    if not kv_offload_enabled(config):
        return None
    swap, directory = config.swap_space, config.kv_offload_dir
    from fdcli_engine.kv_transfer.offload.connector import OffloadConnector

    if directory is not None:
        from fdcli_engine import prefix_hash
        from fdcli_engine.kv_transfer.offload.identity import load_or_create_key

        # Blocks named in an earlier run keep their names only under that run's key.
        prefix_hash.set_key(load_or_create_key(directory))
    return OffloadConnector(
        config,
        swap_space_bytes=int(swap * GiB),
        compression=config.kv_offload_compression,
        file_dir=directory,
        file_bytes=int((config.kv_offload_dir_gb or 0) * GiB),
    )
