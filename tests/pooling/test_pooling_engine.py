"""The pooling engine (in-process EngineCore) against transformers on tiny random checkpoints:
--convert embed with each pooling type, a sequence-classification head, reward and process-reward
heads. Raw pools come from the engine; normalization is the front end's postprocess."""

from __future__ import annotations

import numpy as np
import pooling_models
import pytest

from fdcli_engine.config import EngineConfig
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.pooling.config import get_pooler_config
from fdcli_engine.pooling.postprocess import postprocess

PROMPTS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world",
    "what is the answer? 42 is the answer. the lazy dog",
]


def run_engine(folder, prompts, **options):
    """(tokenized prompts, raw pooled arrays, resolved PoolerConfig) for one batch through EngineCore."""
    from fdcli_engine.engine import EngineCore, EngineCoreRequest
    from fdcli_engine.pooling_params import PoolingParams
    from fdcli_engine.tokenizer import load_tokenizer

    config = resolve_config(EngineConfig(model=str(folder), max_num_seqs=8, **options))
    core = EngineCore(config)
    tok = load_tokenizer(config)
    ids = [tok.encode(p) for p in prompts]
    for i, p in enumerate(ids):
        core.add_request(EngineCoreRequest(f"r{i}", p, pooling_params=PoolingParams()))
    pooled: dict[str, np.ndarray] = {}
    steps = 0
    while core.has_unfinished_requests():
        for out in core.step():
            pooled[out.req_id] = np.asarray(out.pooled, dtype=np.float32)
        steps += 1
    assert steps == 1, "pooling requests that fit the token budget share one step"
    return ids, [pooled[f"r{i}"] for i in range(len(ids))], get_pooler_config(config)


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_qwen3_convert_embed_last_matches_transformers(pooling_checkpoint):
    folder = pooling_checkpoint("qwen3_embed")
    ids, pools, pc = run_engine(folder, PROMPTS, convert="embed")
    assert (pc.task, pc.pooling_type, pc.normalize) == ("embed", "LAST", True)
    for p, raw in zip(ids, pools):
        ref = pooling_models.reference_hidden(folder, p)[-1]
        np.testing.assert_allclose(raw, ref, rtol=1e-4, atol=1e-4)
        emb = postprocess(raw, pc)
        assert float(np.dot(emb, _unit(ref))) > 0.99999
        assert abs(np.linalg.norm(emb) - 1.0) < 1e-5


@pytest.mark.parametrize("kind", ["MEAN", "CLS", "ALL"])
def test_qwen3_pooler_config_types(pooling_checkpoint, kind):
    folder = pooling_checkpoint("qwen3_embed")
    ids, pools, pc = run_engine(folder, PROMPTS, runner="pooling", pooler_config={"pooling_type": kind})
    assert pc.pooling_type == kind
    for p, raw in zip(ids, pools):
        h = pooling_models.reference_hidden(folder, p)
        ref = {"MEAN": h.mean(axis=0), "CLS": h[0], "ALL": h}[kind]
        assert raw.shape == ref.shape
        np.testing.assert_allclose(raw, ref, rtol=1e-4, atol=1e-4)
        # ALL normalizes each token's vector; the others the single pooled one.
        np.testing.assert_allclose(postprocess(raw, pc), _unit(ref), rtol=1e-4, atol=1e-5)


def test_matryoshka_dimensions_truncate_then_normalize(pooling_checkpoint):
    folder = pooling_checkpoint("qwen3_embed")
    ids, pools, pc = run_engine(folder, PROMPTS[:1], convert="embed")
    ref = pooling_models.reference_hidden(folder, ids[0])[-1]
    np.testing.assert_allclose(postprocess(pools[0], pc, dimensions=16), _unit(ref[:16]), atol=1e-5)


def test_sequence_classification_scores_equal_transformers_logits(pooling_checkpoint):
    import torch
    import transformers

    folder = pooling_checkpoint("qwen3_seqcls")
    ids, pools, pc = run_engine(folder, PROMPTS)
    assert (pc.task, pc.pooling_type, pc.softmax) == ("classify", "LAST", False)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, attn_implementation="eager"
    ).eval()
    for p, raw in zip(ids, pools):
        with torch.no_grad():
            ref = model(torch.tensor([p])).logits[0].numpy()
        assert raw.shape == (3,)
        np.testing.assert_allclose(postprocess(raw, pc), ref, rtol=1e-4, atol=1e-4)


def test_process_reward_step_scores_one_per_step_tag(pooling_checkpoint):
    from fdcli_engine.tokenizer import load_tokenizer

    folder = pooling_checkpoint("qwen2_prm")
    tag = load_tokenizer(str(folder)).encode(pooling_models.STEP_TAG, add_special_tokens=False)
    assert len(tag) == 1
    prompts = [
        f"step one: the answer{pooling_models.STEP_TAG}step two: 42{pooling_models.STEP_TAG}"
        f"the end{pooling_models.STEP_TAG}",
        f"hello{pooling_models.STEP_TAG}",
    ]
    ids, pools, pc = run_engine(folder, prompts, pooler_config={"step_tag_id": tag[0]})
    assert (pc.task, pc.pooling_type, pc.softmax) == ("process_reward", "STEP", True)
    for p, raw, n_steps in zip(ids, pools, (3, 1)):
        h = pooling_models.reference_hidden(folder, p)
        rows = [i for i, t in enumerate(p) if t == tag[0]]
        assert len(rows) == n_steps
        logits = pooling_models.reference_score_head(folder, h[rows])
        ref = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
        probs = postprocess(raw, pc)
        assert probs.shape == (n_steps, 2)
        np.testing.assert_allclose(probs, ref, rtol=1e-4, atol=1e-5)


def test_reward_model_all_scores_every_token(pooling_checkpoint):
    folder = pooling_checkpoint("qwen2_rm")
    ids, pools, pc = run_engine(folder, PROMPTS[:2])
    assert (pc.task, pc.pooling_type) == ("reward", "ALL")
    for p, raw in zip(ids, pools):
        ref = pooling_models.reference_score_head(folder, pooling_models.reference_hidden(folder, p))
        assert raw.shape == (len(p), 1)
        np.testing.assert_allclose(raw, ref, rtol=1e-4, atol=1e-4)
