"""`"method": "eagle"`: an EAGLE head trained for the target drafts (models/llama_eagle.py), as vLLM's
`--speculative-config '{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", ...}'`.

The head is read from `spec.model` (a folder, or a Hugging Face id in the local cache); quantized as
`spec.quantization`, else as the target. Refused at start, in one line: a folder that is not an EAGLE
head (no safetensors, a tensor the head does not have, one it lacks), and a head trained for another
target (its hidden_size or vocab_size differs from the target's).

Rows of a step: head_proposer.py (the same rows as ERNIE's MTP: token j+1 with hidden state j).
"""

from __future__ import annotations

from fdcli_engine.config import resolve_model_path
from fdcli_engine.errors import ConfigError, ModelLoadError
from fdcli_engine.models.llama_eagle import EagleLlama
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner.head_proposer import HeadProposer, head_quantization


def load_eagle_head(config: ResolvedConfig, target_model) -> EagleLlama:
    from fdcli_engine.loader import detect_layout, read_model_config  # noqa: PLC0415
    from fdcli_engine.loader.hf import iter_hf_weights, safetensors_files  # noqa: PLC0415

    spec = config.speculative_config
    what = f"--speculative-config: method {spec.method}"
    try:
        path = resolve_model_path(spec.model)
        layout, path = detect_layout(path)
        if layout != "hf":
            raise ModelLoadError(f"{path}: an EAGLE head is a folder with config.json and *.safetensors")
        hf_config = read_model_config(path)
        fc_bias = "fc.bias" in _tensor_names(safetensors_files(path))
    except (ConfigError, ModelLoadError) as exc:
        raise ConfigError(f"{what}: {exc}") from None
    check_head_fits(spec.model, hf_config, target_model)
    try:
        head = EagleLlama(hf_config, target_model, config.max_model_len, head_quantization(config), fc_bias)
        head.load_weights(iter_hf_weights(path), str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{what}: {path}/config.json lacks or has an invalid field ({exc})") from None
    except ModelLoadError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    return head


def check_head_fits(name: str, head_config: dict, target_model) -> None:
    """A head reads the target's hidden states and tokens: its widths must be the target's."""
    for key, target_value in (
        ("hidden_size", target_model.hidden_size),
        ("vocab_size", target_model.vocab_size),
    ):
        value = head_config.get(key)
        if value is not None and int(value) != int(target_value):
            raise ConfigError(
                f"--speculative-config: the EAGLE head {name} has {key} {value}, the target {target_value}: "
                "use a head trained for this target model"
            )
    if head_config.get("add_para_norm"):
        raise ConfigError(
            f"--speculative-config: the EAGLE head {name} is a HASS head (add_para_norm), which fd does not "
            "run: use an EAGLE head"
        )


def _tensor_names(files) -> set[str]:
    from fdcli_engine.loader.safetensors_io import read_safetensors_header  # noqa: PLC0415

    return {name for f in files for name in read_safetensors_header(f)[0]}


class EagleProposer(HeadProposer):
    def __init__(self, config: ResolvedConfig, target_model):
        super().__init__(config, load_eagle_head(config, target_model))
