"""BertModel: the bidirectional encoder behind sentence-transformers embedding models (all-MiniLM-L6-v2).

Returns the last hidden states [T, hidden] of a varlen batch (sequences laid out as in
AttentionMetadata); pooling and normalization belong to the runner's pooler. An encoder sees each whole
sequence in one step: it keeps no KV cache, and a chunked sequence (cached tokens) is an error.
Token types are 0 unless the runner passes `token_type_ids` (a text pair scored by a cross-encoder:
segment B is type 1).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import paddle
import paddle.nn.functional as F

from fdcli_engine import ops
from fdcli_engine.errors import InvalidRequestError, ModelLoadError
from fdcli_engine.layers import Linear, MergedLinear
from fdcli_engine.resolved_config import ResolvedConfig

logger = logging.getLogger(__name__)


class LayerNorm:
    def __init__(self, hidden_size: int, eps: float):
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = self.bias = None

    @property
    def is_loaded(self) -> bool:
        return self.weight is not None and self.bias is not None

    def load_part(self, kind: str, array: np.ndarray) -> None:
        if tuple(array.shape) != (self.hidden_size,):
            raise ValueError(f"layer norm {kind} shape {tuple(array.shape)} != ({self.hidden_size},)")
        setattr(self, kind, paddle.to_tensor(np.asarray(array, dtype=np.float32)))

    def add(self, x, residual):
        """layer_norm(x + residual): BERT normalizes after each residual add (post-norm)."""
        return ops.add_layer_norm(x, residual, self.weight, self.bias, self.eps)


class BertLayer:
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, quantization):
        self.num_heads, self.head_dim = heads, hidden // heads
        self.qkv = MergedLinear(hidden, [hidden] * 3, True, quantization)  # shards: query, key, value
        self.attn_out = Linear(hidden, hidden, True, quantization)
        self.attn_norm = LayerNorm(hidden, eps)
        self.intermediate = Linear(hidden, intermediate, True, quantization)
        self.output = Linear(intermediate, hidden, True, quantization)
        self.out_norm = LayerNorm(hidden, eps)

    def __call__(self, x, cu_seqlens):
        num_tokens, hidden = x.shape
        qkv = self.qkv(x)
        # Column views of the fused projection, [T, nh, hd] each: the kernel reads them in place.
        q, k, v = (
            qkv[:, i * hidden : (i + 1) * hidden].reshape([num_tokens, self.num_heads, self.head_dim])
            for i in range(3)
        )
        attn = ops.varlen_attention(q, k, v, cu_seqlens, self.head_dim**-0.5).reshape([num_tokens, hidden])
        x = self.attn_norm.add(self.attn_out(attn), x)
        return self.out_norm.add(self.output(ops.gelu(self.intermediate(x))), x)


_LAYER_NAMES = {
    "attention.self.query": ("qkv", 0),
    "attention.self.key": ("qkv", 1),
    "attention.self.value": ("qkv", 2),
    "attention.output.dense": ("attn_out", 0),
    "attention.output.LayerNorm": ("attn_norm", None),
    "intermediate.dense": ("intermediate", 0),
    "output.dense": ("output", 0),
    "output.LayerNorm": ("out_norm", None),
}
# Entries that are not parameters of the encoder (buffers, the unused [CLS] pooler, MLM heads).
_IGNORED_PREFIXES = ("embeddings.position_ids", "pooler.", "cls.")


class BertModel:
    is_pooling_model = True

    def __init__(self, hf_config: dict, engine_config: ResolvedConfig):
        cfg = hf_config
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ModelLoadError(f"BERT hidden_act {cfg.get('hidden_act')!r} is not supported: expected gelu")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ModelLoadError("BERT position_embedding_type other than absolute is not supported")
        self.hidden_size = int(cfg["hidden_size"])
        self.num_layers = int(cfg["num_hidden_layers"])
        self.num_heads = self.num_kv_heads = int(cfg["num_attention_heads"])
        self.head_dim = self.hidden_size // self.num_heads
        self.vocab_size = int(cfg["vocab_size"])
        self.max_position = int(cfg.get("max_position_embeddings", 512))
        eps = float(cfg.get("layer_norm_eps", 1e-12))
        quant = engine_config.quantization
        inter = int(cfg["intermediate_size"])
        self.layers = [
            BertLayer(self.hidden_size, self.num_heads, inter, eps, quant) for _ in range(self.num_layers)
        ]
        self.emb_norm = LayerNorm(self.hidden_size, eps)
        self.word_embeddings = self.position_embeddings = self.token_type0 = None
        self.token_type_delta = None  # token type 1 minus type 0: added to the rows of segment B
        self.position_type0 = None  # position_embeddings + token_type0, set once the weights are loaded

    def load_weights(self, weights: Iterable[tuple[str, np.ndarray]]) -> None:
        for name, array in weights:
            name = name.removeprefix("bert.").replace("LayerNorm.gamma", "LayerNorm.weight")
            name = name.replace("LayerNorm.beta", "LayerNorm.bias")
            if name.startswith(_IGNORED_PREFIXES):
                continue
            try:
                self._load_one(name, array)
            except ValueError as exc:
                raise ModelLoadError(f"tensor {name}: {exc}") from None
        missing = [n for n, ok in self._loaded_parts() if not ok]
        if missing:
            raise ModelLoadError(f"checkpoint is missing tensor(s) for: {', '.join(missing[:5])}")
        # Token type 0 folded into the position table: one embedding add fewer per step.
        self.position_type0 = self.position_embeddings + self.token_type0

    def _load_one(self, name: str, array: np.ndarray) -> None:
        embeddings = {
            "embeddings.word_embeddings.weight": ("word_embeddings", self.vocab_size),
            "embeddings.position_embeddings.weight": ("position_embeddings", self.max_position),
        }
        if name in embeddings:
            attr, rows = embeddings[name]
            if tuple(array.shape) != (rows, self.hidden_size):
                raise ValueError(f"shape {tuple(array.shape)} != ({rows}, {self.hidden_size})")
            setattr(self, attr, paddle.to_tensor(np.asarray(array, dtype=np.float32)))
        elif name == "embeddings.token_type_embeddings.weight":
            self.token_type0 = paddle.to_tensor(np.asarray(array[0], dtype=np.float32))
            if array.shape[0] > 1:
                delta = np.asarray(array[1], dtype=np.float32) - np.asarray(array[0], dtype=np.float32)
                self.token_type_delta = paddle.to_tensor(delta)
        elif name.startswith("embeddings.LayerNorm."):
            self.emb_norm.load_part(name.rsplit(".", 1)[1], array)
        elif name.startswith("encoder.layer."):
            _, _, index, rest = name.split(".", 3)
            module_name, kind = rest.rsplit(".", 1)
            if module_name not in _LAYER_NAMES or int(index) >= self.num_layers:
                logger.warning("ignoring unexpected checkpoint tensor %s", name)
                return
            attr, shard = _LAYER_NAMES[module_name]
            module = getattr(self.layers[int(index)], attr)
            if shard is None:
                module.load_part(kind, array)
            else:
                module.load_shard(shard, **{kind: array})
        else:
            logger.warning("ignoring unexpected checkpoint tensor %s", name)

    def _loaded_parts(self):
        yield "embeddings.word_embeddings", self.word_embeddings is not None
        yield "embeddings.position_embeddings", self.position_embeddings is not None
        yield "embeddings.token_type_embeddings", self.token_type0 is not None
        yield "embeddings.LayerNorm", self.emb_norm.is_loaded
        for i, layer in enumerate(self.layers):
            for hf_name, (attr, _) in _LAYER_NAMES.items():
                yield f"encoder.layer.{i}.{hf_name}", getattr(layer, attr).is_loaded

    def forward(self, input_ids, positions, kv_caches, meta, token_type_ids=None) -> paddle.Tensor:
        """Last hidden states [T, hidden]; kv_caches is ignored (an encoder caches nothing).
        `token_type_ids` ([T] of 0/1, numpy) marks the rows of a pair's second segment."""
        num_seqs = meta.num_seqs
        starts, lens = meta.query_start_loc_np[: num_seqs + 1], meta.seq_lens_np[:num_seqs]
        if (np.diff(starts) != lens).any():
            raise InvalidRequestError("an encoder model must see each sequence whole in one step")
        if meta.max_seq_len > self.max_position:
            raise InvalidRequestError(
                f"input of {meta.max_seq_len} tokens exceeds the model's {self.max_position} positions"
            )
        with paddle.no_grad():
            pos = F.embedding(positions, self.position_type0)
            if token_type_ids is not None and token_type_ids.any():
                if self.token_type_delta is None:
                    raise InvalidRequestError("this BERT checkpoint has one token type: it cannot read pairs")
                types = paddle.to_tensor(np.asarray(token_type_ids, dtype=np.float32)[:, None])
                pos = pos + types * self.token_type_delta
            x = self.emb_norm.add(F.embedding(input_ids, self.word_embeddings), pos)
            for layer in self.layers:
                x = layer(x, meta.query_start_loc)
            return x

    def compute_logits(self, hidden):
        raise InvalidRequestError("BertModel is an embedding model: it produces no token logits")


class BertForSequenceClassification(BertModel):
    """A BERT cross-encoder (sentence-transformers' CrossEncoder layout): the encoder, then transformers'
    head on the [CLS] row, `classifier(tanh(pooler.dense(h_cls)))`. The pooling runner pools CLS and
    calls `pooler_head`; the score's activation (sigmoid for one label) belongs to the serving layer."""

    uses_token_types = True

    def __init__(self, hf_config: dict, engine_config: ResolvedConfig):
        super().__init__(hf_config, engine_config)
        id2label = hf_config.get("id2label")
        self.num_labels = (
            len(id2label)
            if isinstance(id2label, dict) and id2label
            else int(hf_config.get("num_labels") or 2)
        )
        self._head: dict[str, np.ndarray] = {}

    def load_weights(self, weights: Iterable[tuple[str, np.ndarray]]) -> None:
        shapes = {
            "pooler.dense.weight": (self.hidden_size, self.hidden_size),
            "pooler.dense.bias": (self.hidden_size,),
            "classifier.weight": (self.num_labels, self.hidden_size),
            "classifier.bias": (self.num_labels,),
        }

        def body():
            for name, array in weights:
                short = name.removeprefix("bert.")
                if short in shapes:
                    if tuple(array.shape) != shapes[short]:
                        raise ModelLoadError(f"tensor {name}: shape {tuple(array.shape)} != {shapes[short]}")
                    self._head[short] = np.asarray(array, dtype=np.float32)
                else:
                    yield name, array

        super().load_weights(body())
        missing = sorted(set(shapes) - set(self._head))
        if missing:
            raise ModelLoadError(f"checkpoint is missing tensor(s): {', '.join(missing)}")

    def pooler_head(self, x: np.ndarray) -> np.ndarray:
        """[N, hidden] pooled [CLS] rows -> [N, num_labels] logits (float64 inside, float32 out)."""
        h = self._head
        pooled = np.tanh(x.astype(np.float64) @ h["pooler.dense.weight"].T + h["pooler.dense.bias"])
        return (pooled @ h["classifier.weight"].T + h["classifier.bias"]).astype(np.float32)
