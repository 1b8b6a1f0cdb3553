"""/v2/embed (Cohere's embed API, as vLLM serves it) over the scripted engine of test_serving_pooling:
each answer equals /v1/embeddings' for the request vLLM makes of it; binary / ubinary / base64 are
checked against numpy's own bit packing and float32 bytes; truncate, input_type and the 400s."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from test_serving_pooling import ScriptedEngine, embed

from fdcli_engine.entrypoints.openai.errors import APIError
from fdcli_engine.entrypoints.openai.protocol_cohere import CohereEmbedRequest
from fdcli_engine.entrypoints.openai.serving_cohere_embed import CohereServingEmbedding
from fdcli_engine.entrypoints.openai.serving_embedding import OpenAIServingEmbedding

LONG = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"


def cohere(engine, **body) -> dict:
    serving = CohereServingEmbedding(OpenAIServingEmbedding(engine, ["m"]))
    return asyncio.run(serving.create_embed(CohereEmbedRequest(**body))).model_dump()


def openai_floats(engine, **body) -> list:
    return [d.embedding for d in embed(engine, **body).data]


class EightWide(ScriptedEngine):
    """A pool of 8 values with both signs (binary types pack 8 to a byte): the ids and their negatives."""

    async def encode(self, ids, pooling_params, request_id):
        async for out in super().encode(ids, pooling_params, request_id):
            out.pooled = [*out.pooled, *(-x for x in out.pooled[::-1])]
            out.pooled[1] = -out.pooled[1]
            yield out


def test_texts_are_the_embeddings_of_the_same_input_in_cohere_shape():
    eng = ScriptedEngine()
    texts = ["hello world", "hi"]
    r = cohere(eng, model="m", texts=texts)
    assert r["embeddings"] == {"float": openai_floats(eng, input=texts)}  # float only, by default
    usage = embed(eng, input=texts).usage.prompt_tokens
    assert r["meta"] == {
        "api_version": {"version": "2"},
        "billed_units": {"input_tokens": usage, "image_tokens": 0},
    }
    assert r["texts"] == texts and r["response_type"] == "embeddings_by_type"
    assert r["id"].startswith("embd-")


def test_every_embedding_type_against_numpy():
    eng = EightWide(pooler_config={"normalize": False})
    r = cohere(eng, texts=["hello world", "a b"], embedding_types=["float", "binary", "ubinary", "base64"])
    floats = np.array(r["embeddings"]["float"], dtype=np.float32)
    assert floats.shape == (2, 8) and (floats < 0).any() and (floats >= 0).any()
    ubinary = np.packbits(floats >= 0, axis=1).astype(int)  # first value in the high bit
    assert r["embeddings"]["ubinary"] == ubinary.tolist()
    assert r["embeddings"]["binary"] == (ubinary - 128).tolist()
    decoded = [np.frombuffer(base64.b64decode(s), dtype="<f4") for s in r["embeddings"]["base64"]]
    np.testing.assert_array_equal(np.stack(decoded), floats)
    assert set(cohere(eng, texts=["x"], embedding_types=["ubinary"])["embeddings"]) == {"ubinary"}


def test_binary_needs_a_multiple_of_8_values():
    with pytest.raises(APIError) as e:
        cohere(ScriptedEngine(), texts=["x"], embedding_types=["binary"])  # 4 values
    assert e.value.status == 400 and e.value.param == "embedding_types" and "multiple of 8" in e.value.message


def test_truncate_end_start_and_none():
    eng = ScriptedEngine()
    full = eng.tokenizer.encode(LONG)
    assert len(full) > 16  # the scripted model's length
    cohere(eng, texts=[LONG], max_tokens=6)  # END, the default: the first tokens
    assert eng.calls[-1] == full[:5] + [full[-1]]
    cohere(eng, texts=[LONG], max_tokens=6, truncate="START")  # the last tokens, [CLS] and [SEP] kept
    assert eng.calls[-1] == [full[0]] + full[-5:]
    assert cohere(eng, texts=[LONG], truncate="START", max_tokens=6)["embeddings"]["float"] == openai_floats(
        eng, input=[LONG], truncate_prompt_tokens=6, truncation_side="left"
    )
    cohere(eng, texts=[LONG])  # END without max_tokens: the model's length
    assert eng.calls[-1] == full[:15] + [full[-1]]
    with pytest.raises(APIError) as e:  # NONE: nothing is cut, so the model's limit refuses it
        cohere(eng, texts=["hi", LONG], truncate="NONE")
    assert e.value.status == 400 and e.value.param == "texts[1]"
    assert e.value.message.startswith("texts[1] has") and "send truncate END or START" in e.value.message
    calls = len(eng.calls)
    with pytest.raises(APIError) as e:  # NONE with max_tokens: a longer text is refused, not cut
        cohere(eng, texts=["hi", "one two three four"], truncate="NONE", max_tokens=5)
    assert e.value.param == "max_tokens" and "texts[1] is 6 tokens" in e.value.message
    assert len(eng.calls) == calls  # refused before anything ran


def test_input_type_selects_the_models_task_instruction():
    eng = ScriptedEngine()
    eng.config.hf_config["task_instructions"] = {"search_query": "query: ", "search_document": "passage: "}
    r = cohere(eng, texts=["hello"], input_type="search_query")
    assert r["embeddings"]["float"] == openai_floats(eng, input=["query: hello"])
    assert r["texts"] == ["hello"]
    with pytest.raises(APIError) as e:
        cohere(eng, texts=["hello"], input_type="classification")
    assert e.value.param == "input_type" and "search_document, search_query" in e.value.message


def test_input_type_on_a_model_without_instructions_is_a_400():
    with pytest.raises(APIError) as e:
        cohere(ScriptedEngine(), texts=["hello"], input_type="search_document")
    assert (
        e.value.status == 400 and e.value.param == "input_type" and "leave input_type out" in e.value.message
    )


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({}, "texts", "give one of texts, images or inputs"),
        ({"texts": ["a"], "images": ["data:,"]}, "images", "not texts and images together"),
        ({"texts": []}, "texts", "texts is empty"),
        ({"texts": ["a", ""]}, "texts[1]", "empty string"),
        ({"texts": ["x"], "output_dimension": 2}, "output_dimension", "matryoshka"),
        ({"texts": ["x"], "max_tokens": 17}, "max_tokens", "between 1 and 16"),
        ({"texts": ["x"], "model": "other"}, "model", "does not exist"),
    ],
)
def test_bad_requests_name_cohere_fields(body, param, needle):
    with pytest.raises(APIError) as e:
        cohere(ScriptedEngine(), **body)
    assert e.value.param == param and needle in e.value.message, e.value.message


def test_cohere_forms_are_refused_by_the_model():
    """int8 / uint8 are Cohere's but not vLLM's types: the request model refuses them."""
    with pytest.raises(ValueError, match="embedding_types"):
        CohereEmbedRequest(texts=["x"], embedding_types=["int8"])


TEMPLATE = (
    "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{% endfor %}"
)


def test_images_and_inputs_go_through_the_messages_path():
    """Each image (or mixed `inputs` item) is its own conversation, rendered as /v1/embeddings renders
    messages: a text item equals that route's answer; on a text-only model a picture is refused by
    the model, naming Cohere's field."""
    from image_fixtures import data_url, encoded

    eng = ScriptedEngine()
    eng.tokenizer.chat_template = TEMPLATE
    text_only = [
        {"content": [{"type": "text", "text": "hello world"}]},
        {"content": [{"type": "text", "text": "hi"}]},
    ]
    r = cohere(eng, inputs=text_only)
    want = [openai_floats(eng, messages=[{"role": "user", "content": t}])[0] for t in ("hello world", "hi")]
    assert r["embeddings"]["float"] == want and "texts" not in r
    url = data_url(encoded("PNG"))
    mixed = [
        {"content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]}
    ]
    for body, param in (({"images": [url]}, "images"), ({"inputs": mixed}, "inputs")):
        with pytest.raises(APIError) as e:
            cohere(eng, **body)
        assert (
            e.value.status == 400 and e.value.param == param and "does not accept images" in e.value.message
        )
