"""Pooler configuration: which runner a model gets, how its hidden states are pooled, and what the front
end does to the pooled vector.

Resolution order for the pooler settings (later wins):
  1. task defaults (embed: LAST + L2 normalize; classify/reward: LAST, raw logits; reward model: ALL;
     process reward: STEP + softmax), with a per-architecture default type (BertModel: CLS);
  2. a sentence-transformers folder's modules.json (its Pooling module's mode, a Normalize module);
  3. `--pooler-config` / `--override-pooler-config` JSON.

Leaf module: reads JSON files, imports nothing above errors.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fdcli_engine.errors import ConfigError

POOLING_TYPES = ("LAST", "ALL", "CLS", "MEAN", "STEP")
OVERRIDE_KEYS = {"pooling_type", "normalize", "softmax", "dimensions", "step_tag_id", "returned_token_ids"}

# Architectures whose weights are an encoder/base model without an LM head: pooling only.
_POOLING_SUFFIXES = ("ForSequenceClassification", "ForRewardModel", "ForProcessRewardModel")
_EMBED_ONLY = {"BertModel"}
# BERT pools [CLS]: the embedding default of BertModel, and where a cross-encoder's head reads.
_DEFAULT_TYPE_BY_ARCH = {"BertModel": "CLS", "BertForSequenceClassification": "CLS"}

# sentence-transformers Pooling-module flags -> fd pooling type (the first true flag wins).
_ST_MODES = (
    ("pooling_mode_mean_tokens", "MEAN"),
    ("pooling_mode_cls_token", "CLS"),
    ("pooling_mode_lasttoken", "LAST"),
)


@dataclass
class PoolerConfig:
    task: str  # "embed" | "classify" | "reward" | "process_reward"
    pooling_type: str
    normalize: bool
    softmax: bool
    dimensions: int | None = None  # default matryoshka truncation of every embedding
    step_tag_id: int | None = None  # STEP: positions of this token carry the step scores
    returned_token_ids: list[int] | None = None  # STEP/ALL: keep only these score columns
    is_matryoshka: bool = False  # the model was trained so that truncated embeddings stay meaningful
    max_seq_length: int | None = None  # sentence-transformers' own input limit

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PoolerConfig:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def parse_pooler_config(value: str | dict | None) -> dict | None:
    """The `--pooler-config` value (a JSON object, as text or already parsed) as a dict."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(f"--pooler-config is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError('--pooler-config must be a JSON object, e.g. \'{"pooling_type": "MEAN"}\'')
    unknown = sorted(set(value) - OVERRIDE_KEYS - set(PoolerConfig.__dataclass_fields__))
    if unknown:
        raise ConfigError(
            f"--pooler-config: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(OVERRIDE_KEYS))}"
        )
    return dict(value)


def architecture(hf_config: dict) -> str:
    archs = hf_config.get("architectures") or []
    return str(archs[0]) if archs else ""


def pooling_task(arch: str) -> str | None:
    """The pooling task an architecture implies, or None for a generative (causal LM) architecture."""
    if arch.endswith("ForProcessRewardModel"):
        return "process_reward"
    if arch.endswith("ForRewardModel"):
        return "reward"
    if arch.endswith("ForSequenceClassification"):
        return "classify"
    if arch in _EMBED_ONLY or (arch.endswith("Model") and not arch.endswith("ForCausalLM")):
        return "embed"
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None


def sentence_transformers_settings(model_path: Path | None) -> dict:
    """pooling_type / normalize / max_seq_length from a sentence-transformers folder; {} if none."""
    if model_path is None or not model_path.is_dir() or not (model_path / "modules.json").is_file():
        return {}
    modules = _read_json(model_path / "modules.json")
    out: dict[str, Any] = {}
    for m in modules if isinstance(modules, list) else []:
        kind = str(m.get("type", ""))
        if kind.endswith(".Normalize"):
            out["normalize"] = True
        elif kind.endswith(".Pooling"):
            cfg_file = model_path / str(m.get("path", "")) / "config.json"
            cfg = _read_json(cfg_file) if cfg_file.is_file() else {}
            mode = next((t for key, t in _ST_MODES if cfg.get(key)), None)
            if mode is None:
                raise ConfigError(f"{cfg_file}: pooling mode not supported (fd has mean, cls, lasttoken)")
            out["pooling_type"] = mode
    if out and "normalize" not in out:
        out["normalize"] = False  # a sentence-transformers model without Normalize returns raw pools
    st = model_path / "sentence_bert_config.json"
    if st.is_file():
        max_len = _read_json(st).get("max_seq_length")
        if isinstance(max_len, int) and max_len > 0:
            out["max_seq_length"] = max_len
    return out


def _task_defaults(task: str, arch: str) -> dict:
    if task == "embed":
        return {"pooling_type": _DEFAULT_TYPE_BY_ARCH.get(arch, "LAST"), "normalize": True, "softmax": False}
    if task == "process_reward":
        return {"pooling_type": "STEP", "normalize": False, "softmax": True}
    if task == "reward":
        return {"pooling_type": "ALL", "normalize": False, "softmax": False}
    # classify: raw logits
    return {"pooling_type": _DEFAULT_TYPE_BY_ARCH.get(arch, "LAST"), "normalize": False, "softmax": False}


def _check(pc: PoolerConfig, hidden_size: int | None) -> None:
    if pc.pooling_type not in POOLING_TYPES:
        raise ConfigError(f"pooling_type {pc.pooling_type!r}: use one of {', '.join(POOLING_TYPES)}")
    for name in ("normalize", "softmax"):
        if not isinstance(getattr(pc, name), bool):
            raise ConfigError(f"--pooler-config {name} must be true or false")
    if pc.dimensions is not None:
        if not isinstance(pc.dimensions, int) or not 1 <= pc.dimensions <= (hidden_size or pc.dimensions):
            raise ConfigError(f"--pooler-config dimensions must be between 1 and {hidden_size}")
    if pc.step_tag_id is not None and not isinstance(pc.step_tag_id, int):
        raise ConfigError("--pooler-config step_tag_id must be a token id (integer)")
    if pc.returned_token_ids is not None and not (
        isinstance(pc.returned_token_ids, list) and all(isinstance(t, int) for t in pc.returned_token_ids)
    ):
        raise ConfigError("--pooler-config returned_token_ids must be a list of integers")


def resolve_runner(config, hf_config: dict, model_path: Path | None) -> dict[str, Any]:
    """The runner settings of an EngineConfig for the model read at `model_path`: a dict of the
    EngineConfig fields to replace (runner, convert, pooler_config, and for a pooling runner
    enable_chunked_prefill, enable_prefix_caching, max_model_len). Pure. Pooling runners schedule every
    prompt whole (no chunked prefill) and keep no prefix cache: the poolers need every prompt token's
    hidden state in one step."""
    if isinstance(config.pooler_config, dict) and "task" in config.pooler_config:
        return {}  # already a resolved PoolerConfig (a ResolvedConfig's, as a dict): kept as is
    arch = architecture(hf_config)
    task = pooling_task(arch)
    override = parse_pooler_config(config.pooler_config)
    runner, convert = config.runner, config.convert
    if runner == "generate":
        if task is not None:
            raise ConfigError(f"{arch} is a pooling model ({task}); it cannot run with --runner generate")
        if convert == "embed":
            raise ConfigError("--convert embed needs --runner pooling (or auto)")
    elif runner == "auto":
        runner = "pooling" if task is not None or convert == "embed" else "generate"
    if runner != "pooling":
        if override:
            raise ConfigError("--pooler-config applies only to pooling models (--runner pooling)")
        return {"runner": runner, "convert": "none"}
    if task is None:
        if convert == "none":
            raise ConfigError(f"{arch} is a causal LM: serve it for pooling with --convert embed")
        task = "embed"  # --runner pooling on a causal LM converts it, as vLLM does
        convert = "embed"
    elif convert == "auto":
        convert = "none"
    settings = {**_task_defaults(task, arch), **sentence_transformers_settings(model_path)}
    settings.update(override or {})
    settings["pooling_type"] = str(settings["pooling_type"]).upper()
    matryoshka = bool(hf_config.get("is_matryoshka") or hf_config.get("matryoshka_dimensions"))
    pc = PoolerConfig(task=task, is_matryoshka=matryoshka, **settings)
    _check(pc, hf_config.get("hidden_size"))
    changes: dict[str, Any] = {
        "runner": runner,
        "convert": convert,
        "pooler_config": pc.to_dict(),
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
    }
    if config.max_model_len is None:
        # sentence-transformers' own input limit and the per-step token budget (prompts are never
        # chunked) bound the model's limit too.
        limit = int(hf_config.get("max_position_embeddings") or 8192)
        for cap in (pc.max_seq_length, config.max_num_batched_tokens):
            if cap:
                limit = min(limit, int(cap))
        changes["max_model_len"] = min(limit, 8192)
    return changes


def get_pooler_config(config) -> PoolerConfig | None:
    """The resolved PoolerConfig of a config whose runner is resolved, None for a generate runner."""
    if getattr(config, "runner", None) != "pooling" or not config.pooler_config:
        return None
    return PoolerConfig.from_dict(config.pooler_config)


def num_labels(hf_config: dict) -> int:
    """The labels of a classification head (id2label, else num_labels, else transformers' 2)."""
    id2label = hf_config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    return int(hf_config.get("num_labels") or 2)


def input_type_prompts(hf_config: dict, model_path: Path | None) -> dict[str, str] | None:
    """The text prefixes Cohere's `input_type` selects, as vLLM finds them: the model config's
    `task_instructions`, else the `prompts` of a sentence-transformers folder's
    config_sentence_transformers.json; None when the model defines neither."""
    for found in (
        hf_config.get("task_instructions"),
        _st_prompts(model_path / "config_sentence_transformers.json") if model_path else None,
    ):
        if isinstance(found, dict):
            prompts = {k: v for k, v in found.items() if isinstance(v, str)}
            if prompts:
                return prompts
    return None


def _st_prompts(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("prompts") if path.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
