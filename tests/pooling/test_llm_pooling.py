"""The offline LLM's vLLM pooling calls (embed, encode, classify, score) on the default embedding model
(all-MiniLM-L6-v2) and a tiny BERT cross-encoder. Oracles: sentence-transformers' pipeline
(st_reference) and transformers' cross-encoder scores; the outputs have vLLM's attribute names."""

from __future__ import annotations

import numpy as np
import pytest
from ops_backend import switched_ops
from pooling_models import reference_cross_scores, reference_hidden, reference_score_head, st_reference

from fdcli_engine import LLM, PoolingParams
from fdcli_engine.config import default_embedding_model_path
from fdcli_engine.outputs import EmbeddingRequestOutput, PoolingRequestOutput, ScoringRequestOutput

TEXTS = ["the quick brown fox", "a fast auburn fox", "stock markets fell today"]


@pytest.fixture(scope="module")
def minilm():
    """Built under the reference ops, as every pooling test runs (conftest.reference_ops)."""
    switched = switched_ops("reference")
    next(switched)
    yield LLM(str(default_embedding_model_path()))
    switched.close()


def test_embed_matches_sentence_transformers(minilm):
    outs = minilm.embed(TEXTS)
    assert all(isinstance(o, EmbeddingRequestOutput) and o.finished for o in outs)
    got = np.array([o.outputs.embedding for o in outs])
    assert outs[0].outputs.hidden_size == 384
    np.testing.assert_allclose(got, st_reference(TEXTS), atol=2e-5)
    assert outs[0].prompt_token_ids == minilm.get_tokenizer().encode(TEXTS[0])
    one = minilm.embed(TEXTS[0])  # a single prompt, as vLLM takes it
    np.testing.assert_allclose(one[0].outputs.embedding, got[0], atol=1e-6)


def test_encode_and_score_use_the_same_pools(minilm):
    [enc] = minilm.encode([TEXTS[1]])
    assert isinstance(enc, PoolingRequestOutput)
    ref = st_reference([TEXTS[0], TEXTS[1], TEXTS[2]])
    np.testing.assert_allclose(enc.outputs.data, ref[1], atol=2e-5)
    scores = minilm.score(TEXTS[0], TEXTS[1:])  # one text against each, as /v1/score
    assert all(isinstance(s, ScoringRequestOutput) for s in scores)
    want = [float(ref[0] @ ref[1]), float(ref[0] @ ref[2])]
    assert [s.outputs.score for s in scores] == pytest.approx(want, abs=1e-5)
    assert want[0] > want[1]  # the paraphrase is closer than the unrelated text
    zipped = minilm.score(TEXTS[:2], TEXTS[1:])
    assert zipped[1].outputs.score == pytest.approx(float(ref[1] @ ref[2]), abs=1e-5)


def test_wrong_calls_are_value_errors_naming_the_way(minilm):
    with pytest.raises(ValueError, match=r"LLM.classify\(\) is not served by this embed model"):
        minilm.classify(TEXTS)
    with pytest.raises(ValueError, match="give one data_1, or as many as data_2"):
        minilm.score(TEXTS[:2], TEXTS)
    with pytest.raises(ValueError, match="pooling_task"):
        minilm.encode(TEXTS, pooling_task="reward")
    with pytest.raises(ValueError, match="at most 256; shorten it or set truncate_prompt_tokens"):
        minilm.embed("word " * 400)  # past the 256 tokens of sentence_bert_config.json
    with pytest.raises(ValueError, match="truncate_prompt_tokens must be -1 or between 1 and 256"):
        minilm.embed("word", truncate_prompt_tokens=0)


def test_truncate_prompt_tokens_cuts_as_sentence_transformers(minilm):
    """-1 keeps max_model_len tokens, [CLS] and [SEP] kept at the ends: sentence-transformers' own
    truncation at max_seq_length 256 (the reference)."""
    long = " ".join(["fox", "dog", "cat", "bird"] * 100)
    [out] = minilm.embed(long, truncate_prompt_tokens=-1)
    assert len(out.prompt_token_ids) == 256
    np.testing.assert_allclose(out.outputs.embedding, st_reference([long])[0], atol=2e-5)
    [short] = minilm.encode([long], truncate_prompt_tokens=5)
    ids = minilm.get_tokenizer().encode(long)
    assert short.prompt_token_ids == ids[:4] + ids[-1:]
    # An embedding model's score embeds each text cut the same way (as /v1/score): the cosine of the
    # two truncated embeddings, and past 256 tokens the uncut texts are refused instead.
    a, b = long, " ".join(["cat", "fox"] * 200)
    cut = [np.array(o.outputs.embedding) for o in minilm.embed([a, b], truncate_prompt_tokens=8)]
    [score] = minilm.score(a, b, truncate_prompt_tokens=8)
    assert score.outputs.score == pytest.approx(float(cut[0] @ cut[1]), abs=1e-6)
    assert len(score.prompt_token_ids) == 16


def test_cross_encoder_scores_and_classifies(pooling_checkpoint):
    folder = pooling_checkpoint("bert_cross_encoder")
    llm = LLM(str(folder), max_num_seqs=8)
    pairs = [("what is a fox", "a fox is an animal"), ("what is a fox", "markets fell")]
    scores = [s.outputs.score for s in llm.score(pairs[0][0], [b for _, b in pairs])]
    np.testing.assert_allclose(scores, reference_cross_scores(folder, pairs), atol=1e-5)
    [cls] = llm.classify("a fox is an animal")
    assert cls.outputs.num_classes == 1 and 0.0 < cls.outputs.probs[0] < 1.0  # one label: sigmoid
    with pytest.raises(ValueError, match=r"LLM.embed\(\) is not served by this classify model"):
        llm.embed("x")


def test_generative_model_has_no_pooling(tiny_model):
    llm = LLM(str(tiny_model), max_model_len=64, block_size=8, num_kv_blocks=16)
    with pytest.raises(ValueError, match=r"LLM.embed\(\) needs a pooling model"):
        llm.embed("hello")


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_pooling_params_normalize_and_refused_dimensions(minilm):
    # vLLM's PoolingParams(normalize=..., dimensions=...): normalize=False gives the raw mean pool,
    # whose unit vector is sentence-transformers' embedding; dimensions needs a matryoshka model.
    [raw] = minilm.embed(TEXTS[0], pooling_params=PoolingParams(normalize=False))
    vec = np.array(raw.outputs.embedding)
    assert abs(np.linalg.norm(vec) - 1.0) > 1e-3
    np.testing.assert_allclose(_unit(vec), st_reference(TEXTS[:1])[0], atol=2e-5)
    with pytest.raises(ValueError, match="does not support matryoshka representation") as info:
        minilm.embed(TEXTS[0], pooling_params=PoolingParams(dimensions=8))
    assert info.value.param == "dimensions"


def test_pooling_params_dimensions_truncate_a_matryoshka_model(pooling_checkpoint):
    folder = pooling_checkpoint("qwen3_embed")  # is_matryoshka in config.json
    llm = LLM(str(folder), convert="embed", max_num_seqs=4)
    [full] = llm.encode("the quick brown fox")
    [cut] = llm.embed("the quick brown fox", pooling_params=PoolingParams(dimensions=16))
    ref = reference_hidden(folder, full.prompt_token_ids)[-1]
    np.testing.assert_allclose(cut.outputs.embedding, _unit(ref[:16]), atol=1e-5)
    with pytest.raises(ValueError, match="dimensions must be between 1 and 64"):
        llm.embed("x", pooling_params=PoolingParams(dimensions=65))


def test_reward_scores_every_token_of_a_reward_model(pooling_checkpoint, minilm):
    # vLLM's LLM.reward: the reward model's scores in `.outputs.data` (this one pools ALL tokens).
    folder = pooling_checkpoint("qwen2_rm")
    llm = LLM(str(folder), max_num_seqs=4)
    [out] = llm.reward("the quick brown fox")
    assert isinstance(out, PoolingRequestOutput)
    ref = reference_score_head(folder, reference_hidden(folder, out.prompt_token_ids))
    np.testing.assert_allclose(out.outputs.data, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="apply to embedding models only"):
        llm.reward("x", pooling_params=PoolingParams(normalize=True))
    with pytest.raises(ValueError, match=r"LLM.reward\(\) is not served by this embed model"):
        minilm.reward(TEXTS)
