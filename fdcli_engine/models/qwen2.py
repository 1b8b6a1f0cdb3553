"""Qwen2ForCausalLM: the Llama decoder with a bias on q/k/v projections (always, whatever
`attention_bias` says: Qwen2 configs do not carry that key)."""

from __future__ import annotations

from fdcli_engine.models.decoder import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    layer_mapping = dict(DecoderForCausalLM.layer_mapping)

    def qkv_bias(self, cfg: dict) -> bool:
        return True
