"""Normalize HF-style config dicts so models read one spelling of each field.

transformers 5 writes `rope_parameters` ({rope_theta, rope_type, factor, ...}) where older versions
wrote `rope_theta` + `rope_scaling`; GGUF metadata is mapped to the older spelling by the loader.
After normalization: `rope_theta` (float), `rope_scaling` (dict with `rope_type`, or None), `head_dim`
(int), `num_key_value_heads` (int), `tie_word_embeddings` (bool) are always present.
"""

from __future__ import annotations


def normalize_hf_config(cfg: dict) -> dict:
    out = dict(cfg)
    rope_params = out.get("rope_parameters")
    if isinstance(rope_params, dict) and "full_attention" in rope_params:
        # Per-layer-type rope parameters (models mixing attention types): all layers here are full.
        rope_params = rope_params["full_attention"]
    if out.get("rope_theta") is None:
        theta = rope_params.get("rope_theta") if isinstance(rope_params, dict) else None
        out["rope_theta"] = float(theta) if theta is not None else 10000.0
    scaling = out.get("rope_scaling")
    if scaling is None and isinstance(rope_params, dict):
        scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
    if isinstance(scaling, dict):
        scaling = dict(scaling)
        rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
        scaling["rope_type"] = rope_type
        if rope_type == "default":
            scaling = None
    out["rope_scaling"] = scaling or None
    heads = int(out["num_attention_heads"])
    out["num_key_value_heads"] = int(out.get("num_key_value_heads") or heads)
    out["head_dim"] = int(out.get("head_dim") or int(out["hidden_size"]) // heads)
    out["tie_word_embeddings"] = bool(out.get("tie_word_embeddings", False))
    return out
