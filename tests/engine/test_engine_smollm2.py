"""SmolLM2-135M-Instruct from its GGUF (the default model): fd's greedy generations equal transformers'
on the same dequantized weights (transformers loads the GGUF itself with `gguf_file=`)."""

from __future__ import annotations

import pytest

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.config import default_model_path

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain what a CPU cache is in one sentence.",
    "Translate 'good morning' into Spanish.",
]


@pytest.fixture(scope="module")
def fd_llm():
    # quantization=None: the GGUF blocks are dequantized to fp32, exactly what transformers does.
    return LLM(None, max_model_len=512, quantization=None)


def test_default_model_resolves_to_smollm2(fd_llm):
    assert fd_llm.config.model_path == default_model_path()
    assert fd_llm.config.hf_config["num_hidden_layers"] == 30


def test_greedy_chat_equals_transformers(fd_llm):
    import torch
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    params = SamplingParams(temperature=0, max_tokens=32)
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    outs = fd_llm.chat(convs, params)
    eos = sorted(fd_llm.tokenizer.eos_token_ids)
    for out in outs:
        ids = out.prompt_token_ids
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=32,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )[0, len(ids) :].tolist()
        assert out.outputs[0].token_ids == ref, out.prompt
    assert "Paris" in outs[0].outputs[0].text
