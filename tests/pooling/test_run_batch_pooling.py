"""`fd run-batch` with /v1/embeddings, /pooling and /v1/chat/reward lines: the same serving layer as `fd serve`,
so the embeddings equal the sentence-transformers computation and a wrong-runner line is a 400 record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from pooling_models import st_reference

from fdcli_engine.config import default_embedding_model_path

REPO = Path(__file__).resolve().parents[2]


def run_batch(model, tmp_path, lines):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    cmd = [
        sys.executable,
        "-m",
        "fdcli.main",
        "run-batch",
        "--model",
        str(model),
        "-i",
        str(src),
        "-o",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd + ["--threads", "1"], cwd=REPO, env=env, capture_output=True, timeout=300)
    records = (
        {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())} if out.exists() else {}
    )
    return proc, records


def line(cid, url, body):
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def test_embeddings_lines_and_wrong_route(tmp_path):
    texts = ["A man is eating food.", "I love pizza 🍕 and rockets 🚀!"]
    proc, recs = run_batch(
        default_embedding_model_path(),
        tmp_path,
        [
            line("e", "/v1/embeddings", {"input": texts}),
            line("r", "/v1/chat/reward", {"messages": [{"role": "user", "content": "hi"}]}),
            line("p", "/pooling", {"input": texts}),
            line("b", "/v1/embeddings", {"input": texts, "encoding_format": "bytes"}),
        ],
    )
    assert set(recs) == {"e", "r", "p", "b"}, proc.stderr.decode()[-2000:]
    # vLLM's binary body has no JSON form for an output line: a 400 record that says what to use.
    assert recs["b"]["response"]["status_code"] == 400
    assert "use base64" in recs["b"]["response"]["body"]["error"]["message"]
    body = recs["e"]["response"]["body"]
    got = np.array([d["embedding"] for d in body["data"]])
    ref = st_reference(texts)
    assert ((got * ref).sum(axis=1) >= 0.99999).all()
    pooled = recs["p"]["response"]["body"]["data"]  # vLLM's /pooling: the same vectors, its shape
    assert [d["object"] for d in pooled] == ["pooling", "pooling"]
    assert [d["data"] for d in pooled] == [d["embedding"] for d in body["data"]]
    assert recs["r"]["response"]["status_code"] == 400
    assert "/v1/embeddings" in recs["r"]["response"]["body"]["error"]["message"]


def test_chat_reward_line_scores(tmp_path, pooling_checkpoint):
    import torch
    import transformers

    folder = pooling_checkpoint("qwen3_seqcls")
    conv = [{"role": "user", "content": "what is the answer?"}, {"role": "assistant", "content": "42"}]
    proc, recs = run_batch(folder, tmp_path, [line("a", "/v1/chat/reward", {"messages": conv})])
    assert recs["a"]["response"]["status_code"] == 200, proc.stderr.decode()[-2000:]
    from fdcli_engine.tokenizer import load_tokenizer

    tok = load_tokenizer(str(folder))
    ids = tok.encode(tok.apply_chat_template(conv, add_generation_prompt=False), add_special_tokens=False)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(recs["a"]["response"]["body"]["data"][0]["score"], ref, rtol=1e-4, atol=1e-4)
