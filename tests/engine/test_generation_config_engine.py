"""A tiny checkpoint whose generation_config.json sets top_k 1, temperature 0.9 and max_new_tokens 5,
through a real engine: the resolver reads it once, the server's chat route and the offline LLM apply it
to what a request leaves out (top_k 1 makes a temperature-0.9 request greedy; max_new_tokens bounds
the length), a request's own values win, and --generation-config vllm / the override change it.

Oracle: the same prompt with explicit greedy params (temperature 0), the engine's own rule."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from server.inproc_app import inproc_app

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.config import EngineConfig
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions

GENERATION_CONFIG = {
    "do_sample": True,
    "temperature": 0.9,
    "top_k": 1,
    "max_new_tokens": 5,
    "eos_token_id": 2,
}
ENGINE = {"max_model_len": 64, "block_size": 8, "num_kv_blocks": 64}
MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


@pytest.fixture(scope="module")
def model(tiny_model_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gen-config") / "model"
    shutil.copytree(tiny_model_dir("LlamaForCausalLM"), folder)  # the shared one stays as it is
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return folder


@pytest.fixture(scope="module")
def llm(model):
    return LLM(str(model), **ENGINE)


def _resolved_defaults(model: Path, **options) -> dict:
    return resolve_config(
        EngineConfig.from_dict({"model": str(model), **ENGINE, **options})
    ).default_sampling_params


def test_the_resolver_reads_the_defaults_once_and_logs_them(model, caplog):
    with caplog.at_level("WARNING", logger="fd.config"):
        assert _resolved_defaults(model) == {"temperature": 0.9, "top_k": 1, "max_tokens": 5}
    notes = [r.getMessage() for r in caplog.records if "default sampling parameters" in r.getMessage()]
    assert len(notes) == 1 and "temperature=0.9, top_k=1, max_tokens=5" in notes[0]
    assert _resolved_defaults(model, generation_config="vllm") == {}
    override = {"temperature": 0.5, "max_new_tokens": 3}
    assert _resolved_defaults(model, override_generation_config=override) == {
        "temperature": 0.5, "top_k": 1, "max_tokens": 3,
    }  # fmt: skip


def test_offline_llm_defaults_apply_without_params(llm):
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.9, 1, 5)
    ids = llm.tokenizer.encode(MESSAGES[0]["content"])
    long = llm.generate(ids, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].token_ids
    assert len(long) > 5  # the tiny model does not stop on its own within the default length
    (out,) = llm.generate(ids)  # temperature 0.9 with top_k 1: greedy, cut at max_new_tokens
    assert out.outputs[0].token_ids == long[:5] and out.outputs[0].finish_reason == "length"
    # Params given are used as they are (vLLM's LLM): 12 tokens, not the model's 5.
    assert len(llm.generate(ids, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].token_ids) == 12


def test_chat_route_applies_the_defaults_and_the_request_wins(model):
    with inproc_app(model, ServingOptions(), **ENGINE) as (client, _):
        greedy = client.chat.completions.create(
            model=str(model), messages=MESSAGES, temperature=0, max_tokens=12
        )
        assert greedy.usage.completion_tokens == 12
        got = client.chat.completions.create(model=str(model), messages=MESSAGES, seed=7)
        assert got.usage.completion_tokens == 5 and got.choices[0].finish_reason == "length"
        short = client.chat.completions.create(
            model=str(model), messages=MESSAGES, temperature=0, max_tokens=5
        )
        assert got.choices[0].message.content == short.choices[0].message.content  # top_k 1: greedy
        explicit = client.chat.completions.create(model=str(model), messages=MESSAGES, max_tokens=8, seed=7)
        assert explicit.usage.completion_tokens == 8


def test_vllm_mode_serves_the_engines_own_defaults(model):
    with inproc_app(model, ServingOptions(), generation_config="vllm", **ENGINE) as (client, _):
        got = client.chat.completions.create(model=str(model), messages=MESSAGES, temperature=0)
        assert got.usage.completion_tokens > 5  # up to the context's room, not max_new_tokens
