"""Hugging Face folder layout: config.json + *.safetensors (single file, or shards listed in
model.safetensors.index.json)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.loader.safetensors_io import iter_safetensors


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def read_config_json(path: Path) -> dict:
    """The folder's config.json as written (loader.read_model_config is the one reader of a model's
    config: it applies --hf-overrides, then lift_text_config)."""
    cfg_path = path / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{cfg_path}: cannot read config.json ({exc})") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_path}: expected a JSON object")
    return cfg


def lift_text_config(cfg: dict) -> dict:
    """Multimodal wrappers keep the language model's settings under text_config: they are lifted to the
    top (where the decoder reads them), the wrapper's own keys (vision_config, image_token_id...) stay
    beside them; on a clash the language model's value wins."""
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        outer = {k: v for k, v in cfg.items() if k != "text_config"}
        cfg = {**outer, **cfg["text_config"], "architectures": cfg.get("architectures")}
    return cfg


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index}: invalid safetensors index ({exc})") from None
        files = [path / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise ModelLoadError(f"{index}: lists shard(s) that do not exist: {', '.join(absent)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors weights found next to config.json")
    return files


def iter_hf_weights(path: Path, keep=None) -> Iterator[tuple[str, np.ndarray]]:
    """Every tensor of the folder (`keep`: a predicate on names, see iter_safetensors)."""
    for file in safetensors_files(path):
        yield from iter_safetensors(file, keep)
