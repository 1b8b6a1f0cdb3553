"""The Llama-family decoder shared by llama/qwen2/qwen3: embedding, N x (norm, attention, norm, gated
MLP) with the residual carried through fused add+norm, final norm, LM head.

Subclasses declare how their checkpoint names map onto this structure (`layer_mapping`) and the few
architectural switches (QKV bias, per-head q/k norm). Weight loading walks a name -> (module, shard)
table built at construction, so a missing tensor is found by set difference, not by a failed forward.

With the native kernels, loading ends by packing the layers for `ops.decoder_stack` (models/decoder_stack.py),
which runs them all in one C++ op, bit-identical to the per-op loop in `forward`; models whose layers
differ (MoE) keep the loop. The packed stack also holds the embedding's table (it takes the token ids)
and the LM head (`forward_greedy`: the step's greedy tokens from the same op).

A step's `meta.out` (runner/read_rows.py) names the rows whose output is read: the last layer writes
every row's K/V, computes the rest for those rows alone, and the model returns them (both paths).

Under tensor parallelism (`distributed.tp_group()` of several ranks, set before the model is built)
every layer is built sharded (layers/tp_*.py): each rank loads only its piece of each tensor and holds
`num_kv_heads` = its share of the KV heads, which is what its KV cache is sized by. The packed stack
cannot all-reduce between layers, so such a model runs the per-op loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import paddle

from fdcli_engine import ops
from fdcli_engine.distributed import tp_group
from fdcli_engine.errors import ModelLoadError
from fdcli_engine.layers import Attention, GatedMLP, RMSNorm, RotaryEmbedding
from fdcli_engine.layers.tp_embedding import lm_head, vocab_embedding
from fdcli_engine.models.decoder_stack import build_decoder_stack
from fdcli_engine.models.hf_config import normalize_hf_config
from fdcli_engine.resolved_config import ResolvedConfig

logger = logging.getLogger(__name__)

# Checkpoint entries that carry no parameter (old HF checkpoints saved the rotary buffer).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# ERNIE-4.5's multi-token-prediction head (models/ernie4_5_mtp.py): the mtp proposer loads it.
MTP_PREFIX = "model.mtp_"


class DecoderLayer:
    def __init__(
        self, cfg: dict, rotary: RotaryEmbedding, qkv_bias: bool, qk_norm: bool, quantization, group=None
    ):
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        hidden = int(cfg["hidden_size"])
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(
            hidden,
            int(cfg["num_attention_heads"]),
            cfg["num_key_value_heads"],
            cfg["head_dim"],
            rotary,
            qkv_bias=qkv_bias,
            qk_norm_eps=eps if qk_norm else None,
            quantization=quantization,
            group=group,
        )
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = GatedMLP(hidden, int(cfg["intermediate_size"]), quantization, group)


class DecoderForCausalLM:
    # HF name inside "model.layers.{i}." (without .weight/.bias) -> (attribute path in DecoderLayer,
    # shard index inside a merged linear or None). Subclasses extend or replace it.
    layer_mapping: dict[str, tuple[str, int | None]] = {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0),
        "self_attn.k_proj": ("self_attn.qkv_proj", 1),
        "self_attn.v_proj": ("self_attn.qkv_proj", 2),
        "self_attn.o_proj": ("self_attn.o_proj", 0),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0),
        "mlp.up_proj": ("mlp.gate_up_proj", 1),
        "mlp.down_proj": ("mlp.down_proj", 0),
        "input_layernorm": ("input_layernorm", None),
        "post_attention_layernorm": ("post_attention_layernorm", None),
    }
    qk_norm = False
    # Its forward runs decode_layers, which keeps the hidden states an EAGLE-3 head reads.
    keeps_aux_hidden_states = True

    def qkv_bias(self, cfg: dict) -> bool:
        return bool(cfg.get("attention_bias", False))

    def __init__(self, hf_config: dict, engine_config: ResolvedConfig):
        cfg = normalize_hf_config(hf_config)
        self._check_supported(cfg)
        self.config = cfg
        self.num_layers = int(cfg["num_hidden_layers"])
        self.num_heads = int(cfg["num_attention_heads"])
        self.group = tp_group()
        self.total_num_kv_heads = cfg["num_key_value_heads"]
        if self.total_num_kv_heads % self.group.world_size:
            raise ModelLoadError(
                f"{self.total_num_kv_heads} KV heads do not divide by tensor-parallel size {self.group.world_size}"
            )
        self.num_kv_heads = self.total_num_kv_heads // self.group.world_size  # this rank's (its KV cache)
        self.head_dim = cfg["head_dim"]
        self.hidden_size = int(cfg["hidden_size"])
        self.vocab_size = int(cfg["vocab_size"])
        self.tie_word_embeddings = cfg["tie_word_embeddings"]
        max_pos = int(cfg.get("max_position_embeddings") or 8192)
        if engine_config.max_model_len:
            max_pos = min(max_pos, int(engine_config.max_model_len))
        rotary = RotaryEmbedding(self.head_dim, max_pos, cfg["rope_theta"], cfg["rope_scaling"])
        quant = engine_config.quantization
        bias = self.qkv_bias(cfg)
        self.embed_tokens = vocab_embedding(self.vocab_size, self.hidden_size, self.group)
        self.layers = [
            DecoderLayer(cfg, rotary, bias, self.qk_norm, quant, self.group) for _ in range(self.num_layers)
        ]
        self.norm = RMSNorm(self.hidden_size, float(cfg.get("rms_norm_eps", 1e-6)))
        self.lm_head = lm_head(self.hidden_size, self.vocab_size, self.group)
        # Checkpoint tensors another rank holds alone (expert parallel): skipped, not unexpected.
        self.other_ranks_tensors: set[str] = set()
        self._targets = self._build_targets(bias)
        self.decoder_stack = None  # packed by load_weights where the native stack applies
        self.use_decoder_stack = True  # False forces the per-op loop (tests, benchmarks)

    def _check_supported(self, cfg: dict) -> None:
        if cfg.get("mlp_bias"):
            raise ModelLoadError("mlp_bias=true is not supported by fd's Llama-family models")
        if cfg.get("use_sliding_window"):
            raise ModelLoadError("sliding-window attention (use_sliding_window=true) is not supported")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ModelLoadError(f"hidden_act {act!r} is not supported: expected silu")

    def _build_targets(self, qkv_bias: bool) -> dict[str, tuple[object, int | None, str]]:
        """Every checkpoint name this model expects -> (module, shard, "weight" | "bias"). A subclass's
        `moe_layer_ids` (set after this base __init__) name layers whose MLP is an MoE: their dense
        mlp.* names are left out for the subclass to add its own."""
        moe_ids = set(getattr(self, "moe_layer_ids", ()))
        targets: dict[str, tuple[object, int | None, str]] = {
            "model.embed_tokens.weight": (self.embed_tokens, None, "weight"),
            "model.norm.weight": (self.norm, None, "weight"),
        }
        if not self.tie_word_embeddings:
            targets["lm_head.weight"] = (self.lm_head, None, "weight")
        for i, layer in enumerate(self.layers):
            for hf_name, (path, shard) in self.layer_mapping.items():
                if i in moe_ids and hf_name.startswith("mlp."):
                    continue
                module = layer
                for part in path.split("."):
                    module = getattr(module, part)
                targets[f"model.layers.{i}.{hf_name}.weight"] = (module, shard, "weight")
                if qkv_bias and hf_name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                    targets[f"model.layers.{i}.{hf_name}.bias"] = (module, shard, "bias")
        return targets

    def load_weights(self, weights: Iterable[tuple[str, np.ndarray]]) -> None:
        """Consume (HF name, fp32 array [out, in]) pairs. Raises ModelLoadError naming the tensor on a
        shape mismatch, and listing what is missing at the end."""
        seen: set[str] = set()
        for name, array in weights:
            target = self._targets.get(name)
            if target is None and name in self.other_ranks_tensors:
                continue
            if target is None:
                if name == "lm_head.weight" or name.endswith(IGNORED_SUFFIXES) or name.startswith(MTP_PREFIX):
                    continue  # tied head stored anyway, a non-parameter buffer, or the MTP head
                if name.startswith("model.layers."):
                    # A weight the config did not announce (a bias, an extra norm): running without it
                    # would be silently wrong, so the config and the checkpoint disagree.
                    raise ModelLoadError(
                        f"tensor {name} is not part of {type(self).__name__} as configured "
                        "(config.json and the weights disagree)"
                    )
                logger.warning("ignoring unexpected checkpoint tensor %s", name)
                continue
            module, shard, kind = target
            try:
                if shard is None:
                    module.load(array)
                else:
                    module.load_shard(shard, **{kind: array})
            except ValueError as exc:
                raise ModelLoadError(f"tensor {name}: {exc}") from None
            if name == "model.embed_tokens.weight" and self.tie_word_embeddings:
                self.lm_head.tie(self.embed_tokens, array)
            seen.add(name)
        missing = sorted(set(self._targets) - seen)
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ModelLoadError(f"checkpoint is missing tensor(s): {', '.join(missing[:5])}{more}")
        self.decoder_stack = build_decoder_stack(self) if self.group.world_size == 1 else None

    def forward(self, input_ids, positions, kv_caches, meta) -> paddle.Tensor:
        with paddle.no_grad():
            if _runs_stack(self, positions) and self.decoder_stack.embeds_tokens:
                # The stack holds the embedding's table: it looks the rows up itself, one op a step.
                return _run_stack(self, input_ids, positions, kv_caches, meta)
            return decode_layers(self, self.embed_tokens(input_ids), positions, kv_caches, meta)

    def forward_greedy(self, input_ids, positions, kv_caches, meta) -> tuple[paddle.Tensor, list[int] | None]:
        """`forward` and each returned row's `compute_greedy_tokens`, in one op where the packed stack
        holds the LM head: (hidden, tokens). tokens None: the caller asks compute_greedy_tokens or the
        logits itself (no fused path for this step, or a row's logits hold a NaN). A decode step's hidden
        may be the stack's buffer (ops.decoder_stack_greedy through ctypes), written again by the next
        step: read it within the step, keep none of it."""
        own_forward = type(self).forward is DecoderForCausalLM.forward  # a subclass's may do more
        if not (own_forward and _runs_stack(self, positions) and self.decoder_stack.has_head):
            return self.forward(input_ids, positions, kv_caches, meta), None
        with paddle.no_grad():
            x = input_ids if self.decoder_stack.embeds_tokens else self.embed_tokens(input_ids)
            return _run_stack(self, x, positions, kv_caches, meta, greedy=True)

    def compute_logits(self, hidden: paddle.Tensor) -> paddle.Tensor:
        with paddle.no_grad():
            return self.lm_head(hidden)

    def compute_greedy_tokens(self, hidden: paddle.Tensor) -> list[int] | None:
        """Each row's first argmax of compute_logits(hidden), without the logits; None where the caller
        must look at the logits: a row holds a NaN, or the head cannot (layers/embedding.py). Token ids
        carry no gradient, so no no_grad scope."""
        return self.lm_head.argmax(hidden)


def decode_layers(model, hidden, positions, kv_caches, meta) -> paddle.Tensor:
    """`model.layers` then `model.norm` on the input hidden states (the embeddings, or the MTP head's
    projection): the packed stack where `model.decoder_stack` is set, else the per-op loop. Positions
    int64 [3, T] (M-RoPE tokens of an image) take the loop: the stack's rotary reads one position.
    With `meta.out` (runner/read_rows.py) the last layer computes only those rows past its cache write
    and they are what is returned, unless the model cannot (tensor parallel, MoE layers).
    With `model.aux_hidden_state_layers` (set by an EAGLE-3 proposer), the hidden states entering those
    layers (embeddings for layer 0; layer n = len(layers): the last layer's output before the norm) are
    left in `model.aux_hidden_states`, concatenated in layer order, every row (vLLM's auxiliary hidden
    states; the proposer reads every row, so no `meta.out` applies); the per-op loop runs then."""
    if _runs_stack(model, positions):
        return _run_stack(model, hidden, positions, kv_caches, meta)
    out = meta.out if meta.out is not None and _computes_row_subsets(model) else None
    residual = None
    last = len(model.layers) - 1
    aux_layers = getattr(model, "aux_hidden_state_layers", None)
    aux = []
    for i, (layer, kv_cache) in enumerate(zip(model.layers, kv_caches, strict=True)):
        if aux_layers and i in aux_layers:
            aux.append(hidden if residual is None else hidden + residual)
        if residual is None:
            residual = hidden
            x = layer.input_layernorm(hidden)
        else:
            x, residual = layer.input_layernorm(hidden, residual)
        rows_meta = out if i == last and out is not None else meta
        hidden = layer.self_attn(positions, x, kv_cache, meta, rows_meta)
        if rows_meta is not meta:
            if out.rows.shape[0] == 0:
                return hidden  # no row is read: [0, hidden]
            residual = paddle.gather(residual, out.rows)
        x, residual = layer.post_attention_layernorm(hidden, residual)
        hidden = layer.mlp(x, rows_meta.prompt_rows)
    if aux_layers:
        if len(model.layers) in aux_layers:  # "after the last layer": its output before the norm
            aux.append(hidden + residual)
        model.aux_hidden_states = paddle.concat(aux, axis=-1)
    out_hidden, _ = model.norm(hidden, residual)
    return out_hidden


def _runs_stack(model, positions) -> bool:
    """Whether the packed stack runs this step's layers: packed, enabled, bound, one position a token,
    no auxiliary hidden states to keep (the stack returns the last layer's alone)."""
    return (
        model.decoder_stack is not None
        and model.use_decoder_stack
        and not getattr(model, "aux_hidden_state_layers", None)
        and ops.decoder_stack is not None
        and positions.ndim == 1
    )


def _run_stack(model, x, positions, kv_caches, meta, greedy: bool = False):
    """The packed stack on x: the embedded tokens, or their ids where the stack holds the table. With
    `greedy`, (hidden, tokens) from ops.decoder_stack_greedy."""
    out = meta.out if meta.out is not None and _computes_row_subsets(model) else None
    op = ops.decoder_stack_greedy if greedy else ops.decoder_stack
    return op(x, positions, kv_caches, meta, model.decoder_stack, meta.prompt_rows, out)


def _computes_row_subsets(model) -> bool:
    """Whether the last layer may run on a subset of the rows: not across tensor-parallel ranks (the
    others compute every row and all-reduce them), nor with MoE layers (an expert's routed share of the
    kept rows could take another GEMM path than its share of all rows)."""
    group = getattr(model, "group", None)
    return (group is None or group.world_size == 1) and not getattr(model, "moe_layer_ids", ())
