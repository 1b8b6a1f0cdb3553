"""An EAGLE-3 head for a loaded target, as vLLM runs it (Eagle3LlamaForCausalLM, llama_eagle3.py).

The target hands the head the hidden states entering three of its layers (vLLM's default: layers 2,
n/2 and n-3 of n; the head's config may name them, `eagle_aux_hidden_state_layer_ids`, n meaning the
last layer's output before the final norm), concatenated
in layer order, which `fc` (3H' -> H, H' the target's width) maps to one row g_j. For the token x_{j+1}
at position j:

    e = input_layernorm(embed(x_{j+1}));  n = hidden_norm(g_j)
    residual = g_j (n with norm_before_residual)
    a = self_attn(concat([e, n]))                       # q/k/v read 2H
    x, residual = post_attention_layernorm(a, residual)  # fused add + norm
    p = mlp(x) + residual                                 # layers 1.. (if any) as plain Llama layers
    logits = lm_head(norm(p)) over the draft vocabulary, placed at target id d + d2t[d]

Drafting further ahead feeds p (before the final norm) back as the next row's g. The head's own norm
is used; its embedding and lm_head where stored, else the target's (the latter only when the draft
vocabulary is the target's).

Checkpoint names as vLLM reads them (`midlayer.` is `layers.0.`): fc.weight [H, 3H'], norm.weight,
lm_head.weight [draft_vocab, H] (optional as above), d2t [draft_vocab] (int; absent: draft id d is target id d), t2d
(unused), layers.0.{hidden_norm, input_layernorm, post_attention_layernorm}.weight and the Llama
attention / MLP tensors, embed_tokens.weight optional. `eagle_config.use_aux_hidden_state` false: no
fc, the head reads the target's final hidden state.
"""

from __future__ import annotations

import numpy as np
import paddle

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.layers import Linear, RMSNorm
from fdcli_engine.layers.tp_linear import column_linear
from fdcli_engine.models.llama_eagle import EagleHeadBase


def aux_layer_ids(head_config: dict, num_target_layers: int) -> tuple[int, ...]:
    """The target layers whose input the head reads: the config's, else vLLM's (2, n // 2, n - 3)."""
    ids = head_config.get("eagle_aux_hidden_state_layer_ids")
    n = num_target_layers
    return tuple(int(i) for i in ids) if ids else (2, n // 2, n - 3)


class Eagle3Llama(EagleHeadBase):
    skipped = ("t2d",)

    def __init__(self, hf_config: dict, target, max_model_len: int, quantization: str | None):
        super().__init__(hf_config, target, max_model_len, quantization)
        cfg = self.config
        h = self.hidden_size
        self.draft_vocab_size = int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
        self.use_aux_hidden_state = bool((cfg.get("eagle_config") or {}).get("use_aux_hidden_state", True))
        self.norm_before_residual = bool(cfg.get("norm_before_residual", False))
        target_hidden = int(cfg.get("target_hidden_size") or h)
        first = self.layers[0]
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        first.self_attn.qkv_proj = column_linear(2 * h, [q, kv, kv], self.qkv_bias, quantization, None)
        first.hidden_norm = RMSNorm(h, self.eps)
        self.norm = RMSNorm(h, self.eps)
        self.lm_head_rows = self.draft_vocab_size
        self.fc = Linear(3 * target_hidden, h, False, quantization) if self.use_aux_hidden_state else None
        # Target id of each draft id (None: the same id); set from d2t, else the identity when the draft
        # vocabulary is the target's first ids.
        self.draft_to_target: paddle.Tensor | None = None
        if self.draft_vocab_size != self.vocab_size:
            self._set_draft_to_target(np.zeros(self.draft_vocab_size), "config.json")
        self._targets.update(
            {
                "norm.weight": (self.norm, None, "weight"),
                "layers.0.hidden_norm.weight": (first.hidden_norm, None, "weight"),
            }
        )
        if self.fc is not None:
            self._targets["fc.weight"] = (self.fc, 0, "weight")
        self._add_layer_targets()
        # vLLM builds a hidden_norm in every layer and uses layer 0's only.
        self.skipped = (*self.skipped, *(f"layers.{i}.hidden_norm.weight" for i in range(1, self.num_layers)))

    def _describe(self) -> str:
        return (
            f"an EAGLE-3 head (fc, norm, lm_head, d2t, {self.num_layers} decoder layer(s) named midlayer.*)"
        )

    def _set_draft_to_target(self, d2t: np.ndarray, source: str) -> None:
        if d2t.shape != (self.draft_vocab_size,) or not np.array_equal(d2t, np.round(d2t)):
            raise ModelLoadError(f"{source}: d2t must hold {self.draft_vocab_size} integer offsets")
        ids = np.arange(self.draft_vocab_size, dtype=np.int64) + d2t.astype(np.int64)
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ModelLoadError(
                f"{source}: d2t maps draft ids outside the target's vocabulary of {self.vocab_size} tokens"
            )
        self.draft_to_target = paddle.to_tensor(ids)

    def load_weights(self, weights, source: str) -> None:
        super().load_weights(((n.replace("midlayer.", "layers.0.", 1), a) for n, a in weights), source)
        if getattr(self.lm_head, "vocab_size", None) != self.draft_vocab_size:
            raise ModelLoadError(
                f"{source}: the EAGLE-3 head lacks lm_head.weight, which a draft vocabulary of "
                f"{self.draft_vocab_size} tokens (not the target's {self.vocab_size}) needs"
            )

    def _load_special(self, name: str, array: np.ndarray, source: str) -> bool:
        if name != "d2t":
            return False
        self._set_draft_to_target(np.asarray(array), source)
        return True

    def combine_hidden_states(self, aux: paddle.Tensor) -> paddle.Tensor:
        """The target's concatenated layer inputs [T, 3H'] -> the head's rows g [T, H]."""
        with paddle.no_grad():
            return self.fc(aux) if self.fc is not None else aux

    def forward(self, input_ids, previous_hidden, positions, kv_caches, meta) -> paddle.Tensor:
        """Rows: the tokens x_{j+1}, the hidden states g_j, positions j. Returns the pre-norm output p_j
        (what the next row is fed; compute_logits applies the norm)."""
        with paddle.no_grad():
            first = self.layers[0]
            e = first.input_layernorm(self.embed_tokens(input_ids))
            n = first.hidden_norm(previous_hidden)
            residual = n if self.norm_before_residual else previous_hidden
            hidden, residual = self._attention_mlp(
                first, paddle.concat([e, n], axis=-1), residual, 0, positions, kv_caches, meta
            )
            for i, layer in enumerate(self.layers[1:], start=1):
                x, residual = layer.input_layernorm(hidden, residual)
                hidden, residual = self._attention_mlp(layer, x, residual, i, positions, kv_caches, meta)
            return hidden + residual

    @staticmethod
    def _attention_mlp(layer, x, residual, i, positions, kv_caches, meta):
        a = layer.self_attn(positions, x, kv_caches[i], meta)
        x, residual = layer.post_attention_layernorm(a, residual)
        return layer.mlp(x, meta.prompt_rows), residual

    def compute_logits(self, hidden: paddle.Tensor) -> paddle.Tensor:
        """Logits over the target's vocabulary: the draft vocabulary's at their target ids, -inf elsewhere
        (vLLM's compute_logits), so the argmax is a target id."""
        with paddle.no_grad():
            logits = self.lm_head(self.norm(hidden))
            if self.draft_to_target is None:
                return logits
            full = paddle.full([logits.shape[0], self.vocab_size], float("-inf"), dtype=logits.dtype)
            index = paddle.expand(self.draft_to_target[None, :], logits.shape)
            return paddle.put_along_axis(full, index, logits, axis=1)
