"""`"method": "mtp"`: ERNIE-4.5's multi-token-prediction head drafts (models/ernie4_5_mtp.py).

The head is read from `spec.model` (a separate MTP folder, FastDeploy's "model" key) or else from the
target's own checkpoint (Paddle or HF naming); quantized as `spec.quantization`, else as the target.
Refused at start, in one line: a target that is not ERNIE-4.5, and a checkpoint without the head.

Rows of a step: head_proposer.py.
"""

from __future__ import annotations

from fdcli_engine.errors import ConfigError, ModelLoadError
from fdcli_engine.models.ernie4_5 import Ernie4_5ForCausalLM
from fdcli_engine.models.ernie4_5_mtp import Ernie4_5_MTP
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner.head_proposer import HeadProposer, head_quantization


def load_mtp_head(config: ResolvedConfig, target_model) -> Ernie4_5_MTP:
    from fdcli_engine.loader import iter_mtp_weights  # noqa: PLC0415

    if not isinstance(target_model, Ernie4_5ForCausalLM):
        arch = (config.hf_config.get("architectures") or [type(target_model).__name__])[0]
        raise ConfigError(
            f"--speculative-config: method mtp drafts with ERNIE-4.5's multi-token-prediction layer, which "
            f"{arch} does not have: use ngram (or draft_model with a smaller model of the same vocabulary)"
        )
    spec = config.speculative_config
    source = spec.model or config.model_path
    head = Ernie4_5_MTP(target_model, head_quantization(config))
    try:
        head.load_weights(iter_mtp_weights(source), str(source))
    except ModelLoadError as exc:
        hint = "" if spec.model else ' (a separate MTP folder goes in "model")'
        raise ConfigError(f"--speculative-config: method mtp: {exc}{hint}") from None
    return head


class MTPProposer(HeadProposer):
    def __init__(self, config: ResolvedConfig, target_model):
        super().__init__(config, load_mtp_head(config, target_model))
