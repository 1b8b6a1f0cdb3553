"""`architectures[0]` of a model's config -> fd model class."""

from __future__ import annotations

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.models.bert import BertModel
from fdcli_engine.models.ernie4_5 import Ernie4_5ForCausalLM
from fdcli_engine.models.ernie4_5_moe import Ernie4_5_MoeForCausalLM
from fdcli_engine.models.ernie4_5_vl import Ernie4_5_VLMoeForConditionalGeneration
from fdcli_engine.models.llama import LlamaForCausalLM
from fdcli_engine.models.mistral import MistralForCausalLM
from fdcli_engine.models.qwen2 import Qwen2ForCausalLM
from fdcli_engine.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from fdcli_engine.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY = {
    "BertModel": BertModel,
    "Ernie4_5ForCausalLM": Ernie4_5ForCausalLM,
    "Ernie4_5_ForCausalLM": Ernie4_5ForCausalLM,  # the spelling of baidu's -PT config.json files
    "Ernie4_5_MoeForCausalLM": Ernie4_5_MoeForCausalLM,
    "Ernie4_5_VLMoeForConditionalGeneration": Ernie4_5_VLMoeForConditionalGeneration,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLForConditionalGeneration,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


def resolve_model_class(hf_config: dict, source: str = "config"):
    """The class for this config; `source` (the config file) is named in the error."""
    archs = hf_config.get("architectures") or []
    arch = archs[0] if archs else None
    cls = MODEL_REGISTRY.get(arch) if arch else None
    if cls is None:
        raise ModelLoadError(
            f"{source}: architecture {arch!r} is not supported; supported: {', '.join(supported_architectures())}"
        )
    return cls
