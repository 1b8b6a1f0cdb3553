"""`"method": "eagle"` / `"eagle3"`: an EAGLE head trained for the target drafts, as vLLM's
`--speculative-config '{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", ...}'`
(models/llama_eagle.py; EAGLE-3: models/llama_eagle3.py).

The head is read from `spec.model` (a folder, or a Hugging Face id in the local cache); quantized as
`spec.quantization`, else as the target. Refused at start, in one line: a folder that is not such a
head (no safetensors, a tensor the head does not have, one it lacks), and a head trained for another
target (its hidden_size or vocab_size differs from the target's; EAGLE-3: target layers it names that
the target does not have as three distinct layers).

Rows of a step: head_proposer.py (the same rows as ERNIE's MTP: token j+1 with hidden state j). An
EAGLE-3 head's first rows read the target's auxiliary hidden states of the step (the inputs of three of
its layers, models/decoder.py decode_layers), through the head's fc.
"""

from __future__ import annotations

from fdcli_engine.config import resolve_model_path
from fdcli_engine.errors import ConfigError, ModelLoadError
from fdcli_engine.models.decoder import DecoderForCausalLM
from fdcli_engine.models.llama_eagle import EagleHeadBase, EagleLlama
from fdcli_engine.models.llama_eagle3 import Eagle3Llama, aux_layer_ids
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner.head_proposer import HeadProposer, head_quantization, hidden_rows
from fdcli_engine.runner.model_proposer import gather_rows


def load_eagle_head(config: ResolvedConfig, target_model) -> EagleHeadBase:
    from fdcli_engine.loader import detect_layout, read_model_config  # noqa: PLC0415
    from fdcli_engine.loader.hf import iter_hf_weights, safetensors_files  # noqa: PLC0415

    spec = config.speculative_config
    what = f"--speculative-config: method {spec.method}"
    try:
        path = resolve_model_path(spec.model)
        layout, path = detect_layout(path)
        if layout != "hf":
            raise ModelLoadError(f"{path}: an EAGLE head is a folder with config.json and *.safetensors")
        check_safetensors(path)
        hf_config = read_model_config(path)
        fc_bias = "fc.bias" in _tensor_names(safetensors_files(path))
    except (ConfigError, ModelLoadError) as exc:
        raise ConfigError(f"{what}: {exc}") from None
    check_head_fits(spec.model, spec.method, hf_config, target_model)
    quantization = head_quantization(config)
    try:
        if spec.method == "eagle3":
            head = Eagle3Llama(hf_config, target_model, config.max_model_len, quantization)
        else:
            head = EagleLlama(hf_config, target_model, config.max_model_len, quantization, fc_bias)
        head.load_weights(iter_hf_weights(path), str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{what}: {path}/config.json lacks or has an invalid field ({exc})") from None
    except ModelLoadError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    for name, shared in (("embed_tokens", head.embed_tokens), ("lm_head", head.lm_head)):
        if shared is getattr(target_model, name) and head.hidden_size != target_model.hidden_size:
            raise ConfigError(
                f"{what}: the head {spec.model} has hidden_size {head.hidden_size} and no {name} of its "
                f"own, the target's is {target_model.hidden_size} wide: use a head for this target"
            )
    return head


def check_head_fits(name: str, method: str, head_config: dict, target_model) -> None:
    """A head reads the target's hidden states and tokens: its widths must be the target's (an EAGLE-3
    fc reads `target_hidden_size` where the config gives it), and an EAGLE-3 head the target's layers."""
    width_key = "hidden_size"
    if method == "eagle3" and head_config.get("target_hidden_size"):
        width_key = "target_hidden_size"
    for key, target_value in ((width_key, target_model.hidden_size), ("vocab_size", target_model.vocab_size)):
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
    if method == "eagle3":
        draft_vocab = int(head_config.get("draft_vocab_size") or target_model.vocab_size)
        if draft_vocab > target_model.vocab_size:
            raise ConfigError(
                f"--speculative-config: the EAGLE-3 head {name} has draft_vocab_size {draft_vocab}, more than "
                f"the target's {target_model.vocab_size} tokens: use a head trained for this target model"
            )
        check_aux_layers(name, head_config, target_model)


def check_aux_layers(name: str, head_config: dict, target_model) -> None:
    if not isinstance(target_model, DecoderForCausalLM) or not target_model.keeps_aux_hidden_states:
        raise ConfigError(
            f"--speculative-config: method eagle3 reads hidden states of the target's layers, which fd does "
            f"not keep for {type(target_model).__name__}: use eagle or ngram"
        )
    n = target_model.num_layers
    ids = aux_layer_ids(head_config, n)
    if len(set(ids)) != 3 or not all(0 <= i <= n for i in ids):
        raise ConfigError(
            f"--speculative-config: the EAGLE-3 head {name} reads target layers {list(ids)}, which the "
            f"{n}-layer target does not have as three distinct layers: name three of 0..{n} in its "
            "config's eagle_aux_hidden_state_layer_ids"
        )


def check_safetensors(path) -> None:
    """Heads published as PyTorch pickles (pytorch_model.bin) are named as the one fd cannot read."""
    if not any(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.glob("*.bin"))
        if pickles:
            raise ModelLoadError(
                f"{path}: the head is stored as {pickles[0]}, and fd reads safetensors only: convert it "
                '(safetensors.torch.save_file(torch.load(...), "model.safetensors"); '
                "docs/speculative-decoding.md)"
            )


def _tensor_names(files) -> set[str]:
    from fdcli_engine.loader.safetensors_io import read_safetensors_header  # noqa: PLC0415

    return {name for f in files for name in read_safetensors_header(f)[0]}


class EagleProposer(HeadProposer):
    def __init__(self, config: ResolvedConfig, target_model):
        head = load_eagle_head(config, target_model)
        super().__init__(config, head)
        self.target = target_model
        self.reads_aux = isinstance(head, Eagle3Llama) and head.use_aux_hidden_state
        if self.reads_aux:
            target_model.aux_hidden_state_layers = aux_layer_ids(head.config, target_model.num_layers)

    def first_hidden(self, step, rows):
        if not self.reads_aux:
            return super().first_hidden(step, rows)
        aux = gather_rows(self.target.aux_hidden_states, hidden_rows(rows))
        return self.model.combine_hidden_states(aux)
