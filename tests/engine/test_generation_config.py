"""--generation-config / --override-generation-config: which sampling defaults a model folder, a named
folder and the override give (generation_config.py) and the errors at start. No model is loaded here
(test_generation_config_engine.py runs one; the default max_tokens rule: test_request_limits.py)."""

from __future__ import annotations

import json

import pytest

from fdcli_engine.config import EngineConfig, default_model_path
from fdcli_engine.errors import ConfigError
from fdcli_engine.generation_config import sampling_defaults

# What transformers writes for a tiny checkpoint, plus the sampling keys a model card recommends.
MODEL_FILE = {
    "bos_token_id": 1,
    "eos_token_id": [2, 3],
    "do_sample": True,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "min_p": None,  # null: absent
    "max_new_tokens": 64,
    "transformers_version": "5.0.0",
}


@pytest.fixture
def model_dir(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps(MODEL_FILE))
    return folder


def test_auto_takes_the_sampling_keys_of_the_models_file(model_dir):
    defaults, note = sampling_defaults("auto", None, model_dir)
    assert defaults == {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_tokens": 64}
    assert note.startswith(f"default sampling parameters from {model_dir / 'generation_config.json'}: ")
    assert "temperature=0.6, top_p=0.95, top_k=20, max_tokens=64" in note
    assert "--generation-config vllm" in note


def test_vllm_mode_turns_the_file_off_but_keeps_the_override(model_dir):
    assert sampling_defaults("vllm", None, model_dir) == ({}, None)
    defaults, note = sampling_defaults("vllm", {"temperature": 0.5}, model_dir)
    assert defaults == {"temperature": 0.5}
    assert "from --override-generation-config: temperature=0.5" in note


def test_override_extends_and_wins_over_the_file(model_dir):
    override = {"temperature": 0.2, "repetition_penalty": 1.1, "max_new_tokens": 8}
    defaults, note = sampling_defaults("auto", override, model_dir)
    assert defaults == {
        "temperature": 0.2,
        "top_k": 20,
        "top_p": 0.95,
        "max_tokens": 8,
        "repetition_penalty": 1.1,
    }
    assert " and --override-generation-config: " in note


def test_a_named_folder_or_file_replaces_the_models(model_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text('{"top_k": 1}')
    assert sampling_defaults(str(other), None, model_dir)[0] == {"top_k": 1}
    assert sampling_defaults(str(other / "generation_config.json"), None, model_dir)[0] == {"top_k": 1}


def test_no_file_gguf_and_non_sampling_keys_give_no_defaults(tmp_path):
    assert sampling_defaults("auto", None, tmp_path) == ({}, None)  # a folder without the file
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.1}')
    assert sampling_defaults("auto", None, gguf) == ({}, None)  # a .gguf file has no such file
    (tmp_path / "generation_config.json").write_text('{"do_sample": false, "eos_token_id": 2}')
    assert sampling_defaults("auto", None, tmp_path) == ({}, None)


def test_the_default_gguf_model_gets_no_defaults():
    try:
        path = default_model_path()
    except ConfigError as e:
        pytest.skip(str(e))
    assert sampling_defaults("auto", None, path) == ({}, None)


@pytest.mark.parametrize(
    "mode, override, content, message",
    [
        ("{folder}/empty", None, None, "no generation_config.json there; use auto"),
        ("{folder}/missing", None, None, "no generation_config.json there"),
        ("{folder}/bad", None, "{not json", "cannot read .* as JSON"),
        ("{folder}/bad", None, "[1]", "must hold a JSON object"),
        ("{folder}/bad", None, '{"temperature": "hot"}', "temperature must be a number, got 'hot'"),
        ("{folder}/bad", None, '{"temperature": 7}', "temperature must be between 0 and 2"),
        ("{folder}/bad", None, '{"max_new_tokens": 0}', "max_new_tokens must be at least 1"),
        ("auto", {"max_tokens": 5}, None, r"unknown key\(s\) max_tokens; .*\(max_tokens is max_new_tokens"),
        ("auto", {"do_sample": True}, None, r"unknown key\(s\) do_sample; it takes temperature, top_p"),
        ("auto", {"top_k": 1.5}, None, "top_k must be an integer, got 1.5"),
        ("auto", {"top_p": 0}, None, r"--override-generation-config: top_p must be in \(0, 1\]"),
    ],
)
def test_bad_values_are_one_config_error(tmp_path, mode, override, content, message):
    (tmp_path / "empty").mkdir()
    if content is not None:
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "generation_config.json").write_text(content)
    with pytest.raises(ConfigError, match=message):
        sampling_defaults(mode.format(folder=tmp_path), override, tmp_path)


def test_engine_config_checks_the_override_before_the_model_loads():
    EngineConfig(generation_config="vllm", override_generation_config={"top_k": 1}).validate()
    with pytest.raises(ConfigError, match="unknown key"):
        EngineConfig(override_generation_config={"temp": 1}).validate()
    with pytest.raises(ConfigError, match="--generation-config must be auto, vllm or a folder"):
        EngineConfig(generation_config="").validate()
    with pytest.raises(ConfigError, match="override_generation_config must be a mapping"):
        EngineConfig.from_dict({"override_generation_config": "{}"})
