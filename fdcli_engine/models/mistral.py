"""MistralForCausalLM: the Llama decoder. Mistral 7B v0.1 used sliding-window attention, which fd does not
implement; a config whose window is shorter than its context is refused rather than run with full
attention (which would give different outputs past the window)."""

from __future__ import annotations

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.models.decoder import DecoderForCausalLM


class MistralForCausalLM(DecoderForCausalLM):
    layer_mapping = dict(DecoderForCausalLM.layer_mapping)

    def _check_supported(self, cfg: dict) -> None:
        super()._check_supported(cfg)
        window = cfg.get("sliding_window")
        context = int(cfg.get("max_position_embeddings") or 0)
        if window is not None and int(window) < context:
            raise ModelLoadError(
                f"sliding_window={window} (< max_position_embeddings={context}) is not supported: "
                "fd implements full attention only"
            )
