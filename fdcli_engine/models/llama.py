"""LlamaForCausalLM (Llama 2/3, SmolLM, Mistral-style dense models): the base decoder as is.
QKV bias follows `attention_bias` (false for Llama); rope scaling None, linear or llama3."""

from __future__ import annotations

from fdcli_engine.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    layer_mapping = dict(DecoderForCausalLM.layer_mapping)
