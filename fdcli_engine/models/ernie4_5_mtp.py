"""ERNIE-4.5's multi-token-prediction (MTP) head, as FastDeploy runs it (Ernie4_5_MTPForCausalLM).

For the token x_{j+1} and the target's hidden state h_j at position j (after the target's final norm,
what its forward returns), the head computes

    e = enorm(embed(x_{j+1}));  g = hnorm(h_j)
    u = eh_proj(concat([e, g]))                  # 2H -> H, the embedding half first
    h'_j = norm(decoder_layer(u))                # one dense ERNIE decoder layer, at position j
    logits = lm_head(h'_j)                       # predicts x_{j+2}

`embed`, `norm` and `lm_head` are the target's own (shared, not stored with the head). The decoder layer
attends over the head's own KV cache, one entry per position, so row j of the head sits at the target's
position j. Drafting further ahead feeds h'_j back as the next row's hidden state (FastDeploy's
substeps).

Checkpoint names (HF naming; the Paddle layout's `ernie.mtp_*` are renamed and transposed into these by
loader.paddle_layout):
    model.mtp_emb_norm.0.weight      [H]       enorm
    model.mtp_hidden_norm.0.weight   [H]       hnorm
    model.mtp_linear_proj.0.weight   [H, 2H]   eh_proj
    model.mtp_block.0.<layer>        the decoder layer, named as model.layers.{i}.<layer>
Only one MTP layer (`.0`) exists in released checkpoints; its MLP is dense (FastDeploy builds it as
layer 0, before moe_layer_start_index).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import paddle

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.layers import Linear, RMSNorm
from fdcli_engine.models.decoder import DecoderLayer, decode_layers
from fdcli_engine.models.decoder_stack import build_decoder_stack
from fdcli_engine.models.ernie4_5 import interleaved_to_neox_rows
from fdcli_engine.models.ernie4_5_moe import expert_quantizations

BLOCK_PREFIX = "model.mtp_block.0."


class Ernie4_5_MTP:
    """The head over a loaded ERNIE target (Ernie4_5ForCausalLM or its MoE variant)."""

    def __init__(self, target, quantization: str | None):
        cfg = target.config
        self.hidden_size = target.hidden_size
        self.vocab_size = target.vocab_size
        self.num_layers = 1
        self.num_heads = target.num_heads
        self.num_kv_heads = target.num_kv_heads
        self.head_dim = target.head_dim
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        dense_quant = expert_quantizations(quantization)[1]  # the layer is dense: wint4 keeps it at 8 bits
        self.enorm = RMSNorm(self.hidden_size, eps)
        self.hnorm = RMSNorm(self.hidden_size, eps)
        self.eh_proj = Linear(2 * self.hidden_size, self.hidden_size, False, dense_quant)
        rotary = target.layers[0].self_attn.rotary  # same table: same theta, scaling and length
        self.layers = [DecoderLayer(cfg, rotary, False, False, dense_quant)]
        self.embed_tokens, self.norm, self.lm_head = target.embed_tokens, target.norm, target.lm_head
        self.decoder_stack = None
        self.use_decoder_stack = True
        self._targets = self._build_targets(target.layer_mapping)

    def _build_targets(self, layer_mapping) -> dict[str, tuple[object, int | None]]:
        targets: dict[str, tuple[object, int | None]] = {
            "model.mtp_emb_norm.0.weight": (self.enorm, None),
            "model.mtp_hidden_norm.0.weight": (self.hnorm, None),
            "model.mtp_linear_proj.0.weight": (self.eh_proj, 0),
        }
        for hf_name, (path, shard) in layer_mapping.items():
            module = self.layers[0]
            for part in path.split("."):
                module = getattr(module, part)
            targets[f"{BLOCK_PREFIX}{hf_name}.weight"] = (module, shard)
        return targets

    def load_weights(self, weights: Iterable[tuple[str, np.ndarray]], source: str) -> None:
        """Consume (HF name, fp32 [out, in]) pairs; names outside the head are skipped. `source` (the
        folder) is named in the errors; a folder without any MTP tensor says so."""
        seen: set[str] = set()
        for name, array in weights:
            if not name.startswith("model.mtp_"):
                continue
            target = self._targets.get(name)
            if target is None:
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                # Running without a stored weight (a second MTP layer, experts, a bias) would be wrong.
                raise ModelLoadError(
                    f"{source}: tensor {name} is not part of fd's MTP head (one dense ERNIE decoder "
                    "layer, model.mtp_block.0)"
                )
            module, shard = target
            if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")) and array.ndim == 2:
                heads = self.num_heads if "q_proj" in name else self.num_kv_heads
                if array.shape[0] == heads * self.head_dim:
                    array = interleaved_to_neox_rows(array, heads)  # as the target's (models/ernie4_5.py)
            try:
                module.load(array) if shard is None else module.load_shard(shard, weight=array)
            except ValueError as exc:
                raise ModelLoadError(f"{source}: tensor {name}: {exc}") from None
            seen.add(name)
        if not seen:
            raise ModelLoadError(f"{source}: no MTP weights (model.mtp_* / ernie.mtp_* tensors)")
        missing = sorted(set(self._targets) - seen)
        if missing:
            raise ModelLoadError(f"{source}: the MTP head lacks tensor(s): {', '.join(missing[:5])}")
        self.decoder_stack = build_decoder_stack(self)

    def forward(self, input_ids, previous_hidden, positions, kv_caches, meta) -> paddle.Tensor:
        """Rows: the tokens x_{j+1}, the hidden states h_j, positions j. Returns h'_j (normed)."""
        with paddle.no_grad():
            e = self.enorm(self.embed_tokens(input_ids))
            g = self.hnorm(previous_hidden)
            u = self.eh_proj(paddle.concat([e, g], axis=-1), meta.prompt_rows)
            return decode_layers(self, u, positions, kv_caches, meta)

    def compute_logits(self, hidden: paddle.Tensor) -> paddle.Tensor:
        with paddle.no_grad():
            return self.lm_head(hidden)
