"""Ernie4_5_MoeForCausalLM (ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B): the ERNIE decoder (interleaved
rotary handled by `Ernie4_5ForCausalLM`) whose FFN is a mixture of experts in some layers.

Layer i is MoE when (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <=
moe_layer_end_index (-1: the last layer); the others keep the dense gated MLP (`intermediate_size`).
A MoE layer routes each token to `moe_k` of `moe_num_experts` experts (`moe_intermediate_size` each)
plus `moe_num_shared_experts` shared experts fused into one MLP of moe_intermediate_size * that
count; see `fdcli_engine.layers.moe` for the routing and how only hit experts are computed, and for
tensor / expert parallel (`--enable-expert-parallel`: each rank loads only its experts' tensors).

Quantization follows FastDeploy's meaning for ERNIE MoE models: `wint8` quantizes every linear layer
to 8 bits; `wint4` quantizes the routed experts to 4 bits and every other linear layer (attention,
dense MLPs, shared experts) to 8 bits. The router and the LM head stay fp32.

Checkpoint names (HF "-PT" layout; the Paddle layout is renamed into these by the loader):
    model.layers.{i}.mlp.gate.weight                             [E, hidden]
    model.layers.{i}.mlp.moe_statics.e_score_correction_bias     [1, E]  (absent, and zero, when the
                                                                 config says moe_use_aux_free: false)
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight
    model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight
"""

from __future__ import annotations

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.layers.moe import MoE
from fdcli_engine.models.ernie4_5 import Ernie4_5ForCausalLM, ernie_defaults, resolve_quantization
from fdcli_engine.resolved_config import ResolvedConfig

_MLP_SHARDS = {
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
}


def mlp_targets(prefix: str, mlps: dict) -> dict[str, tuple[object, int | None, str]]:
    """Checkpoint names of each expert MLP's gate/up/down weights (`mlps`: name under `prefix` ->
    the MLP), mapped onto its fused gate_up and down projections."""
    return {
        f"{prefix}.{name}.{proj}.weight": (getattr(mlp, attr), shard, "weight")
        for name, mlp in mlps.items()
        for proj, (attr, shard) in _MLP_SHARDS.items()
    }


def moe_layer_ids(cfg: dict, num_layers: int) -> list[int]:
    """The indices of the layers whose FFN is a mixture of experts."""
    start = int(cfg.get("moe_layer_start_index", 0))
    end = int(cfg.get("moe_layer_end_index", -1))
    end = num_layers - 1 if end == -1 else end
    interval = int(cfg.get("moe_layer_interval", 1))
    if interval < 1:
        raise ModelLoadError(f"moe_layer_interval must be at least 1, got {interval}")
    return [i for i in range(num_layers) if (i + 1) % interval == 0 and start <= i <= end]


def expert_quantizations(quantization: str | None) -> tuple[str | None, str | None]:
    """(routed experts, every other linear layer): FastDeploy's wint4 keeps dense layers at 8 bits."""
    quantization = resolve_quantization(quantization)
    if quantization == "wint4":
        return "wint4", "wint8"
    return quantization, quantization


class Ernie4_5_MoeForCausalLM(Ernie4_5ForCausalLM):
    def __init__(self, hf_config: dict, engine_config: ResolvedConfig):
        cfg = ernie_defaults(hf_config)
        for key in ("moe_num_experts", "moe_k", "moe_intermediate_size"):
            if not isinstance(cfg.get(key), int):
                raise ModelLoadError(f"{key} must be an integer, got {cfg.get(key)!r}")
        expert_quant, dense_quant = expert_quantizations(engine_config.quantization)
        # The base decoder builds attention and dense MLPs with the dense layers' quantization.
        super().__init__(cfg, engine_config.replace(quantization=dense_quant))
        self.moe_layer_ids = moe_layer_ids(self.config, self.num_layers)
        for i in self.moe_layer_ids:
            self.layers[i].mlp = MoE(
                self.hidden_size,
                int(cfg["moe_intermediate_size"]),
                int(cfg["moe_num_experts"]),
                int(cfg["moe_k"]),
                num_shared_experts=int(cfg.get("moe_num_shared_experts") or 0),
                norm_min=float(cfg.get("moe_norm_min", 1e-12)),
                quantization=expert_quant,
                shared_quantization=dense_quant,
                group=self.group,
                expert_parallel=engine_config.enable_expert_parallel,
            )
            moe = self.layers[i].mlp
            self.other_ranks_tensors |= {
                f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"
                for e in range(moe.num_experts)
                if e not in moe.local_experts
                for proj in _MLP_SHARDS
            }
        self._targets = self._build_targets(False)

    def _build_targets(self, qkv_bias: bool) -> dict[str, tuple[object, int | None, str]]:
        """The base decoder's table, with each MoE layer's dense MLP names replaced by its router,
        correction bias, experts and shared experts."""
        targets = super()._build_targets(qkv_bias)
        for i in getattr(self, "moe_layer_ids", []):  # none while the base __init__ runs
            targets.update(self._moe_targets(f"model.layers.{i}.mlp", self.layers[i].mlp))
            if self.config.get("moe_use_aux_free") is False:
                # Trained without the aux-free correction bias: none is stored, zero is exact.
                del targets[f"model.layers.{i}.mlp.moe_statics.e_score_correction_bias"]
        return targets

    @staticmethod
    def _moe_targets(prefix: str, moe: MoE) -> dict[str, tuple[object, int | None, str]]:
        targets: dict[str, tuple[object, int | None, str]] = {
            f"{prefix}.gate.weight": (moe.gate, None, "weight"),
            f"{prefix}.moe_statics.e_score_correction_bias": (moe.correction_bias, None, "weight"),
        }
        mlps = {f"experts.{e}": moe.experts[e] for e in moe.local_experts}
        if moe.shared_experts is not None:
            mlps["shared_experts"] = moe.shared_experts
        return targets | mlp_targets(prefix, mlps)
