"""`fd serve` with no --model serves the real SmolLM2-135M-Instruct GGUF; its greedy chat answer equals
the in-process engine's for the same prompt ids, and it says where it listens and what it serves."""

from __future__ import annotations

import pytest

from fdcli_engine.entrypoints.openai.app_state import ServerArgs

pytestmark = pytest.mark.slow


def test_defaults_are_loopback_8000():
    args = ServerArgs()
    assert (args.host, args.port) == ("127.0.0.1", 8000)


@pytest.fixture
def smol(smol_server):
    return smol_server


def test_startup_line_names_model_and_url(smol):
    log = smol.log.read_text()
    line = next(x for x in log.splitlines() if x.startswith("fd serve:"))
    assert "SmolLM2-135M-Instruct" in line and smol.url in line


def test_greedy_chat_equals_in_process_engine(smol):
    from fdcli_engine.api import LLM
    from fdcli_engine.sampling_params import SamplingParams

    client = smol.client()
    model = client.models.list().data[0].id
    assert "SmolLM2" in model
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(
        model=model, messages=msgs, max_tokens=16, temperature=0, extra_body={"return_token_ids": True}
    )
    with smol.http() as h:
        prompt_ids = h.post("/tokenize", json={"messages": msgs}).json()["tokens"]
    llm = LLM(None, max_model_len=1024)
    ref = llm.generate(prompt_ids, SamplingParams(max_tokens=16, temperature=0))[0].outputs[0]
    assert r.choices[0].token_ids == ref.token_ids
    assert r.choices[0].message.content == ref.text
    assert "Paris" in ref.text
