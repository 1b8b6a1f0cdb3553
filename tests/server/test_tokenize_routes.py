"""/tokenize and /detokenize on the FastAPI app over the scripted engine (the tiny ChatML tokenizer):
vLLM's shapes. /detokenize keeps special tokens, so tokenize → detokenize gives the rendered prompt
back; `return_token_strs` adds each token's vocabulary string."""

from __future__ import annotations

import pytest
from scripted import scripted_client

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
def http(tokenizer):
    return scripted_client(tokenizer, ["x"])[1]


def test_detokenize_keeps_special_tokens_so_chat_ids_round_trip(http, tokenizer):
    r = http.post("/tokenize", json={"messages": MSGS, "add_generation_prompt": False})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    assert ids[0] == tokenizer.get_vocab()["<|im_start|>"]
    back = http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    assert back == "<|im_start|>user\nhi<|im_end|>\n" == tokenizer.apply_chat_template(MSGS, False)


def test_return_token_strs_gives_the_vocabulary_strings(http, tokenizer):
    body = {"prompt": "<|im_start|>hello world"}
    plain = http.post("/tokenize", json=body).json()
    assert plain["token_strs"] is None  # as vLLM: only when asked
    r = http.post("/tokenize", json={**body, "return_token_strs": True}).json()
    assert r["tokens"] == plain["tokens"] and r["count"] == len(r["tokens"])
    vocab = tokenizer.get_vocab()
    assert r["token_strs"][0] == "<|im_start|>"
    assert [vocab[s] for s in r["token_strs"]] == r["tokens"]
    assert "".join(r["token_strs"][1:]).replace("\u0120", " ") == "hello world"  # byte-level BPE's space
    with_msgs = http.post("/tokenize", json={"messages": MSGS, "return_token_strs": True}).json()
    assert [vocab[s] for s in with_msgs["token_strs"]] == with_msgs["tokens"]
    assert "fd-ignored-fields" not in http.post("/tokenize", json={**body, "return_token_strs": True}).headers
