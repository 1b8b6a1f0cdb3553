"""The framework-free pooling serving layer over a scripted engine: input forms, truncation that keeps
[CLS]/[SEP], base64, dimensions/normalize, wrong-runner and bad-input 400s. The scripted engine's raw
pool of a prompt is [len(ids), sum(ids), first id, last id] so every assertion can be computed by hand."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass

import numpy as np
import pytest

from fdcli_engine.config import EngineConfig, default_embedding_model_path
from fdcli_engine.entrypoints.openai.errors import APIError
from fdcli_engine.entrypoints.openai.protocol_pooling import (
    ChatRewardRequest,
    EmbeddingRequest,
    PoolingRequest,
)
from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from fdcli_engine.entrypoints.openai.serving_embedding import OpenAIServingEmbedding, truncate_ids
from fdcli_engine.entrypoints.openai.serving_pooling import OpenAIServingPooling
from fdcli_engine.entrypoints.openai.serving_reward import OpenAIServingReward
from fdcli_engine.pooling.config import resolve_runner
from fdcli_engine.pooling_params import PoolingParams
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.tokenizer import load_tokenizer


@dataclass
class _Out:
    pooled: list
    finished: bool = True


@dataclass
class _ModelConfig:
    served_model_name: str = "m"
    max_model_len: int = 16
    vocab_size: int = 30522


class ScriptedEngine:
    def __init__(self, arch="BertModel", **config):
        self.tokenizer = load_tokenizer(default_embedding_model_path())
        self.model_config = _ModelConfig()
        hf_config = {"architectures": [arch], "hidden_size": 4, "max_position_embeddings": 16}
        self.config = ResolvedConfig(
            hf_config=hf_config, **resolve_runner(EngineConfig(**config), hf_config, None)
        )
        self.calls: list[list[int]] = []

    async def encode(self, ids, pooling_params, request_id):
        assert isinstance(pooling_params, PoolingParams)
        self.calls.append(list(ids))
        yield _Out([float(len(ids)), float(sum(ids)), float(ids[0]), float(ids[-1])])


def embed(engine, **body):
    serving = OpenAIServingEmbedding(engine, ["m"])
    return asyncio.run(serving.create_embedding(EmbeddingRequest(**body)))


def raw(ids):
    return np.array([len(ids), sum(ids), ids[0], ids[-1]], dtype=np.float32)


def test_input_forms_and_usage():
    eng = ScriptedEngine(pooler_config={"normalize": False})
    ids = eng.tokenizer.encode("hello world")
    r = embed(eng, input=["hello world", "hi"])
    assert [d.index for d in r.data] == [0, 1]
    np.testing.assert_array_equal(r.data[0].embedding, raw(ids))
    assert r.usage.prompt_tokens == len(ids) + len(eng.tokenizer.encode("hi"))
    assert embed(eng, input=[5, 6, 7]).data[0].embedding == [3.0, 18.0, 5.0, 7.0]
    assert len(embed(eng, input=[[5, 6], [7]]).data) == 2


def test_normalize_default_and_request_override():
    eng = ScriptedEngine()  # BertModel default: CLS pooling, normalized
    v = np.array(embed(eng, input=[3, 4, 5]).data[0].embedding)
    np.testing.assert_allclose(v, raw([3, 4, 5]) / np.linalg.norm(raw([3, 4, 5])), rtol=1e-6)
    assert embed(eng, input=[3, 4, 5], normalize=False).data[0].embedding == [3.0, 12.0, 3.0, 5.0]


def test_base64_is_float32_little_endian_of_the_float_form():
    eng = ScriptedEngine()
    f = embed(eng, input="hello world").data[0].embedding
    b = embed(eng, input="hello world", encoding_format="base64").data[0].embedding
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(b), dtype="<f4"), np.float32(f))


def test_truncation_keeps_cls_and_sep():
    eng = ScriptedEngine()
    text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
    full = eng.tokenizer.encode(text)
    assert len(full) > 16
    embed(eng, input=text, truncate_prompt_tokens=6)
    assert eng.calls[-1] == full[:5] + [full[-1]]  # [CLS] one two three four [SEP]
    embed(eng, input=text, truncate_prompt_tokens=-1)
    assert len(eng.calls[-1]) == 16 and eng.calls[-1][-1] == full[-1]
    assert truncate_ids([1, 2, 3, 4], 2) == [1, 2]


def test_truncation_side_left_keeps_the_last_tokens():
    """vLLM's truncation_side "left": the last k tokens, still between [CLS] and [SEP]."""
    eng = ScriptedEngine()
    text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
    full = eng.tokenizer.encode(text)
    embed(eng, input=text, truncate_prompt_tokens=6, truncation_side="left")
    assert eng.calls[-1] == [full[0]] + full[-5:]  # [CLS] twelve thirteen fourteen fifteen [SEP]
    embed(eng, input=[full[1:-1]], truncate_prompt_tokens=3, truncation_side="left")  # ids: no frame
    assert eng.calls[-1] == full[-4:-1]
    embed(eng, input=text, truncate_prompt_tokens=6, truncation_side="right")
    assert eng.calls[-1] == full[:5] + [full[-1]]


def test_dimensions_on_matryoshka_model_truncates_before_normalizing():
    eng = ScriptedEngine("Qwen3Model")
    eng.config.pooler_config["is_matryoshka"] = True
    v = embed(eng, input=[3, 4, 5], dimensions=2).data[0].embedding
    np.testing.assert_allclose(v, raw([3, 4, 5])[:2] / np.linalg.norm(raw([3, 4, 5])[:2]), rtol=1e-6)


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"input": ""}, "input", "empty string"),
        ({"input": []}, "input", "input is empty"),
        ({"input": ["a", ""]}, "input[1]", "empty string"),
        ({"input": list(range(17))}, "input", "at most 16"),
        ({"input": [30522]}, "input", "outside the vocabulary"),
        ({"input": "x", "dimensions": 2}, "dimensions", "matryoshka"),
        ({"input": "x", "truncate_prompt_tokens": 17}, "truncate_prompt_tokens", "between 1 and 16"),
        ({}, "input", "exactly one of input or messages"),
        ({"input": "a", "messages": [{"role": "user", "content": "a"}]}, "input", "exactly one"),
        ({"input": "x", "model": "other"}, "model", "does not exist"),
    ],
)
def test_bad_embedding_requests(body, param, needle):
    with pytest.raises(APIError) as e:
        embed(ScriptedEngine(), **body)
    assert e.value.status == (404 if param == "model" else 400)
    assert e.value.param == param and needle in e.value.message


def test_wrong_runner_is_400_on_both_routes():
    gen = ScriptedEngine("LlamaForCausalLM")
    with pytest.raises(APIError, match="needs a pooling model") as e:
        embed(gen, input="x")
    assert e.value.status == 400
    reward = OpenAIServingReward(ScriptedEngine(), ["m"])
    req = ChatRewardRequest(messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(APIError, match="runs an embedding model: use /v1/embeddings") as e:
        asyncio.run(reward.create_reward(req))
    with pytest.raises(APIError, match="use /v1/chat/reward"):
        embed(ScriptedEngine("Qwen2ForRewardModel"), input="x")


def test_images_on_text_model_are_a_400_naming_the_part():
    reward = OpenAIServingReward(ScriptedEngine("Qwen2ForRewardModel"), ["m"])
    from image_fixtures import data_url, encoded

    # A good picture is loaded and checked first, then refused by the model; a bad one is refused as bad.
    for url, words in (
        (data_url(encoded("PNG")), "does not accept images"),
        ("http://x/y.png", "not allowed"),
    ):
        content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]
        req = ChatRewardRequest(messages=[{"role": "user", "content": content}])
        with pytest.raises(APIError) as e:
            asyncio.run(reward.create_reward(req))
        assert e.value.status == 400 and e.value.param == "messages[0].content[1]"
        assert words in e.value.message


def test_request_chat_template_needs_the_server_flag():
    reward = OpenAIServingReward(ScriptedEngine("Qwen2ForRewardModel"), ["m"])
    req = ChatRewardRequest(messages=[{"role": "user", "content": "hi"}], chat_template="{{ messages }}")
    with pytest.raises(APIError) as e:
        asyncio.run(reward.create_reward(req))
    assert e.value.status == 400 and e.value.param == "chat_template"
    trusted_chat = OpenAIServingChat(reward.engine, ["m"], allow_request_chat_template=True)
    trusted = OpenAIServingReward(reward.engine, ["m"], trusted_chat)
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    req = ChatRewardRequest(messages=[{"role": "user", "content": "hello world"}], chat_template=template)
    out = asyncio.run(trusted.create_reward(req))
    ids = reward.engine.tokenizer.encode("hello world", add_special_tokens=False)
    assert reward.engine.calls[-1] == ids and out.usage.prompt_tokens == len(ids)


# ---- /pooling (vLLM's generic route: the embeddings path in vLLM's shape) ------------------------------
def pool(engine, **body):
    return asyncio.run(OpenAIServingPooling(engine, ["m"]).create_pooling(PoolingRequest(**body)))


def test_pooling_is_the_embeddings_path_in_vllms_shape():
    eng = ScriptedEngine()
    for body in ({"input": ["hello world", "hi"]}, {"input": [5, 6, 7], "encoding_format": "base64"}):
        want = embed(eng, **body)
        got = pool(eng, **body)
        assert got.object == "list" and got.id.startswith("pool-") and got.model == "m"
        assert [(d.index, d.object) for d in got.data] == [(i, "pooling") for i in range(len(want.data))]
        assert [d.data for d in got.data] == [d.embedding for d in want.data]
        assert got.usage == want.usage
    assert pool(eng, input="hi", task="embed").data[0].data == embed(eng, input="hi").data[0].embedding


@pytest.mark.parametrize(
    ("arch", "config", "served", "other"),
    [
        ("BertModel", {}, "embed", "token_embed"),
        ("BertModel", {"pooler_config": {"pooling_type": "ALL"}}, "token_embed", "embed"),
        ("Qwen2ForRewardModel", {}, "token_classify", "classify"),
    ],
)
def test_pooling_task_may_only_name_what_the_pooler_computes(arch, config, served, other):
    eng = ScriptedEngine(arch, **config)
    assert pool(eng, input="hi", task=served).data[0].index == 0
    with pytest.raises(APIError) as e:
        pool(eng, input="hi", task=other)
    assert e.value.status == 400 and e.value.param == "task"
    assert f"its pooler gives {served}" in e.value.message and "--pooler-config" in e.value.message


def test_pooling_on_a_generative_model_is_vllms_400():
    with pytest.raises(APIError) as e:
        pool(ScriptedEngine("LlamaForCausalLM"), input="x")
    assert e.value.status == 400 and e.value.param == "model"
    assert e.value.message.startswith("The model does not support Pooling API")
