"""Placeholder of the base commit: the mtp proposer is being written (issue #24)."""

from __future__ import annotations

from fdcli_engine.errors import ConfigError
from fdcli_engine.runner.proposer import Proposer


class MTPProposer(Proposer):
    def __init__(self, config, target_model):
        raise ConfigError("--speculative-config: method mtp is not built yet")
