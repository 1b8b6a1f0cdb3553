"""`"method": "eagle"` and `"eagle3"` through the engine (`LLM(..., speculative_config=...)`) and through `fd serve`
with the openai SDK: greedy outputs are token-identical to the same model without speculation (chunked
prompts, a second round hitting the prefix cache, a KV pool tight enough to preempt), and the
spec_decode counters agree: accepted <= drafted, and every verification emitted its accepted drafts
plus one token (ignore_eos: no stop cuts a step short).

Random heads (their drafts are almost all rejected; the EAGLE-3 one reads the 3-layer target's layers
0, 1, 2), and an "echo" pair where acceptance is
certain: a target whose layers add nothing (o_proj and down_proj zero, tied embedding) repeats its last
token, and a head whose fc passes the embedding through (EAGLE-3: the target's layer-0 input) and whose
layer adds nothing proposes the token it is given, so its drafts are the target's tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tiny_models import make_tiny_checkpoint, make_tiny_eagle, make_tiny_eagle3, write_tiny_tokenizer

from fdcli_engine import LLM, SamplingParams

K = 3
MAX_TOKENS = 12
OPTIONS = dict(max_model_len=128, block_size=4, max_num_batched_tokens=16, max_num_seqs=8)


def zero_tensors(folder, suffixes: tuple[str, ...], replace: dict | None = None) -> None:
    """Zero the tensors of `folder`'s model.safetensors ending with `suffixes`, then set `replace`."""
    path = folder / "model.safetensors"
    tensors = {k: v.copy() for k, v in load_file(path).items()}
    for name, w in tensors.items():
        if name.endswith(suffixes):
            w[...] = 0
    save_file({**tensors, **(replace or {})}, str(path))


def echo_head(head, echo) -> None:
    """Make `head` (an EAGLE or EAGLE-3 head of the echo target) propose its input's token: its layers
    add nothing, fc passes the first H features through (the embedding; EAGLE-3: the target's layer-0
    input, which in the echo target is every layer's), and an EAGLE-3 head's norm is the target's."""
    fc = load_file(head / "model.safetensors")["fc.weight"]
    replace = {"fc.weight": np.eye(*fc.shape, dtype=np.float32)}
    if "norm.weight" in load_file(head / "model.safetensors"):
        replace["norm.weight"] = load_file(echo / "model.safetensors")["model.norm.weight"]
    zero_tensors(head, ("o_proj.weight", "down_proj.weight"), replace)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle-engine")
    target = make_tiny_checkpoint("LlamaForCausalLM", root / "target", num_hidden_layers=3)
    write_tiny_tokenizer(target)
    echo = make_tiny_checkpoint("LlamaForCausalLM", root / "echo", tie_word_embeddings=True)
    write_tiny_tokenizer(echo)
    zero_tensors(echo, ("o_proj.weight", "down_proj.weight"))
    echo_heads = {
        "eagle": make_tiny_eagle(root / "echo-eagle", echo),
        # The target's vocabulary and LM head; layers 0, 1 and 2 (its output) of the 2-layer target.
        "eagle3": make_tiny_eagle3(
            root / "echo-eagle3",
            echo,
            draft_vocab_size=512,
            d2t=False,
            lm_head=False,
            eagle_aux_hidden_state_layer_ids=[0, 1, 2],
        ),
    }
    for head in echo_heads.values():
        echo_head(head, echo)
    return {
        "target": target,
        "eagle": make_tiny_eagle(root / "eagle", target),
        "eagle3": make_tiny_eagle3(root / "eagle3", target, eagle_aux_hidden_state_layer_ids=[0, 1, 2]),
        "echo": echo,
        "echo-heads": echo_heads,
    }


def eagle(folder, method: str = "eagle") -> dict:
    return {"method": method, "model": str(folder), "num_speculative_tokens": K}


METHODS = ("eagle", "eagle3")


def prompts(seed: int, n: int = 6) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 280, size=int(rng.integers(4, 40))).tolist() for _ in range(n)]


def run(model, spec=None, max_tokens=MAX_TOKENS, **options) -> tuple[list[list[int]], dict]:
    """Two rounds: the prompts, then the same prompts each with a new tail (prefix-cache hits)."""
    llm = LLM(str(model), speculative_config=spec, **{**OPTIONS, **options})
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    first = prompts(0)
    outs = []
    for batch in (first, [p + [7, 8, 9] for p in first]):
        outs += [o.outputs[0].token_ids for o in llm.generate(batch, params)]
    return outs, llm.get_stats()


def assert_consistent(stats: dict) -> None:
    drafted = stats["spec_decode_num_draft_tokens_total"]
    accepted = stats["spec_decode_num_accepted_tokens_total"]
    assert 0 < drafted and 0 <= accepted <= drafted, stats
    assert stats["spec_decode_num_emitted_tokens_total"] == accepted + stats["spec_decode_num_drafts"], stats
    per_pos = stats["spec_decode_num_accepted_tokens_per_pos"]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True), stats


@pytest.mark.parametrize("method", METHODS)
def test_random_head_changes_no_token(folders, method):
    plain, _ = run(folders["target"])
    outs, stats = run(folders["target"], eagle(folders[method], method))
    assert outs == plain
    assert stats["prefix_cache_hits"] > 0
    assert_consistent(stats)
    assert stats["spec_decode_num_accepted_tokens_total"] < stats["spec_decode_num_draft_tokens_total"] / 2


@pytest.mark.parametrize("method", METHODS)
def test_echo_head_drafts_are_accepted(folders, method):
    plain, _ = run(folders["echo"])
    assert all(len(set(o)) == 1 for o in plain)  # the echo target repeats one token
    outs, stats = run(folders["echo"], eagle(folders["echo-heads"][method], method))
    assert outs == plain
    assert_consistent(stats)
    assert stats["spec_decode_num_accepted_tokens_total"] == stats["spec_decode_num_draft_tokens_total"] > 50


@pytest.mark.parametrize("method", METHODS)
def test_preemption(folders, method):
    options = dict(enable_prefix_caching=False, max_tokens=40)
    expected, stats = run(folders["target"], **options)
    assert stats["num_preemptions"] == 0
    outs, stats = run(folders["target"], eagle(folders[method], method), num_kv_blocks=32, **options)
    assert stats["num_preemptions"] > 5
    assert outs == expected
    assert_consistent(stats)


@pytest.mark.parametrize("method", METHODS)
def test_seeded_sampling_is_unchanged(folders, method):
    # EAGLE drafts are point proposals (argmax tokens), so a seeded request's tokens are its plain ones.
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=s, max_tokens=16) for s in range(4)]

    def sample(spec):
        llm = LLM(str(folders["target"]), speculative_config=spec, **OPTIONS)
        return [o.outputs[0].token_ids for o in llm.generate(prompts(2, n=4), params)]

    assert sample(eagle(folders[method], method)) == sample(None)


@pytest.mark.parametrize("method", METHODS)
def test_server_with_the_openai_sdk(folders, tmp_path, method):
    from server.fd_server import start_server

    batch = prompts(3, n=4)
    llm = LLM(str(folders["target"]), **OPTIONS)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    plain = [o.outputs[0].text for o in llm.generate(batch, params)]
    spec = json.dumps(eagle(folders[method], method))
    srv = start_server(folders["target"], tmp_path, "--speculative-config", spec, "--max-model-len", "128")
    try:
        client = srv.client()
        texts = []
        for prompt in batch:
            r = client.completions.create(
                model=str(folders["target"]),
                prompt=prompt,
                max_tokens=MAX_TOKENS,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            assert r.usage.completion_tokens == MAX_TOKENS
            texts.append(r.choices[0].text)
        assert texts == plain
        m = srv.metrics()
        drafted = m["fd:spec_decode_num_draft_tokens_total"]
        accepted = m["fd:spec_decode_num_accepted_tokens_total"]
        assert 0 < drafted and 0 <= accepted <= drafted
        assert m["fd:spec_decode_num_emitted_tokens_total"] == accepted + m["fd:spec_decode_num_drafts_total"]
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]
