"""An EAGLE head for a loaded target, as vLLM runs it (EagleLlamaForCausalLM, llama_eagle.py).

For the token x_{j+1} and the target's hidden state h_j at position j (after the target's final norm,
what its forward returns), the head computes

    u = fc(concat([embed(x_{j+1}), h_j]))      # 2H -> H, the embedding half first
    h'_j = layers(u)                           # Llama decoder layers; layer 0 has no input norm
    logits = lm_head(h'_j)                     # predicts x_{j+2}

with no final norm: h'_j is the last layer's output plus its residual. Drafting further ahead feeds h'_j
back as the next row's hidden state (vLLM's EAGLE loop). The layers attend over the head's own KV cache,
one entry per position, so row j sits at the target's position j.

The head's folder (yuhuili/EAGLE-LLaMA3.1-Instruct-8B and the like): config.json, a Llama config with
num_hidden_layers (1 in released heads), whose hidden_size and vocab_size are the target's; and
safetensors with names without a `model.` prefix:
    fc.weight                   [H, 2H]  (fc.bias [H] where stored is applied: vLLM's fc has no bias
                                         and cannot load one, EAGLE's own training code has one)
    layers.{i}.<layer>          a Llama decoder layer, named as model.layers.{i}.<layer>
    embed_tokens.weight         optional: the head's own embedding, else the target's
    lm_head.weight              optional: the head's own LM head, else the target's
(vLLM's load_eagle_model: the target's embedding and LM head unless the head has its own.) Skipped
as vLLM skips them: layers.0.input_layernorm (replaced by nothing), norm (none is applied), rotary
buffers.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import paddle

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.layers import Linear, LMHead, RotaryEmbedding, VocabEmbedding
from fdcli_engine.models.decoder import DecoderForCausalLM, DecoderLayer, decode_layers
from fdcli_engine.models.hf_config import normalize_hf_config


class NoNorm:
    """A norm slot EAGLE leaves empty: x as is; with a residual, (x + residual) as both results, which
    makes decode_layers's final `norm(hidden, residual)` the plain sum vLLM returns."""

    def __call__(self, x, residual=None):
        if residual is None:
            return x
        total = x + residual
        return total, total


class EagleHeadBase:
    """What EAGLE and EAGLE-3 heads share: the dimensions and decoder layers of the head's own Llama
    config, the target's embedding and LM head unless the folder stores its own, and a name ->
    (module, shard, kind) table the weights are loaded through (a missing tensor is found by set
    difference)."""

    # Checkpoint names the head has no parameter for, dropped as vLLM drops them.
    skipped: tuple[str, ...] = ()

    def __init__(self, hf_config: dict, target, max_model_len: int, quantization: str | None):
        cfg = normalize_hf_config(hf_config)
        self.config = cfg
        self.hidden_size = int(cfg["hidden_size"])
        self.vocab_size = target.vocab_size
        self.num_layers = int(cfg["num_hidden_layers"])
        self.num_heads = int(cfg["num_attention_heads"])
        self.num_kv_heads = int(cfg["num_key_value_heads"])
        self.head_dim = int(cfg["head_dim"])
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.quantization = quantization
        self.qkv_bias = bool(cfg.get("attention_bias", False))
        rotary = RotaryEmbedding(self.head_dim, max_model_len, cfg["rope_theta"], cfg["rope_scaling"])
        self.layers = [
            DecoderLayer(cfg, rotary, self.qkv_bias, False, quantization) for _ in range(self.num_layers)
        ]
        self.embed_tokens, self.lm_head = target.embed_tokens, target.lm_head
        self.lm_head_rows = (
            self.vocab_size
        )  # the rows of an LM head of its own (EAGLE-3: its draft vocabulary)
        self.decoder_stack = None  # the packed stack runs plain Llama layers only: the per-op loop runs these
        self.use_decoder_stack = False
        self._targets: dict[str, tuple[object, int | None, str]] = {}

    def _add_layer_targets(self, skip: tuple[str, ...] = ()) -> None:
        """layers.{i}.<name> for every decoder layer tensor, but those in `skip` ("0.input_layernorm")."""
        for i, layer in enumerate(self.layers):
            for hf_name, (path, shard) in DecoderForCausalLM.layer_mapping.items():
                if f"{i}.{hf_name}" in skip:
                    continue
                module = layer
                for part in path.split("."):
                    module = getattr(module, part)
                self._targets[f"layers.{i}.{hf_name}.weight"] = (module, shard, "weight")
                if self.qkv_bias and hf_name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                    self._targets[f"layers.{i}.{hf_name}.bias"] = (module, shard, "bias")

    def _load_special(self, name: str, array: np.ndarray, source: str) -> bool:
        """A tensor outside the table (the subclass's); True when taken."""
        return False

    def _describe(self) -> str:
        return f"an EAGLE head (fc, then {self.num_layers} Llama decoder layer(s) named layers.N.*)"

    def load_weights(self, weights: Iterable[tuple[str, np.ndarray]], source: str) -> None:
        """Consume (name, fp32 [out, in]) pairs of the head's folder; `source` is named in the errors."""
        seen: set[str] = set()
        for name, array in weights:
            if name == "embed_tokens.weight":
                if tuple(array.shape) != (self.vocab_size, self.hidden_size):
                    raise ModelLoadError(
                        f"{source}: embed_tokens.weight is {list(array.shape)}, the target's embedding "
                        f"[{self.vocab_size}, {self.hidden_size}]: the head is not for this target"
                    )
                self.embed_tokens = VocabEmbedding(self.vocab_size, self.hidden_size)
                self.embed_tokens.load(array)
                continue
            if name == "lm_head.weight":
                self.lm_head = LMHead(self.hidden_size, self.lm_head_rows)
                try:
                    self.lm_head.load(array)
                except ValueError as exc:
                    raise ModelLoadError(f"{source}: tensor {name}: {exc}") from None
                continue
            if name in self.skipped or name.endswith("rotary_emb.inv_freq"):
                continue
            if self._load_special(name, array, source):
                continue
            target = self._targets.get(name)
            if target is None:
                # Running without a stored weight (a norm, a bias, another layout) would be wrong.
                raise ModelLoadError(f"{source}: tensor {name} is not part of {self._describe()}")
            module, shard, kind = target
            try:
                module.load(array) if shard is None else module.load_shard(shard, **{kind: array})
            except ValueError as exc:
                raise ModelLoadError(f"{source}: tensor {name}: {exc}") from None
            seen.add(name)
        missing = sorted(set(self._targets) - seen)
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ModelLoadError(f"{source}: the EAGLE head lacks tensor(s): {', '.join(missing[:5])}{more}")


class EagleLlama(EagleHeadBase):
    """The EAGLE-1 head over a loaded target (any fd decoder: its embedding, LM head and width)."""

    skipped = ("norm.weight", "layers.0.input_layernorm.weight")

    def __init__(self, hf_config: dict, target, max_model_len: int, quantization: str | None, fc_bias: bool):
        super().__init__(hf_config, target, max_model_len, quantization)
        self.fc = Linear(2 * self.hidden_size, self.hidden_size, fc_bias, quantization)
        self.layers[0].input_layernorm = NoNorm()
        self.norm = NoNorm()
        self._targets["fc.weight"] = (self.fc, 0, "weight")
        if fc_bias:
            self._targets["fc.bias"] = (self.fc, 0, "bias")
        self._add_layer_targets(skip=("0.input_layernorm",))

    def forward(self, input_ids, previous_hidden, positions, kv_caches, meta) -> paddle.Tensor:
        """Rows: the tokens x_{j+1}, the hidden states h_j, positions j. Returns h'_j (not normed)."""
        with paddle.no_grad():
            e = self.embed_tokens(input_ids)
            u = self.fc(paddle.concat([e, previous_hidden], axis=-1), meta.prompt_rows)
            return decode_layers(self, u, positions, kv_caches, meta)

    def compute_logits(self, hidden: paddle.Tensor) -> paddle.Tensor:
        with paddle.no_grad():
            return self.lm_head(hidden)
