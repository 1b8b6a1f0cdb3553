"""The KV connector an engine's options ask for (None: blocks never leave the pool)."""

from __future__ import annotations


def make_connector(config):
    from fdcli_engine.kv_transfer.pd.connector import make_pd_connector

    return make_pd_connector(config)  # --splitwise-role prefill|decode; None for mixed
