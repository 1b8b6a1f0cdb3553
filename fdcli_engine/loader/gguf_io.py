"""GGUF files (llama.cpp): metadata -> HF-style config, tensors -> HF names.

Tensors come out either dequantized to fp32 [out, in] (what the reference ops use) or as the raw
quantized block rows (what int8/int4 kernels may consume). llama.cpp's converter permutes the rows of
Llama's q/k projections for its interleaved rotary; both paths undo that so that HF's rotate-half
rotary applies. Rows are whole blocks along `in`, so the same row permutation works on raw blocks.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fdcli_engine.errors import ModelLoadError

GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# GGUF architectures whose q/k rows llama.cpp permuted at conversion (Qwen uses NeoX rotary: no permute).
_PERMUTED_QK = {"llama"}

_TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
# ggml block types the native linear consumes as they are (Q4_0, Q4_1, Q8_0); others are dequantized.
KEEP_QUANTIZED_TYPES = {2, 3, 8}
# Tensors consumed by a linear op: projections, the LM head, and the token embedding (the tied head).
_LINEAR_SUFFIXES = ("_proj.weight", "lm_head.weight", "embed_tokens.weight")


@dataclass
class QuantizedTensor:
    """A linear weight kept as GGUF blocks: `raw` uint8 [out, bytes_per_row], rows already in HF order.
    `shape` is the logical HF shape [out, in], so layers can check it like an array's."""

    raw: np.ndarray
    ggml_type: int
    shape: tuple

    def dequantize(self) -> np.ndarray:
        from gguf.quants import dequantize  # noqa: PLC0415

        return np.asarray(dequantize(self.raw, self.ggml_type), dtype=np.float32).reshape(self.shape)


@functools.lru_cache(maxsize=2)
def _open(path_str: str, mtime_ns: int, size: int):
    # Parsing the header (the vocabulary's arrays) is slow: config reading and weight loading share it.
    from gguf import GGUFReader  # noqa: PLC0415 - heavy import, only for GGUF models

    try:
        return GGUFReader(path_str)
    except Exception as exc:  # GGUFReader raises ValueError, IndexError, struct errors on bad files
        raise ModelLoadError(
            f"{path_str}: not a valid GGUF file or truncated ({type(exc).__name__}: {exc})"
        ) from None


def release_gguf_readers() -> None:
    """Drop cached readers (and their file mappings) once the weights are loaded: pages of the file the
    loader touched would otherwise stay mapped, and counted in RSS, for the life of the process."""
    _open.cache_clear()


def open_gguf(path: Path):
    st = path.stat()
    return _open(str(path), st.st_mtime_ns, st.st_size)


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def read_gguf_config(path: Path) -> dict:
    reader = open_gguf(path)
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    tensor_names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in tensor_names:
        raise ModelLoadError(f"{path}: GGUF rope_freqs (Llama 3.1 rope scaling) is not supported yet")

    def get(key, default=None):
        return _field(reader, f"{arch}.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    # The embedding's row count is what the weights hold; metadata and token lists may disagree with it.
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise ModelLoadError(f"{path}: GGUF file has no token_embd.weight tensor")
    vocab = int(embd.shape[-1])
    cfg = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": _f32(get("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(get),
        "max_position_embeddings": int(get("context_length", 8192)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    return cfg


def _f32(value) -> float:
    # GGUF stores these as float32: 1e-5 reads back as 9.9999997e-06. The shortest float32 repr gives
    # back the value the original config.json held.
    return float(str(np.float32(value)))


def _rope_scaling(get) -> dict | None:
    kind = get("rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    return {"rope_type": str(kind)}  # RotaryEmbedding rejects it with a clear message


def gguf_to_hf_name(name: str) -> str | None:
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    m = _LAYER_RE.match(name)
    if m is None or m.group(2) not in _LAYER:
        return None
    return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"


def unpermute_qk(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: within each head, rows (2j, 2j+1) back to (j, j + hd/2).
    Works on fp32 [out, in] and on raw block rows [out, bytes] alike."""
    out = rows.shape[0]
    rest = rows.shape[1:]
    r = rows.reshape(num_heads, out // num_heads // 2, 2, *rest).swapaxes(1, 2)
    return np.ascontiguousarray(r.reshape(out, *rest))


def iter_gguf_tensors(
    path: Path, dequantize: bool = True, names: set[str] | None = None
) -> Iterator[tuple[str, np.ndarray, int, tuple]]:
    """Yield (hf_name, array, ggml_type, shape): shape is the logical HF shape ([out, in] or [n]);
    array is fp32 of that shape when dequantize, else the raw data (block rows for quantized types).
    `names` restricts the walk to those HF names (the others are not read)."""
    from gguf.quants import dequantize as gguf_dequantize  # noqa: PLC0415

    reader = open_gguf(path)
    cfg = read_gguf_config(path)
    permute = cfg["model_type"] in _PERMUTED_QK
    for t in reader.tensors:
        hf_name = gguf_to_hf_name(t.name)
        if hf_name is None or (names is not None and hf_name not in names):
            continue
        shape = tuple(int(x) for x in reversed(t.shape))
        try:
            array = gguf_dequantize(t.data, t.tensor_type) if dequantize else t.data
            if dequantize:
                array = np.asarray(array, dtype=np.float32).reshape(shape)
        except (NotImplementedError, ValueError, IndexError) as exc:
            raise ModelLoadError(
                f"{path}: cannot read tensor {t.name} ({type(exc).__name__}: {exc})"
            ) from None
        if permute and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if "q_proj" in hf_name else cfg["num_key_value_heads"]
            array = unpermute_qk(array, heads)
        yield hf_name, array, int(t.tensor_type), shape


def iter_gguf_weights(path: Path, quantization: str | None = None) -> Iterator[tuple[str, object]]:
    """(HF name, fp32 array); with quantization "gguf", linear weights of a block type the kernels
    read directly come as QuantizedTensor instead (norms, embeddings and other types: fp32)."""
    if quantization != "gguf":
        for hf_name, array, _, _ in iter_gguf_tensors(path, dequantize=True):
            yield hf_name, array
        return
    for hf_name, raw, ggml_type, shape in iter_gguf_tensors(path, dequantize=False):
        if ggml_type in KEEP_QUANTIZED_TYPES and hf_name.endswith(_LINEAR_SUFFIXES):
            yield hf_name, QuantizedTensor(np.ascontiguousarray(raw), ggml_type, shape)
        else:
            yield hf_name, QuantizedTensor(raw, ggml_type, shape).dequantize()
