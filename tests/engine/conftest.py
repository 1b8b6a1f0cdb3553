"""Tiny checkpoints with tokenizers, and engines over them, built once per session; the SmolLM2 answers
several files compare with."""

from __future__ import annotations

import pytest
import tiny_models


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    cache = {}

    def build(arch: str = "LlamaForCausalLM"):
        if arch not in cache:
            folder = tmp_path_factory.mktemp(arch.lower())
            tiny_models.make_tiny_checkpoint(arch, folder)
            tiny_models.write_tiny_tokenizer(folder)
            cache[arch] = folder
        return cache[arch]

    return build


@pytest.fixture(scope="session")
def smollm2_fp32_cache_answers():
    """(resolved config, params, conversations, outputs): SmolLM2's greedy chat answers to QUESTIONS
    (32 tokens, top-2 log-probs) on the default GGUF-native kernels with an fp32 KV cache. The oracle of
    both the cache-dtype and the dequantized-fp32 comparisons, so it is generated once per run."""
    from test_engine_smollm2 import QUESTIONS

    from fdcli_engine import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2)
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    llm = LLM(None, max_model_len=512, kv_cache_dtype="float32")
    return llm.config, params, convs, [o.outputs[0] for o in llm.chat(convs, params)]
