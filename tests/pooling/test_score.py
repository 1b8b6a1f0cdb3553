"""/v1/score and /rerank (vLLM's shapes) against references: a tiny random BERT cross-encoder and a tiny
Qwen3 one-label classifier against transformers' sigmoid(logit) of tokenizer(a, b); all-MiniLM-L6-v2
against the cosine of its own /v1/embeddings and of the sentence-transformers computation.
Tolerances: 1e-5 on scores in (0, 1) for the in-process engine (reference ops), 1e-4 through a real
`fd serve` (native kernels); 1e-5 on MiniLM cosines."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from fd_server import start_server
from pooling_models import reference_cross_scores, st_reference
from test_serving_pooling import ScriptedEngine

from fdcli_engine.config import EngineConfig, default_embedding_model_path
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.entrypoints.openai.errors import APIError
from fdcli_engine.entrypoints.openai.protocol_score import RerankRequest, ScoreRequest
from fdcli_engine.entrypoints.openai.serving_score import OpenAIServingScore

QUERY = "what does a fox do?"
DOCS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world",
    "a cat sat on the mat and looked at the fox",
    "x",
]
PAIRS = [(QUERY, d) for d in DOCS]


def _engine_scores(folder, pairs, use_types=True) -> np.ndarray:
    """sigmoid(logit) of each pair through the in-process EngineCore, one step."""
    from fdcli_engine.engine import EngineCore, EngineCoreRequest
    from fdcli_engine.pooling_params import PoolingParams
    from fdcli_engine.tokenizer import load_tokenizer

    config = resolve_config(EngineConfig(model=str(folder), max_num_seqs=8))
    core, tok = EngineCore(config), load_tokenizer(config)
    for i, (a, b) in enumerate(pairs):
        ids, types = tok.encode_pair(a, b)
        start = types.index(1) if use_types and 1 in types else None
        core.add_request(
            EngineCoreRequest(f"r{i}", ids, pooling_params=PoolingParams(token_type_start=start))
        )
    got = {}
    while core.has_unfinished_requests():
        for out in core.step():
            got[out.req_id] = float(np.asarray(out.pooled).reshape(-1)[0])
    return 1.0 / (1.0 + np.exp(-np.array([got[f"r{i}"] for i in range(len(pairs))])))


@pytest.mark.parametrize("kind", ["bert_cross_encoder", "qwen3_reranker"])
def test_cross_encoder_engine_matches_transformers(pooling_checkpoint, kind):
    folder = pooling_checkpoint(kind)
    ref = reference_cross_scores(folder, PAIRS)
    assert np.ptp(ref) > 0.05, ref  # the scores tell the pairs apart, so an order check means something
    np.testing.assert_allclose(_engine_scores(folder, PAIRS), ref, rtol=0, atol=1e-5)


def test_bert_pair_reads_token_types(pooling_checkpoint):
    # Without segment B's token type the encoder reads another input: the scores must move.
    folder = pooling_checkpoint("bert_cross_encoder")
    ref = reference_cross_scores(folder, PAIRS)
    assert np.abs(_engine_scores(folder, PAIRS, use_types=False) - ref).max() > 1e-3


# ---- through a real fd serve ----


@pytest.fixture(scope="module")
def cross_encoder(pooling_checkpoint, tmp_path_factory):
    srv = start_server(
        pooling_checkpoint("bert_cross_encoder"), tmp_path_factory.mktemp("ce"), "--served-model-name", "ce"
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def _post(srv, url, **body) -> httpx.Response:
    with srv.http() as c:
        return c.post(url, json=body)


@pytest.mark.parametrize("url", ["/score", "/v1/score"])
def test_score_one_against_many(cross_encoder, pooling_checkpoint, url):
    ref = reference_cross_scores(pooling_checkpoint("bert_cross_encoder"), PAIRS)
    r = _post(cross_encoder, url, model="ce", text_1=QUERY, text_2=DOCS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "ce"
    assert [(d["index"], d["object"]) for d in body["data"]] == [(i, "score") for i in range(len(DOCS))]
    np.testing.assert_allclose([d["score"] for d in body["data"]], ref, rtol=0, atol=1e-4)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(DOCS) * 3


def test_score_zips_two_lists(cross_encoder, pooling_checkpoint):
    pairs = [(DOCS[1], DOCS[0]), (DOCS[2], DOCS[3])]
    ref = reference_cross_scores(pooling_checkpoint("bert_cross_encoder"), pairs)
    r = _post(cross_encoder, "/v1/score", text_1=[p[0] for p in pairs], text_2=[p[1] for p in pairs])
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "first,second", [("queries", "documents"), ("queries", "items"), ("data_1", "data_2")]
)
def test_score_takes_vllm_request_forms(cross_encoder, pooling_checkpoint, first, second):
    """vLLM's ScoreRequest is a union of forms; each names the two sides differently, same rule."""
    ref = reference_cross_scores(pooling_checkpoint("bert_cross_encoder"), PAIRS)
    r = _post(cross_encoder, "/v1/score", **{first: QUERY, second: DOCS})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], ref, rtol=0, atol=1e-4)
    r = _post(cross_encoder, "/score", **{first: ["a", "b"], second: ["c", "d", "e"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == first, r.text
    r = _post(cross_encoder, "/v1/score", **{first: QUERY, second: DOCS, "text_1": "a", "text_2": "b"})
    assert r.status_code == 400 and "one pair of score fields" in r.json()["error"]["message"], r.text
    r = _post(cross_encoder, "/v1/score", **{first: QUERY})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("body: give the two sides of the score as one of")


@pytest.mark.parametrize("url", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_sorted_with_documents(cross_encoder, pooling_checkpoint, url):
    ref = reference_cross_scores(pooling_checkpoint("bert_cross_encoder"), PAIRS)
    r = _post(cross_encoder, url, model="ce", query=QUERY, documents=DOCS)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == list(np.argsort(-ref, kind="stable"))
    for x in results:
        assert x["document"] == {"text": DOCS[x["index"]]}
        assert abs(x["relevance_score"] - ref[x["index"]]) < 1e-4
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0


def test_use_activation_false_gives_the_logits(cross_encoder, pooling_checkpoint):
    """vLLM's ClassifyRequestMixin on score/rerank: use_activation (or its deprecated softmax /
    activation) false skips the sigmoid, so the score is transformers' logit."""
    ref = reference_cross_scores(pooling_checkpoint("bert_cross_encoder"), PAIRS)
    logits = np.log(ref / (1 - ref))
    for flag in ("use_activation", "softmax", "activation"):
        r = _post(cross_encoder, "/v1/score", text_1=QUERY, text_2=DOCS, **{flag: False})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose([d["score"] for d in r.json()["data"]], logits, rtol=0, atol=1e-3)
    r = _post(cross_encoder, "/rerank", query=QUERY, documents=DOCS, use_activation=False)
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], logits, rtol=0, atol=1e-3)
    on = _post(cross_encoder, "/v1/score", text_1=QUERY, text_2=DOCS, use_activation=True, softmax=False)
    np.testing.assert_allclose([d["score"] for d in on.json()["data"]], ref, rtol=0, atol=1e-4)


def test_rerank_takes_document_objects(cross_encoder):
    """Cohere v1 / Jina send {"text": ...} objects; mixed with strings they score as the same texts."""
    plain = _post(cross_encoder, "/v1/rerank", query=QUERY, documents=DOCS).json()["results"]
    mixed = [{"text": d} if i % 2 else d for i, d in enumerate(DOCS)]
    r = _post(cross_encoder, "/v1/rerank", query=QUERY, documents=mixed)
    assert r.status_code == 200, r.text
    assert r.json()["results"] == plain
    bad = _post(cross_encoder, "/v1/rerank", query=QUERY, documents=[{"content": "x"}])
    assert bad.status_code == 400 and "documents" in bad.text


def test_rerank_top_n_and_no_documents(cross_encoder, pooling_checkpoint):
    ref = reference_cross_scores(pooling_checkpoint("bert_cross_encoder"), PAIRS)
    r = _post(cross_encoder, "/v1/rerank", query=QUERY, documents=DOCS, top_n=2, return_documents=False)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == list(np.argsort(-ref, kind="stable")[:2])
    assert all(x["document"] is None for x in results)


def test_pair_truncation_matches_transformers():
    import transformers

    from fdcli_engine.tokenizer import load_tokenizer

    path = default_embedding_model_path()
    ours, hf = load_tokenizer(path), transformers.AutoTokenizer.from_pretrained(path)
    for a, b, k in [(QUERY, DOCS[0] * 5, 16), (DOCS[0] * 5, "x", 9), (QUERY, DOCS[2], 64)]:
        ref = hf(a, b, truncation=True, max_length=k)
        assert ours.encode_pair(a, b, k) == (ref["input_ids"], ref["token_type_ids"])


def test_rerank_truncates_long_documents(cross_encoder, pooling_checkpoint):
    docs = ["c " * 300, DOCS[0]]
    ref = reference_cross_scores(pooling_checkpoint("bert_cross_encoder"), [(QUERY, d) for d in docs], 64)
    r = _post(cross_encoder, "/v1/rerank", query=QUERY, documents=docs, truncate_prompt_tokens=64)
    assert r.status_code == 200, r.text
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    np.testing.assert_allclose([got[0], got[1]], ref, rtol=0, atol=1e-4)
    r = _post(cross_encoder, "/v1/score", text_1="a", text_2="b", truncate_prompt_tokens=129)
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


def test_score_bad_requests(cross_encoder):
    cases = [
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
        ("/v1/score", {"text_1": "a", "text_2": []}, "text_2"),
        ("/v1/rerank", {"query": "", "documents": ["a"]}, "query"),
        ("/v1/score", {"text_1": "a " * 300, "text_2": "b"}, "text_1"),  # over 128 positions
        ("/v1/rerank", {"query": "a", "documents": ["b", "c " * 300]}, "documents[1]"),
    ]
    for url, body, param in cases:
        r = _post(cross_encoder, url, **body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and param in (err["param"] or "") + err["message"], err
    r = _post(cross_encoder, "/v1/score", model="other", text_1="a", text_2="b")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_generation_on_pooling_server_names_its_routes(cross_encoder):
    # Not "no chat template": the server says what it runs and where to go.
    for url, body in [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/responses", {"input": "hi"}),
    ]:
        r = _post(cross_encoder, url, **body)
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"]
        assert "pooling model (classify" in msg and "/v1/score" in msg and url in msg, msg


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    srv = start_server(default_embedding_model_path(), tmp_path_factory.mktemp("minilm-score"))
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def test_embedding_model_scores_cosine(minilm):
    texts = [QUERY, *DOCS]
    r = _post(minilm, "/v1/score", text_1=QUERY, text_2=DOCS)
    assert r.status_code == 200, r.text
    got = np.array([d["score"] for d in r.json()["data"]])
    emb = _post(minilm, "/v1/embeddings", input=texts).json()["data"]
    vecs = np.array([d["embedding"] for d in emb], dtype=np.float64)
    np.testing.assert_allclose(got, vecs[1:] @ vecs[0], rtol=0, atol=1e-5)
    ref = st_reference(texts).astype(np.float64)
    np.testing.assert_allclose(got, ref[1:] @ ref[0], rtol=0, atol=1e-5)
    long = QUERY + " and more" * 200  # over MiniLM's 256 tokens: embedded as its truncated form
    cut = _post(minilm, "/v1/score", text_1=long, text_2=DOCS[0], truncate_prompt_tokens=-1).json()["data"]
    ref = st_reference([long, DOCS[0]]).astype(np.float64)  # sentence-transformers truncates at 256
    assert abs(cut[0]["score"] - ref[0] @ ref[1]) < 1e-5
    ranked = _post(minilm, "/v1/rerank", query=QUERY, documents=DOCS).json()["results"]
    assert [x["index"] for x in ranked] == list(np.argsort(-got, kind="stable"))


# ---- which models serve the route (framework-free serving layer) ----


def _serving(arch: str, **hf) -> OpenAIServingScore:
    engine = ScriptedEngine(arch)
    engine.config.hf_config.update(hf)
    return OpenAIServingScore(engine, ["m"])


def test_wrong_model_kind_is_400_naming_the_models():
    for arch, hf, expect in [
        ("LlamaForCausalLM", {}, "this server runs a generative model"),
        ("Qwen2ForRewardModel", {}, "this server runs a reward model"),
        ("Qwen3ForSequenceClassification", {"num_labels": 3}, "has 3 labels"),
    ]:
        serving = _serving(arch, **hf)
        for call in (
            serving.create_score(ScoreRequest(text_1="a", text_2="b")),
            serving.create_rerank(RerankRequest(query="a", documents=["b"])),
        ):
            with pytest.raises(APIError) as e:
                asyncio.run(call)
            assert e.value.status == 400 and expect in e.value.message, e.value.message
            assert "cross-encoder" in e.value.message


def test_run_batch_score_and_rerank_lines(tmp_path, pooling_checkpoint):
    from test_run_batch_pooling import line, run_batch

    folder = pooling_checkpoint("bert_cross_encoder")
    ref = reference_cross_scores(folder, PAIRS)
    proc, recs = run_batch(
        folder,
        tmp_path,
        [
            line("s", "/v1/score", {"text_1": QUERY, "text_2": DOCS}),
            line("r", "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 1}),
        ],
    )
    assert set(recs) == {"s", "r"}, proc.stderr.decode()[-2000:]
    scores = [d["score"] for d in recs["s"]["response"]["body"]["data"]]
    np.testing.assert_allclose(scores, ref, rtol=0, atol=1e-4)
    (best,) = recs["r"]["response"]["body"]["results"]
    assert best["index"] == int(np.argmax(ref))
