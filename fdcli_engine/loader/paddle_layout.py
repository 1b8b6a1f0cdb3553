"""FastDeploy's "-Paddle" checkpoint layout (baidu/ERNIE-4.5-*-Paddle): config.json + safetensors
(usually sharded, with model.safetensors.index.json) holding Paddle parameter names, where every
Linear weight is stored [in_features, out_features] and several projections are fused.

The reader renames and transposes each tensor into the HF ("-PT") names and [out, in] shapes that fd's
models declare, so models know one layout:

    Paddle name (prefix ernie.layers.{i}.)         shape              HF name(s) (prefix model.layers.{i}.)
    ernie.embed_tokens.weight                      [vocab, hidden]    model.embed_tokens.weight (as is)
    ernie.norm.weight, *layernorm.weight           [hidden]           model.norm.weight, ... (as is)
    lm_head.weight                                 [hidden, vocab]    lm_head.weight, transposed
    self_attn.qkv_proj.weight                      [hidden, q+2kv]    self_attn.{q,k,v}_proj.weight: transposed,
                                                                      rows split [q | k | v]
    self_attn.{q,k,v,o}_proj.weight                [in, out]          same name, transposed
    mlp.up_gate_proj.weight (also in experts.{e}.  [hidden, 2I]       mlp.gate_proj / mlp.up_proj: transposed,
      and shared_experts.)                                            rows split [gate | up] (gate first: the
                                                                      fused op applies SiLU to the first half)
    mlp.{gate,up,down}_proj.weight (idem)          [in, out]          same name, transposed
    mlp.gate.weight (router)                       [hidden, E]        mlp.gate.weight [E, hidden]
    mlp.moe_statics.e_score_correction_bias        [1, E]             same name, as is
    ernie.mtp_* (multi-token-prediction head)      as above           model.mtp_*, converted by the same rules
                                                                      (mtp_linear_proj.0 [2H, H] -> [H, 2H]);
                                                                      the target ignores them, the mtp
                                                                      proposer loads them (models/ernie4_5_mtp)

A folder is this layout when its tensor names start with "ernie." (HF folders use "model.").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.loader.hf import iter_hf_weights, safetensors_files
from fdcli_engine.loader.safetensors_io import read_safetensors_header

PADDLE_PREFIX = "ernie."


def _index_names(index: Path) -> list[str]:
    try:
        return list(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{index}: invalid safetensors index ({exc})") from None


def is_paddle_folder(path: Path) -> bool:
    """True for a config.json folder whose safetensors use Paddle (`ernie.`) names. Reads the index,
    or safetensors headers until one names a decoder tensor (no tensor data is read)."""
    if not (path.is_dir() and (path / "config.json").is_file()):
        return False
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return any(name.startswith(PADDLE_PREFIX) for name in _index_names(index))
    for file in sorted(path.glob("*.safetensors")):
        names = read_safetensors_header(file)[0]
        if any(name.startswith(PADDLE_PREFIX) for name in names):
            return True
        if any(name.startswith("model.") for name in names):
            return False
    return False


def iter_paddle_weights(
    path: Path, cfg: dict, quantization: str | None = None, keep=None
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (HF name, fp32 [out, in]) for every tensor of a -Paddle folder (`cfg`: its config, as
    loader.read_model_config gives it; `keep`: a predicate on the Paddle names, see iter_safetensors)."""
    if quantization == "gguf":
        raise ModelLoadError(f"{path}: --quantization gguf keeps GGUF blocks and needs a .gguf model")
    try:
        num_heads = int(cfg["num_attention_heads"])
        num_kv_heads = int(cfg.get("num_key_value_heads") or num_heads)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path / 'config.json'}: invalid attention head counts ({exc})") from None
    safetensors_files(path)  # the index's shards must all exist before anything is yielded
    for name, array in iter_hf_weights(path, keep):
        try:
            yield from convert_tensor(name, array, num_heads, num_kv_heads)
        except ValueError as exc:
            raise ModelLoadError(f"{path}: tensor {name}: {exc}") from None


def convert_tensor(
    name: str, array: np.ndarray, num_heads: int, num_kv_heads: int
) -> Iterator[tuple[str, np.ndarray]]:
    """The HF (name, array) pairs one Paddle tensor becomes (see the module table)."""
    if name.startswith(PADDLE_PREFIX):
        hf_name = "model." + name[len(PADDLE_PREFIX) :]
    else:  # lm_head.weight; an MTP head saved on its own may lack the prefix
        hf_name = "model." + name if name.startswith("mtp_") else name
    if array.ndim != 2 or not hf_name.endswith(".weight") or hf_name == "model.embed_tokens.weight":
        yield hf_name, array  # norms, biases, the correction bias, the embedding table
        return
    w = np.ascontiguousarray(array.T)  # [in, out] -> [out, in]
    stem = hf_name[: -len(".weight")]
    if stem.endswith(".qkv_proj"):
        base = stem[: -len("qkv_proj")]
        # The fused output is [q heads | k heads | v heads], each head head_dim wide.
        if w.shape[0] % (num_heads + 2 * num_kv_heads):
            raise ValueError(
                f"{w.shape[0]} fused outputs do not split into {num_heads}+2x{num_kv_heads} heads"
            )
        head_dim = w.shape[0] // (num_heads + 2 * num_kv_heads)
        q, kv = num_heads * head_dim, num_kv_heads * head_dim
        yield base + "q_proj.weight", w[:q]
        yield base + "k_proj.weight", w[q : q + kv]
        yield base + "v_proj.weight", w[q + kv :]
    elif stem.endswith(".up_gate_proj"):
        base = stem[: -len("up_gate_proj")]
        if w.shape[0] % 2:
            raise ValueError(f"fused up_gate_proj has an odd number of outputs ({w.shape[0]})")
        half = w.shape[0] // 2
        yield base + "gate_proj.weight", w[:half]
        yield base + "up_proj.weight", w[half:]
    else:
        yield hf_name, w  # plain Linear (q/k/v/o, gate/up/down, router, lm_head): [in, out] -> [out, in]
