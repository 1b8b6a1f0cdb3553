"""Pooling through a real `fd serve`: all-MiniLM-L6-v2 against the sentence-transformers computation
(transformers' BertModel token embeddings, attention-mask-weighted mean, L2 normalize), a tiny
sequence-classification reward model against transformers' logits, and every documented 4xx."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
from fd_server import start_server
from pooling_models import st_reference

from fdcli_engine.config import default_embedding_model_path

LONG = " ".join(["The committee reviewed the proposal in detail before the vote."] * 40)  # > 256 tokens
SENTENCES = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "快速的棕色狐狸跳过了懒狗。",
    "Я люблю машинное обучение",
    "I love pizza 🍕🍕 and rockets 🚀!",
    "x",
    LONG,
]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    srv = start_server(
        default_embedding_model_path(),
        tmp_path_factory.mktemp("minilm"),
        "--max-num-seqs",
        "64",
        "--served-model-name",
        "minilm",
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def _embed(srv, **body) -> httpx.Response:
    with srv.http() as c:
        return c.post("/v1/embeddings", json={"model": "minilm", **body})


def _vectors(resp: httpx.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data)))
    return np.array([d["embedding"] for d in data], dtype=np.float64)


def test_minilm_equals_sentence_transformers(minilm):
    ref = st_reference(SENTENCES)
    resp = _embed(minilm, input=SENTENCES, truncate_prompt_tokens=-1)
    got = _vectors(resp)
    cos = (got * ref).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.99999, cos
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    usage = resp.json()["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 256


def test_openai_sdk_base64_and_float_agree(minilm):
    # The openai SDK asks for base64 by default and decodes it; the raw float form must match it bit for bit.
    sdk = minilm.client().embeddings.create(model="minilm", input=SENTENCES[:3])
    floats = _vectors(_embed(minilm, input=SENTENCES[:3], encoding_format="float"))
    raw = _embed(minilm, input=SENTENCES[:3], encoding_format="base64").json()["data"]
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw])
    np.testing.assert_array_equal(decoded, floats.astype(np.float32))
    np.testing.assert_array_equal(np.array([d.embedding for d in sdk.data], dtype=np.float32), decoded)


def test_base64_in_vllms_embed_dtype_and_endianness(minilm):
    floats = _vectors(_embed(minilm, input=SENTENCES[:2])).astype(np.float32)
    for dtype, endianness, np_dtype in [
        ("float16", "native", "=f2"),
        ("float16", "big", ">f2"),
        ("float32", "big", ">f4"),
    ]:
        for path, key in [("/v1/embeddings", "embedding"), ("/pooling", "data")]:
            with minilm.http() as c:
                r = c.post(
                    path,
                    json={
                        "input": SENTENCES[:2],
                        "encoding_format": "base64",
                        "embed_dtype": dtype,
                        "endianness": endianness,
                    },
                )
            assert r.status_code == 200, r.text
            got = np.stack(
                [np.frombuffer(base64.b64decode(d[key]), dtype=np_dtype) for d in r.json()["data"]]
            )
            np.testing.assert_array_equal(got, floats.astype(np_dtype))


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_embed_dtypes_decode_to_torchs_cast_of_the_float_output(minilm, dtype):
    """vLLM's fp8 embed_dtypes (torch float8_e4m3fn / float8_e5m2, one byte a value) in base64 and
    bytes, on both routes: decoded as vLLM's binary2tensor does, they are torch's cast of the float
    answer, within the format's half-ulp of it."""
    import json

    import torch

    torch_dtype = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[dtype]
    floats = _vectors(_embed(minilm, input=SENTENCES[:3])).astype(np.float32)
    want = torch.from_numpy(floats).to(torch_dtype).float().numpy()
    for path, key in [("/v1/embeddings", "embedding"), ("/pooling", "data")]:
        body = {"input": SENTENCES[:3], "embed_dtype": dtype}
        with minilm.http() as c:
            r = c.post(path, json={**body, "encoding_format": "base64"})
            raw = c.post(path, json={**body, "encoding_format": "bytes"})
        assert r.status_code == 200 and raw.status_code == 200, r.text + raw.text
        decoded = [base64.b64decode(d[key]) for d in r.json()["data"]]
        meta = json.loads(raw.headers["metadata"])["data"]
        assert [raw.content[m["start"] : m["end"]] for m in meta] == decoded
        got = np.stack(
            [
                torch.frombuffer(bytearray(b), dtype=torch.uint8).view(torch_dtype).float().numpy()
                for b in decoded
            ]
        )
        np.testing.assert_array_equal(got, want)
        mantissa, smallest = (3, 2.0**-9) if dtype == "fp8_e4m3" else (2, 2.0**-16)
        assert np.all(
            np.abs(got - floats) <= np.maximum(np.abs(floats) * 2.0 ** -(mantissa + 1), smallest / 2)
        )


def test_bytes_body_as_vllms_encode_pooling_bytes(minilm):
    """vLLM's encoding_format bytes: the arrays' bytes back to back, a `metadata` header (id, created,
    model, usage, and index/embed_dtype/endianness/start/end/shape per array); bytes_only: no header."""
    import json

    floats = _vectors(_embed(minilm, input=SENTENCES[:3])).astype(np.float32)
    for path in ("/v1/embeddings", "/pooling"):
        with minilm.http() as c:
            r = c.post(
                path, json={"input": SENTENCES[:3], "encoding_format": "bytes", "embed_dtype": "float16"}
            )
            only = c.post(path, json={"input": SENTENCES[:3], "encoding_format": "bytes_only"})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/octet-stream"
        meta = json.loads(r.headers["metadata"])
        assert (
            meta["model"] == "minilm" and meta["usage"]["prompt_tokens"] == meta["usage"]["total_tokens"] > 0
        )
        assert [d["index"] for d in meta["data"]] == [0, 1, 2]
        for i, d in enumerate(meta["data"]):
            assert (d["embed_dtype"], d["endianness"], d["shape"]) == ("float16", "native", [384])
            got = np.frombuffer(r.content[d["start"] : d["end"]], dtype=np.float16)
            np.testing.assert_array_equal(got, floats[i].astype(np.float16))
        assert meta["data"][-1]["end"] == len(r.content)
        assert only.status_code == 200 and "metadata" not in only.headers
        np.testing.assert_array_equal(np.frombuffer(only.content, dtype=np.float32).reshape(3, -1), floats)


def test_batch_of_64_equals_one_by_one(minilm):
    texts = [f"sentence {i}: {SENTENCES[i % 7]} {'more words ' * (i % 9)}" for i in range(64)]
    batch = _vectors(_embed(minilm, input=texts))
    single = np.concatenate([_vectors(_embed(minilm, input=t)) for t in texts])
    np.testing.assert_allclose(batch, single, atol=2e-6)


def test_token_ids_and_chat_messages_forms(minilm):
    from fdcli_engine.tokenizer import load_tokenizer

    ids = load_tokenizer(default_embedding_model_path()).encode(SENTENCES[0])
    by_ids = _vectors(_embed(minilm, input=[ids]))
    np.testing.assert_allclose(by_ids, _vectors(_embed(minilm, input=SENTENCES[0])), atol=1e-6)
    # MiniLM has no chat template: the messages form is a clear 400, not a crash.
    r = _embed(minilm, messages=[{"role": "user", "content": "hi"}])
    assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "needle"),
    [
        ("/v1/embeddings", {"input": ""}, 400, "input", "empty"),
        ("/v1/embeddings", {"input": []}, 400, "input", "empty"),
        ("/v1/embeddings", {"input": LONG}, 400, "input", "at most 256"),
        ("/v1/embeddings", {"input": "hi", "dimensions": 8}, 400, "dimensions", "matryoshka"),
        ("/v1/embeddings", {"input": "hi", "encoding_format": "int8"}, 400, "encoding_format", ""),
        ("/v1/embeddings", {"input": "hi", "model": "nope"}, 404, "model", "does not exist"),
        (
            "/v1/embeddings",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "messages[0].content[0]",
            "the image URL must be",
        ),
        (
            "/v1/chat/reward",
            {"messages": [{"role": "user", "content": "hi"}]},
            400,
            "model",
            "/v1/embeddings",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}]},
            400,
            "model",
            "pooling model (embed",  # not MiniLM's missing chat template: the server's kind comes first
        ),
        ("/v1/completions", {"prompt": "hi"}, 400, None, "pooling model"),
    ],
)
def test_bad_requests_on_embedding_server(minilm, path, body, status, param, needle):
    with minilm.http() as c:
        r = c.post(path, json={"model": "minilm", **body})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and "Traceback" not in err["message"]
    if param is not None:
        assert err["param"] == param


def test_pooling_route_answers_the_embeddings_in_vllms_shape(minilm):
    # No `task`: the model's own (vllm/entrypoints/pooling/pooling/serving.py sets request.task to
    # model_config.get_pooling_task, `embed` first), so the pooled embeddings, as /v1/embeddings.
    texts = SENTENCES[:3]
    with minilm.http() as c:
        r = c.post("/pooling", json={"model": "minilm", "input": texts})
        bad = c.post("/pooling", json={"model": "minilm", "input": "hi", "task": "token_embed"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "minilm" and body["id"].startswith("pool-")
    assert [(d["index"], d["object"]) for d in body["data"]] == [
        (0, "pooling"),
        (1, "pooling"),
        (2, "pooling"),
    ]
    got = np.array([d["data"] for d in body["data"]])
    np.testing.assert_array_equal(got, _vectors(_embed(minilm, input=texts)))
    ref = st_reference(texts)
    assert ((got * ref).sum(axis=1) >= 0.99999).all()
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "task", bad.text


# ---- reward ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reward_server(pooling_checkpoint, tmp_path_factory):
    srv = start_server(
        pooling_checkpoint("qwen3_seqcls"), tmp_path_factory.mktemp("rm"), "--served-model-name", "rm"
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


CONVERSATION = [
    {"role": "user", "content": "what is the answer?"},
    {"role": "assistant", "content": "42 is the answer."},
]


def test_chat_reward_scores_equal_transformers_logits(reward_server, pooling_checkpoint):
    import torch
    import transformers
    from tiny_models import CHAT_TEMPLATE

    folder = pooling_checkpoint("qwen3_seqcls")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template(
        CONVERSATION, chat_template=CHAT_TEMPLATE, add_generation_prompt=False, tokenize=True
    )
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    with reward_server.http() as c:
        for path in ("/v1/chat/reward", "/v1/reward"):
            r = c.post(path, json={"model": "rm", "messages": CONVERSATION})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "list" and body["usage"]["prompt_tokens"] == len(ids)
            assert [d["index"] for d in body["data"]] == [0]
            np.testing.assert_allclose(body["data"][0]["score"], ref, rtol=1e-4, atol=1e-4)


def test_classify_equals_transformers_softmax(reward_server, pooling_checkpoint):
    """vLLM's /classify: softmax of the logits (3 labels), the argmax's id2label, num_classes."""
    import torch
    import transformers

    folder = pooling_checkpoint("qwen3_seqcls")
    texts = ["what is the answer?", "42 is the answer, and more words"]
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = np.stack([model(torch.tensor([tok(t)["input_ids"]])).logits[0].numpy() for t in texts])
    probs = torch.softmax(torch.from_numpy(logits), -1).numpy()
    assert np.ptp(probs.argmax(-1)) or np.ptp(probs) > 0.01
    with reward_server.http() as c:
        for path in ("/classify", "/v1/classify"):
            r = c.post(path, json={"model": "rm", "input": texts})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "list" and body["model"] == "rm" and body["id"].startswith("classify")
            assert body["usage"]["prompt_tokens"] == sum(len(tok(t)["input_ids"]) for t in texts)
            for i, d in enumerate(body["data"]):
                assert d["index"] == i and d["num_classes"] == 3
                assert d["label"] == model.config.id2label[int(probs[i].argmax())]
                np.testing.assert_allclose(d["probs"], probs[i], rtol=0, atol=1e-4)
        raw = c.post("/v1/classify", json={"input": texts[0], "use_activation": False}).json()["data"][0]
        np.testing.assert_allclose(raw["probs"], logits[0], rtol=1e-4, atol=1e-4)


def test_classify_on_embedding_model_is_400(minilm):
    with minilm.http() as c:
        r = c.post("/v1/classify", json={"input": "hi"})
    assert r.status_code == 400 and "use /v1/embeddings" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(
    ("path", "body", "param", "needle"),
    [
        ("/v1/chat/reward", {"messages": []}, "messages", ""),
        (
            "/v1/chat/reward",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "a"},
                            {"type": "video_url", "video_url": {"url": "v"}},
                        ],
                    }
                ]
            },
            "messages[0].content[1]",
            "send pictures as image_url parts",
        ),
        (
            "/v1/chat/reward",
            {"messages": [{"role": "user", "content": "the answer " * 300}]},
            "messages",
            "at most",
        ),
        ("/v1/embeddings", {"input": "hello"}, "model", "/v1/chat/reward"),
    ],
)
def test_bad_requests_on_reward_server(reward_server, path, body, param, needle):
    with reward_server.http() as c:
        r = c.post(path, json={"model": "rm", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"]


def test_pooling_routes_on_generate_server_are_400(server):
    with server.http() as c:  # the shared tiny-Llama server of tests/conftest.py
        for path, body in (
            ("/v1/embeddings", {"input": "hi"}),
            ("/v1/chat/reward", {"messages": CONVERSATION}),
            ("/v1/classify", {"input": "hi"}),
        ):
            r = c.post(path, json=body)
            assert r.status_code == 400 and "needs a pooling model" in r.json()["error"]["message"], r.text
        r = c.post("/pooling", json={"input": "hi"})  # vLLM's answer on a generate model
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"].startswith("The model does not support Pooling API")


# ---- a converted causal LM, CLI flags end to end ------------------------------------------------------
def test_convert_embed_server_flags_messages_and_dimensions(pooling_checkpoint, tmp_path_factory):
    import pooling_models

    from fdcli_engine.tokenizer import load_tokenizer

    folder = pooling_checkpoint("qwen3_embed")
    srv = start_server(
        folder,
        tmp_path_factory.mktemp("q3"),
        "--convert",
        "embed",
        "--pooler-config",
        '{"pooling_type": "MEAN"}',
    )
    try:
        tok = load_tokenizer(str(folder))
        conv = [{"role": "user", "content": "hello world"}]
        ids = tok.encode(tok.apply_chat_template(conv, add_generation_prompt=False), add_special_tokens=False)
        ref = pooling_models.reference_hidden(folder, ids).mean(axis=0)
        with srv.http() as c:
            got = _vectors(c.post("/v1/embeddings", json={"messages": conv}))[0]
            np.testing.assert_allclose(got, ref / np.linalg.norm(ref), atol=2e-5)
            short = _vectors(c.post("/v1/embeddings", json={"input": [ids], "dimensions": 8}))[0]
            np.testing.assert_allclose(short, ref[:8] / np.linalg.norm(ref[:8]), atol=2e-5)
            r = c.post("/v1/embeddings", json={"input": [ids], "dimensions": 65})
            assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
            r = c.post("/v1/embeddings", json={"input": "hi", "truncate_prompt_tokens": 0})
            assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]


def _cohere(srv, **body) -> httpx.Response:
    with srv.http() as c:
        return c.post("/v2/embed", json={"model": "minilm", **body})


def test_cohere_v2_embed_equals_v1_embeddings(minilm):
    """vLLM's /v2/embed: the same vectors as /v1/embeddings (LONG cut to the model's length, as
    Cohere's default truncate END), in Cohere's shape, with only the requested types."""
    floats = _vectors(_embed(minilm, input=SENTENCES, truncate_prompt_tokens=-1)).astype(np.float32)
    r = _cohere(minilm, texts=SENTENCES)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "embeddings", "texts", "meta", "response_type"}
    assert set(body["embeddings"]) == {"float"} and body["texts"] == SENTENCES
    np.testing.assert_array_equal(np.array(body["embeddings"]["float"], dtype=np.float32), floats)
    usage = _embed(minilm, input=SENTENCES, truncate_prompt_tokens=-1).json()["usage"]["prompt_tokens"]
    assert body["meta"] == {
        "api_version": {"version": "2"},
        "billed_units": {"input_tokens": usage, "image_tokens": 0},
    }
    assert body["response_type"] == "embeddings_by_type"

    typed = _cohere(minilm, texts=SENTENCES[:2], embedding_types=["binary", "ubinary", "base64"]).json()
    assert set(typed["embeddings"]) == {"binary", "ubinary", "base64"}
    ubinary = np.packbits(floats[:2] >= 0, axis=1).astype(int)
    assert typed["embeddings"]["ubinary"] == ubinary.tolist()
    assert typed["embeddings"]["binary"] == (ubinary - 128).tolist()
    decoded = np.stack(
        [np.frombuffer(base64.b64decode(s), dtype="<f4") for s in typed["embeddings"]["base64"]]
    )
    np.testing.assert_array_equal(decoded, floats[:2])


def test_cohere_v2_embed_refusals(minilm):
    for body, param in [
        ({"texts": ["hi"], "input_type": "search_document"}, "input_type"),  # MiniLM defines no prompts
        ({"texts": ["hi"], "embedding_types": ["int8"]}, "embedding_types[0]"),  # not among vLLM's types
        ({"texts": [LONG], "truncate": "NONE"}, "texts[0]"),
        ({}, "texts"),
    ]:
        r = _cohere(minilm, **body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
