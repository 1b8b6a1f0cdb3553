"""Ernie4_5ForCausalLM (ERNIE-4.5-0.3B): the Llama decoder with ERNIE's interleaved rotary.

ERNIE rotates pairs of *adjacent* elements (2i, 2i+1) of each head by angle p * f_i (GPT-J style),
where fd's rotary op (and its C++ kernel) rotates element i with element i + head_dim/2 (NeoX). The
two are the same rotation on a permuted head: if every q and k head is reordered as
[0, 2, 4, .., hd-2, 1, 3, .., hd-1], element 2i lands on i and 2i+1 on i + hd/2, so NeoX rotary on the
permuted vectors equals ERNIE's rotary permuted the same way. Attention only uses dot products
q.k within a head, which a common permutation leaves unchanged, and v is not permuted, so the output
is exact. The permutation is applied once to the q_proj/k_proj rows at load time: no rotary variant
and no kernel change are needed.

Other differences from Llama: `rope_theta` defaults to 500000 and `tie_word_embeddings` to true when
a config omits them (the transformers/ERNIE defaults); `use_bias` (bias on every projection) is not
supported, as no released ERNIE-4.5 text model uses it. The Paddle "-Paddle" layout is renamed and
transposed into these HF names by `fdcli_engine.loader.paddle_layout`, so this class sees one layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.models.decoder import DecoderForCausalLM
from fdcli_engine.resolved_config import ResolvedConfig

ERNIE_ROPE_THETA = 500000.0


def ernie_defaults(hf_config: dict) -> dict:
    """The config with ERNIE's defaults for fields a checkpoint may leave out."""
    cfg = dict(hf_config)
    has_theta = cfg.get("rope_theta") is not None or isinstance(cfg.get("rope_parameters"), dict)
    if not has_theta:
        cfg["rope_theta"] = ERNIE_ROPE_THETA
    cfg.setdefault("tie_word_embeddings", True)
    if cfg.get("use_bias"):
        raise ModelLoadError("ERNIE-4.5 with use_bias=true is not supported by fd")
    return cfg


def interleaved_to_neox_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Reorder the rows of a q/k projection [num_heads * hd, in] (or its bias [num_heads * hd]) from
    ERNIE's interleaved rotary pairs to NeoX halves: per head, rows 0,2,4,.. then 1,3,5,.."""
    out_features = weight.shape[0]
    head_dim = out_features // num_heads
    tail = weight.shape[1:]
    w = weight.reshape(num_heads, head_dim // 2, 2, *tail).swapaxes(1, 2)
    return np.ascontiguousarray(w.reshape(out_features, *tail))


def resolve_quantization(quantization: str | None) -> str | None:
    """An EngineConfig handed to a model unresolved (tests) may say "auto"/"none": the weights as stored."""
    return None if quantization in ("auto", "none") else quantization


class Ernie4_5ForCausalLM(DecoderForCausalLM):
    layer_mapping = dict(DecoderForCausalLM.layer_mapping)

    def __init__(self, hf_config: dict, engine_config: ResolvedConfig):
        super().__init__(ernie_defaults(hf_config), engine_config)

    def qkv_bias(self, cfg: dict) -> bool:
        return False

    def _check_supported(self, cfg: dict) -> None:
        super()._check_supported(cfg)
        if int(cfg["head_dim"]) % 2:
            raise ModelLoadError(f"head_dim {cfg['head_dim']} must be even for rotary embeddings")

    def load_weights(self, weights: Iterable[tuple[str, np.ndarray]]) -> None:
        super().load_weights(self._permute_rotary(weights))

    def _permute_rotary(self, weights: Iterable[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
        for name, array in weights:
            if name.endswith("self_attn.q_proj.weight"):
                array = self._permute_checked(name, array, self.num_heads)
            elif name.endswith("self_attn.k_proj.weight"):
                array = self._permute_checked(name, array, self.total_num_kv_heads)
            yield name, array

    def _permute_checked(self, name: str, array: np.ndarray, num_heads: int) -> np.ndarray:
        if array.ndim != 2 or array.shape[0] != num_heads * self.head_dim:
            # Let the layer's own shape check name the tensor and the expected shape.
            return array
        return interleaved_to_neox_rows(array, num_heads)
