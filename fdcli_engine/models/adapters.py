"""Pooling adapters over fd's decoders: `--convert embed` (a causal LM or a bare `*Model` as an embedding
model) and score heads for `*ForSequenceClassification`, `*ForRewardModel`, `*ForProcessRewardModel`.

Each adapter is the base decoder (same layers, same checkpoint names) minus the LM head, plus an optional
`pooler_head` that maps pooled hidden states [N, hidden] (float32 numpy) to scores [N, labels]:
- SequenceClassification: `score` = Linear(hidden, num_labels, no bias) (transformers' layout);
- RewardModel / ProcessRewardModel: `score` = Linear(hidden, hidden) → ReLU → Linear(hidden, num_labels),
  checkpoint names score.0.* and score.2.* (the Qwen2.5-Math RM/PRM layout).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import paddle

from fdcli_engine.errors import InvalidRequestError, ModelLoadError
from fdcli_engine.layers import Linear
from fdcli_engine.models.bert import BertForSequenceClassification, BertModel
from fdcli_engine.models.ernie4_5_vl import Ernie4_5_VLMoeForConditionalGeneration
from fdcli_engine.models.llama import LlamaForCausalLM
from fdcli_engine.models.qwen2 import Qwen2ForCausalLM
from fdcli_engine.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from fdcli_engine.models.qwen3 import Qwen3ForCausalLM

logger = logging.getLogger(__name__)

# Architecture-name prefix -> the decoder that holds its body (longest prefix first: Qwen3 and
# Qwen2_5_VL before Qwen2). A vision-language body keeps its vision tower: its pooling models take
# images (the pooling runner fills the placeholder rows as the generate runner does).
BASE_DECODERS = {
    "Qwen3": Qwen3ForCausalLM,
    "Qwen2_5_VL": Qwen2_5_VLForConditionalGeneration,
    "Ernie4_5_VLMoe": Ernie4_5_VLMoeForConditionalGeneration,
    "Qwen2": Qwen2ForCausalLM,
    "Llama": LlamaForCausalLM,
}
GENERATIVE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration")
HEAD_SUFFIXES = ("ForSequenceClassification", "ForProcessRewardModel", "ForRewardModel")


def _base_decoder(arch: str):
    for prefix, cls in BASE_DECODERS.items():
        if arch.startswith(prefix):
            return cls
    return None


def _num_labels(cfg: dict, default: int) -> int:
    if isinstance(cfg.get("id2label"), dict) and cfg["id2label"]:
        return len(cfg["id2label"])
    return int(cfg.get("num_labels") or default)


class _PoolingDecoderMixin:
    """Drops the LM head from the decoder's checkpoint table and accepts `*Model` checkpoints whose
    names lack the `model.` prefix (how Qwen3-Embedding and other base models are saved)."""

    is_pooling_model = True
    pooler_head = None
    compute_greedy_tokens = None  # no token logits (compute_logits says so)

    def _build_targets(self, qkv_bias: bool):
        targets = super()._build_targets(qkv_bias)
        targets.pop("lm_head.weight", None)
        return targets

    def _init_head(self, cfg: dict) -> None:
        self.tie_word_embeddings = False  # never copy the embedding into an LM head nobody uses
        self._head_parts: dict[str, Linear] = {}

    def load_weights(self, weights: Iterable[tuple[str, np.ndarray]]) -> None:
        seen_head: set[str] = set()

        def body():
            for name, array in weights:
                if name.startswith(("lm_head.", "model.lm_head.")):
                    continue
                if name.startswith("score."):
                    self._load_head(name, array)
                    seen_head.add(name)
                    continue
                yield (name if name.startswith("model.") else "model." + name), array

        super().load_weights(body())
        missing = sorted(
            ".".join(filter(None, ("score", p, k)))
            for p, lin in self._head_parts.items()
            for k in self._kinds(lin)
        )
        missing = [m for m in missing if m not in seen_head]
        if missing:
            raise ModelLoadError(f"checkpoint is missing tensor(s): {', '.join(missing)}")

    @staticmethod
    def _kinds(lin: Linear) -> tuple[str, ...]:
        return ("weight", "bias") if lin.has_bias else ("weight",)

    def _load_head(self, name: str, array: np.ndarray) -> None:
        part, _, kind = name.removeprefix("score.").rpartition(".")
        lin = self._head_parts.get(part or "")
        if lin is None or kind not in self._kinds(lin):
            logger.warning("ignoring unexpected checkpoint tensor %s", name)
            return
        try:
            lin.load_shard(0, **{kind: np.asarray(array, dtype=np.float32)})
        except ValueError as exc:
            raise ModelLoadError(f"tensor {name}: {exc}") from None

    def compute_logits(self, hidden):
        raise InvalidRequestError("this is a pooling model: it produces no token logits")


def _with_linear_head(base):
    class ForSequenceClassification(_PoolingDecoderMixin, base):
        def __init__(self, hf_config: dict, engine_config):
            super().__init__(hf_config, engine_config)
            self._init_head(hf_config)
            self.num_labels = _num_labels(hf_config, 2)
            self._head_parts[""] = Linear(self.hidden_size, self.num_labels, False)

        def pooler_head(self, x: np.ndarray) -> np.ndarray:
            with paddle.no_grad():
                return self._head_parts[""](paddle.to_tensor(x)).numpy()

    return ForSequenceClassification


def _with_mlp_head(base, default_labels: int):
    class ForRewardModel(_PoolingDecoderMixin, base):
        def __init__(self, hf_config: dict, engine_config):
            super().__init__(hf_config, engine_config)
            self._init_head(hf_config)
            self.num_labels = _num_labels(hf_config, default_labels)
            h = self.hidden_size
            self._head_parts["0"] = Linear(h, h, True)
            self._head_parts["2"] = Linear(h, self.num_labels, True)

        def pooler_head(self, x: np.ndarray) -> np.ndarray:
            with paddle.no_grad():
                y = paddle.nn.functional.relu(self._head_parts["0"](paddle.to_tensor(x)))
                return self._head_parts["2"](y).numpy()

    return ForRewardModel


def _as_embedding(base):
    class ForEmbedding(_PoolingDecoderMixin, base):
        def __init__(self, hf_config: dict, engine_config):
            super().__init__(hf_config, engine_config)
            self._init_head(hf_config)

    return ForEmbedding


def resolve_pooling_class(hf_config: dict, convert: str, source: str = "config"):
    """The fd class for a pooling runner over this config; `source` is named in errors."""
    archs = hf_config.get("architectures") or []
    arch = str(archs[0]) if archs else ""
    if arch == "BertModel":
        return BertModel
    if arch == "BertForSequenceClassification":
        return BertForSequenceClassification
    base = _base_decoder(arch)
    if base is None:
        raise ModelLoadError(
            f"{source}: architecture {arch!r} has no pooling support in fd; supported: BertModel, "
            "BertForSequenceClassification, "
            "Llama/Qwen2/Qwen3 *ForCausalLM and Qwen2_5_VL/Ernie4_5_VLMoe *ForConditionalGeneration "
            "(--convert embed), "
            "*Model, *ForSequenceClassification, "
            "*ForRewardModel, *ForProcessRewardModel"
        )
    if arch.endswith("ForSequenceClassification"):
        cls = _with_linear_head(base)
    elif arch.endswith("ForProcessRewardModel"):
        cls = _with_mlp_head(base, 2)
    elif arch.endswith("ForRewardModel"):
        cls = _with_mlp_head(base, 1)
    elif arch.endswith(GENERATIVE_SUFFIXES) and convert != "embed":
        raise ModelLoadError(f"{source}: {arch} is a generative model: pass --convert embed to pool it")
    else:
        cls = _as_embedding(base)
    cls.__name__ = cls.__qualname__ = arch if not arch.endswith(GENERATIVE_SUFFIXES) else f"{arch}(embed)"
    return cls


def load_pooling_model(engine_config):
    """Like loader.load_model, with the pooling class for the config's architecture and --convert."""
    from fdcli_engine.loader import LAYOUTS, detect_layout  # noqa: PLC0415

    layout, p = detect_layout(engine_config.model_path)
    source = p / "config.json" if layout == "hf" else p
    cls = resolve_pooling_class(engine_config.hf_config, engine_config.convert, str(source))
    try:
        model = cls(engine_config.hf_config, engine_config)
        model.load_weights(LAYOUTS[layout][1](p, engine_config.hf_config, engine_config.quantization))
    except ModelLoadError as exc:
        msg = str(exc)
        raise ModelLoadError(msg if msg.startswith(str(p)) else f"{p}: {msg}") from None
    return model
