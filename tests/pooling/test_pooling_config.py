"""Runner / convert / pooler-config resolution: defaults per task, modules.json priority, overrides,
and the errors for impossible combinations. No model weights are loaded."""

from __future__ import annotations

import json

import pytest

from fdcli_engine.config import EngineConfig, default_embedding_model_path
from fdcli_engine.errors import ConfigError
from fdcli_engine.pooling.config import get_pooler_config, parse_pooler_config, pooling_task, resolve_runner


def cfg(arch: str, model_path=None, **kw) -> EngineConfig:
    c = EngineConfig(**kw)
    return c.replace(**resolve_runner(c, hf_config_of(arch), model_path))


def hf_config_of(arch: str) -> dict:
    return {"architectures": [arch], "hidden_size": 64, "max_position_embeddings": 512}


@pytest.mark.parametrize(
    ("arch", "task"),
    [
        ("BertModel", "embed"),
        ("Qwen3Model", "embed"),
        ("Qwen3ForCausalLM", None),
        ("LlamaForSequenceClassification", "classify"),
        ("Qwen2ForRewardModel", "reward"),
        ("Qwen2ForProcessRewardModel", "process_reward"),
    ],
)
def test_pooling_task_from_architecture(arch, task):
    assert pooling_task(arch) == task


def test_auto_runner_and_task_defaults():
    c = cfg("Qwen3ForCausalLM")
    assert (c.runner, c.convert, get_pooler_config(c)) == ("generate", "none", None)
    assert c.enable_chunked_prefill  # the generate path is left as it was
    c = cfg("Qwen3ForCausalLM", convert="embed")
    pc = get_pooler_config(c)
    assert (c.runner, pc.pooling_type, pc.normalize) == ("pooling", "LAST", True)
    assert not c.enable_chunked_prefill and not c.enable_prefix_caching
    pc = get_pooler_config(cfg("BertModel"))
    assert (pc.pooling_type, pc.normalize) == ("CLS", True)  # a bare BERT without modules.json
    pc = get_pooler_config(cfg("Qwen2ForProcessRewardModel"))
    assert (pc.pooling_type, pc.softmax) == ("STEP", True)
    # --runner pooling on a causal LM converts it, as --convert embed would.
    assert cfg("LlamaForCausalLM", runner="pooling").convert == "embed"


def test_sentence_transformers_modules_json_beats_defaults_and_override_beats_both():
    path = default_embedding_model_path()
    c = cfg("BertModel", model_path=path)
    pc = get_pooler_config(c)
    assert (pc.pooling_type, pc.normalize, pc.max_seq_length) == ("MEAN", True, 256)
    assert c.max_model_len == 256  # sentence_bert_config.json's max_seq_length bounds the input
    c = cfg("BertModel", model_path=path, pooler_config={"pooling_type": "cls", "normalize": False})
    pc = get_pooler_config(c)
    assert (pc.pooling_type, pc.normalize) == ("CLS", False)


def test_modules_json_without_normalize_means_raw(tmp_path):
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        )
    )
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))
    pc = get_pooler_config(cfg("Qwen3Model", model_path=tmp_path))
    assert (pc.pooling_type, pc.normalize) == ("LAST", False)


def test_resolution_is_idempotent():
    c = cfg("Qwen3ForCausalLM", convert="embed", pooler_config={"pooling_type": "MEAN"})
    before = dict(c.pooler_config)
    c = c.replace(**resolve_runner(c, hf_config_of("Qwen3ForCausalLM"), None))
    assert c.pooler_config == before


@pytest.mark.parametrize(
    ("arch", "kw", "needle"),
    [
        ("BertModel", {"runner": "generate"}, "cannot run with --runner generate"),
        ("Qwen3ForCausalLM", {"runner": "generate", "convert": "embed"}, "--convert embed needs"),
        ("Qwen3ForCausalLM", {"runner": "pooling", "convert": "none"}, "--convert embed"),
        ("Qwen3ForCausalLM", {"pooler_config": {"pooling_type": "MEAN"}}, "only to pooling models"),
        ("BertModel", {"pooler_config": {"pooling_type": "MAX"}}, "pooling_type 'MAX'"),
        ("BertModel", {"pooler_config": {"dimensions": 65}}, "dimensions must be between 1 and 64"),
        ("BertModel", {"pooler_config": {"normalise": True}}, "unknown key(s) normalise"),
    ],
)
def test_bad_combinations_are_one_line_config_errors(arch, kw, needle):
    with pytest.raises(ConfigError, match=".*") as e:
        cfg(arch, **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_parse_pooler_config_text():
    assert parse_pooler_config('{"pooling_type": "MEAN"}') == {"pooling_type": "MEAN"}
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_pooler_config("{pooling_type")
    with pytest.raises(ConfigError, match="JSON object"):
        parse_pooler_config("[1]")
