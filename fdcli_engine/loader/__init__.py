"""Model loading: find the layout of a model path, read its config, build the model, stream weights.

Layouts (one entry each in LAYOUTS; adding FastDeploy's "-Paddle" folders is one more entry):
- "hf": a folder with config.json and *.safetensors.
- "paddle": FastDeploy's "-Paddle" folders (config.json + safetensors with Paddle names, [in, out]
  Linear weights, fused projections); paddle_layout.py renames and transposes them into HF names.
- "gguf": a .gguf file, or a folder holding exactly one.
Every failure a user can cause (missing path, not a model, corrupt or truncated file, missing tensor,
unsupported architecture) is a ModelLoadError whose one-line message names the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.hf_overrides import apply_hf_overrides
from fdcli_engine.loader.gguf_io import (
    iter_gguf_tensors,
    iter_gguf_weights,
    read_gguf_config,
    release_gguf_readers,
)
from fdcli_engine.loader.hf import is_hf_folder, iter_hf_weights, lift_text_config, read_config_json
from fdcli_engine.loader.paddle_layout import is_paddle_folder, iter_paddle_weights


def _iter_hf(path: Path, hf_config: dict, quantization: str | None):
    if quantization == "gguf":
        raise ModelLoadError(f"{path}: --quantization gguf keeps GGUF blocks and needs a .gguf model")
    return iter_hf_weights(path)


def _iter_gguf(path: Path, hf_config: dict, quantization: str | None):
    return iter_gguf_weights(path, quantization)


# layout -> (read the config as stored: path -> dict,
#            iter_weights(path, hf_config, quantization) -> Iterator[(hf_name, array)]).
# Arrays are fp32 [out, in], or gguf_io.QuantizedTensor for GGUF linear weights under --quantization gguf.
# The stored config is read by read_model_config only (--hf-overrides apply there).
LAYOUTS = {
    "hf": (read_config_json, _iter_hf),
    "paddle": (read_config_json, iter_paddle_weights),  # config.json keys as in the HF layout
    "gguf": (read_gguf_config, _iter_gguf),
}

__all__ = ["detect_layout", "iter_gguf_tensors", "iter_mtp_weights", "load_model", "read_model_config"]

# Names of ERNIE-4.5's multi-token-prediction head: Paddle layout, HF layout, or a bare MTP folder.
_MTP_PREFIXES = ("ernie.mtp_", "model.mtp_", "mtp_")


def detect_layout(path: str | os.PathLike) -> tuple[str, Path]:
    """(layout name, the path its functions take)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(f"{p}: model path does not exist")
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            return "gguf", p
        raise ModelLoadError(f"{p}: not a model: expected a .gguf file or a folder with config.json")
    if is_hf_folder(p):
        # Both folder layouts have config.json; the tensor names tell them apart.
        return ("paddle" if is_paddle_folder(p) else "hf"), p
    ggufs = sorted(p.glob("*.gguf"))
    if len(ggufs) == 1:
        return "gguf", ggufs[0]
    if len(ggufs) > 1:
        names = ", ".join(g.name for g in ggufs)
        raise ModelLoadError(f"{p}: several .gguf files ({names}); pass the one to load")
    raise ModelLoadError(f"{p}: not a model folder: expected config.json + *.safetensors, or a .gguf file")


def read_model_config(path: str | os.PathLike, hf_overrides: dict | None = None) -> dict:
    """The HF-style config dict of the model at `path`, with `hf_overrides` (--hf-overrides,
    fdcli_engine/hf_overrides.py) applied to it as stored; the one reader of a model's config. See
    fdcli_engine.models.hf_config for the normalized keys: rope_theta, rope_scaling, head_dim,
    num_key_value_heads, tie_word_embeddings."""
    from fdcli_engine.models.hf_config import normalize_hf_config  # noqa: PLC0415

    layout, p = detect_layout(path)
    cfg = lift_text_config(apply_hf_overrides(LAYOUTS[layout][0](p), hf_overrides))
    try:
        return normalize_hf_config(cfg)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{p}: config lacks or has an invalid field ({type(exc).__name__}: {exc})"
        ) from None


def load_model(engine_config):
    """Instantiate the model for a ResolvedConfig and load its weights (quantization as resolved)."""
    from fdcli_engine.models.registry import resolve_model_class  # noqa: PLC0415

    layout, p = detect_layout(engine_config.model_path)
    hf_config = engine_config.hf_config or read_model_config(p)
    source = p if layout == "gguf" else p / "config.json"
    model_cls = resolve_model_class(hf_config, str(source))
    try:
        try:
            model = model_cls(hf_config, engine_config)
        except (KeyError, TypeError, ValueError) as exc:
            # A config missing a field the architecture needs, or holding one of the wrong type.
            raise ModelLoadError(
                f"config lacks or has an invalid field ({type(exc).__name__}: {exc})"
            ) from None
        model.load_weights(LAYOUTS[layout][1](p, hf_config, engine_config.quantization))
    except ModelLoadError as exc:
        msg = str(exc)
        raise ModelLoadError(msg if msg.startswith(str(p)) else f"{p}: {msg}") from None
    finally:
        release_gguf_readers()
    return model


def iter_mtp_weights(path: str | os.PathLike):
    """The MTP head's tensors (HF names `model.mtp_*`, fp32 [out, in]) of a checkpoint folder, the main
    one or a separate MTP folder; only those tensors are read. Empty when the folder has none."""
    layout, p = detect_layout(path)
    if layout == "gguf":
        raise ModelLoadError(f"{p}: a GGUF file carries no MTP head: point the speculative model at a folder")

    def keep(name: str) -> bool:
        return name.startswith(_MTP_PREFIXES)

    if layout == "paddle":
        return iter_paddle_weights(p, read_model_config(p), None, keep)
    return iter_hf_weights(p, keep)
