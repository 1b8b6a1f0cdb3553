"""The engine's token masks (runner/grammar_masks.py, runner/sampler.py) on a tiny random llama: every
constrained output is checked by a reference (jsonschema, `re.fullmatch` on safe regexes, Python's own
parser for an arithmetic grammar); constrained rows are batch invariant; logprobs stay those of the raw
model (oracle: transformers); preemption changes nothing."""

from __future__ import annotations

import ast
import json
import re

import jsonschema
import numpy as np
import pytest
import tiny_models

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.structured_output import StructuredOutputsParams as SO

MAX_TOKENS = 160

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 999},
            "owner": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 6}, "admin": {"type": "boolean"}},
                "required": ["name", "admin"],
                "additionalProperties": False,
            },
        },
        "required": ["id", "owner"],
        "additionalProperties": False,
    },
    "array": {
        "type": "array",
        "items": {"type": "integer", "minimum": -9, "maximum": 9},
        "minItems": 2,
        "maxItems": 4,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"const": 3}},
        "required": ["color", "n"],
        "additionalProperties": False,
    },
    "anyof": {
        "anyOf": [{"type": "integer", "minimum": 10, "maximum": 20}, {"type": "boolean"}, {"type": "null"}]
    },
    "refs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 9},
                    "y": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
            "day": {"type": "string", "format": "date"},
        },
        "required": ["code", "day"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 50},
        },
        "required": ["ratio", "count"],
        "additionalProperties": False,
    },
}

# Sums and products of small numbers in parentheses: Python's own parser checks the output.
ARITHMETIC = """
start: expr
expr: term (("+" | "-") term)*
term: atom ("*" atom)*
atom: NUM | "(" expr ")"
NUM: /[1-9][0-9]?/
"""


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), max_model_len=256, block_size=8, num_kv_blocks=256)


def _params(so: SO, temperature: float, seed: int | None = 1, **kw) -> SamplingParams:
    kw.setdefault("max_tokens", MAX_TOKENS)
    return SamplingParams(temperature=temperature, seed=seed, structured_outputs=so, **kw)


def _done(out) -> str:
    comp = out.outputs[0]
    assert comp.finish_reason == "stop", (comp.finish_reason, comp.text)
    return comp.text


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schemas_validate(llm, temperature):
    names = list(SCHEMAS)
    params = [_params(SO(json=SCHEMAS[n]), temperature, seed=i) for i, n in enumerate(names)]
    outs = llm.generate(["the answer is"] * len(names), params)
    for name, out in zip(names, outs):
        jsonschema.validate(json.loads(_done(out)), SCHEMAS[name])


def test_json_object_is_an_object(llm):
    # Greedy: a random model sampled at temperature 1 tends to wander in an endless string.
    outs = llm.generate(["json:", "obj", "the answer is"], _params(SO(json_object=True), 0.0))
    for out in outs:
        assert isinstance(json.loads(_done(out)), dict)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex_and_choice(llm, temperature):
    regexes = [r"[0-9]{3}-[a-z]{2,4}", r"(yes|no), [A-Z][a-z]{0,5}\.", r"#[0-9a-f]{6}"]
    choices = ["alpha", "beta", "gamma delta"]
    params = [_params(SO(regex=r), temperature, seed=i) for i, r in enumerate(regexes)]
    params.append(_params(SO(choice=choices), temperature, seed=9))
    outs = llm.generate(["pick"] * len(params), params)
    for r, out in zip(regexes, outs):
        assert re.fullmatch(r, _done(out)), (r, out.outputs[0].text)
    assert _done(outs[-1]) in choices


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lark_grammar_output_parses(llm, seed):
    out = llm.generate(["calc"], _params(SO(grammar=ARITHMETIC), 1.0, seed=seed))[0]
    text = _done(out)
    tree = ast.parse(text, mode="eval")  # raises on anything but an expression
    assert re.fullmatch(r"[0-9+\-*()]+", text)
    assert isinstance(eval(compile(tree, "<grammar>", "eval")), int)  # noqa: S307 - digits and + - * ( )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rule_of_3000_alternatives_gives_one_of_them(llm, seed):
    """Past llguidance's default row of 2000 items the request ended after its first token."""
    words = {f"w{i}x" for i in range(3000)}
    grammar = "start: word\nword: " + " | ".join(f'"{w}"' for w in sorted(words))
    out = llm.generate(["pick"], _params(SO(grammar=grammar), 1.0, seed=seed, max_tokens=16))[0]
    assert _done(out) in words


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batch_invariance(llm, temperature):
    """A constrained request's tokens do not depend on what shares its steps."""
    target = _params(SO(json=SCHEMAS["nested"]), temperature, seed=42)
    alone = llm.generate(["batch"], target)[0].outputs[0].token_ids
    others = [
        SamplingParams(temperature=1.0, seed=3, max_tokens=40),
        _params(SO(regex=r"[a-z]{5,30}"), temperature, seed=4),
        SamplingParams(temperature=0.0, max_tokens=7),
        _params(SO(choice=["x", "yy"]), temperature, seed=5),
    ]
    mixed = llm.generate(["other prompt", "batch", "a b c", "q", "zz"], [others[0], target, *others[1:]])
    assert mixed[1].outputs[0].token_ids == alone
    assert len(alone) > 3


def test_logprobs_are_raw(llm, tiny_llama_dir):
    """The reported logprobs are the model's, before the mask (vLLM's raw_logprobs)."""
    import torch

    prompt = llm.tokenizer.encode("numbers:")
    out = llm.generate([{"prompt_token_ids": prompt}], _params(SO(regex=r"[0-9]{8}"), 0.0, logprobs=0))[
        0
    ].outputs[0]
    hf = tiny_models.load_hf_model(tiny_llama_dir)
    ids = prompt + out.token_ids
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1).numpy()
    got = [out.logprobs[k][t].logprob for k, t in enumerate(out.token_ids)]
    want = [ref[len(prompt) - 1 + k, t] for k, t in enumerate(out.token_ids)]
    np.testing.assert_allclose(got, want, atol=1e-4)
    # The constraint did change the choice somewhere: a masked logprob would be higher than these.
    assert any(ref[len(prompt) - 1 + k].argmax() != t for k, t in enumerate(out.token_ids))


def test_constraint_starts_after_trigger(llm):
    """start_after_token_ids: free until the output ends with them, constrained from there on."""
    trigger = llm.tokenizer.encode("Z")
    assert len(trigger) == 1
    so = SO(regex=r"[0-9]{4}", start_after_token_ids=trigger)
    # The bias forces the trigger first; once the regex runs it cannot pick "Z" again.
    out = llm.generate(["go"], _params(so, 0.0, logit_bias={trigger[0]: 100}))[0]
    assert re.fullmatch(r"Z[0-9]{4}", _done(out))


def test_n2_seeded_children(llm):
    so = SO(json=SCHEMAS["array"])
    out = llm.generate(["two"], _params(so, 1.0, seed=11, n=2))[0]
    assert len(out.outputs) == 2
    for comp in out.outputs:
        jsonschema.validate(json.loads(comp.text), SCHEMAS["array"])
    # Each child is the request with the child's seed (seed + index).
    singles = [llm.generate(["two"], _params(so, 1.0, seed=11 + i))[0].outputs[0] for i in range(2)]
    assert [c.token_ids for c in out.outputs] == [s.token_ids for s in singles]


def test_min_tokens_does_not_outlast_the_grammar(llm):
    """A grammar done before min_tokens: the grammar wins, EOS is allowed (and repeats until min_tokens)."""
    out = llm.generate(["x"], _params(SO(choice=["ok"]), 0.0, min_tokens=6))[0].outputs[0]
    assert out.text == "ok"
    eos = llm.tokenizer.eos_token_ids
    assert len(out.token_ids) >= 6 and out.token_ids[-1] in eos


def test_bad_constraint_is_a_value_error_offline(llm):
    """vLLM's LLM.generate refuses a constraint that does not compile with a ValueError before any
    request runs; the prompts queued before it are dropped and the engine goes on."""
    good = _params(SO(regex=r"[a-c]{3}"), 0.0)
    bad = _params(SO(regex=r"(unclosed"), 0.0)
    with pytest.raises(ValueError, match="invalid regex") as exc:
        llm.generate(["a", "b", "c"], [good, bad, good])
    assert exc.value.param == "structured_outputs"
    assert not llm.engine.has_unfinished_requests()
    assert re.fullmatch(r"[a-c]{3}", _done(llm.generate(["d"], good)[0]))


def test_bad_constraint_in_the_core_fails_its_request_only(llm, monkeypatch):
    """A constraint the core cannot compile (the serving layer and the offline LLM refuse it first)
    ends that request with "abort"; the others in the batch finish normally."""
    from fdcli_engine.runner.grammar_masks import GrammarMasks

    monkeypatch.setattr(GrammarMasks, "check", lambda self, params: None)  # reach the core unchecked
    good = _params(SO(regex=r"[a-c]{3}"), 0.0)
    bad = _params(SO(regex=r"(unclosed"), 0.0)
    outs = llm.generate(["a", "b", "c"], [good, bad, good])
    assert outs[1].outputs[0].finish_reason == "abort"
    assert outs[1].outputs[0].token_ids == []
    for o in (outs[0], outs[2]):
        assert re.fullmatch(r"[a-c]{3}", _done(o))
    # The engine goes on serving.
    assert re.fullmatch(r"[a-c]{3}", _done(llm.generate(["d"], good)[0]))


def test_preemption_keeps_constrained_outputs(tiny_llama_dir):
    prompts = [f"request {i} " * (1 + i % 4) for i in range(12)]
    schemas = [SCHEMAS[n] for n in ("nested", "refs", "enum", "array")]
    params = [_params(SO(json=schemas[i % 4]), 1.0 if i % 2 else 0.0, seed=i, logprobs=0) for i in range(12)]

    def run(num_kv_blocks):
        llm = LLM(
            str(tiny_llama_dir),
            max_model_len=256,
            block_size=4,
            num_kv_blocks=num_kv_blocks,
            enable_prefix_caching=False,
        )
        outs = llm.generate(prompts, params)
        return [(o.outputs[0].token_ids, o.outputs[0].text) for o in outs], llm.get_stats()["num_preemptions"]

    roomy, n_roomy = run(2048)
    tight, n_tight = run(70)
    assert n_roomy == 0 and n_tight >= 3, (n_roomy, n_tight)
    assert tight == roomy
    for (_, text), schema in zip(roomy, [schemas[i % 4] for i in range(12)]):
        jsonschema.validate(json.loads(text), schema)


def test_backend_off_refuses_constraints(tiny_llama_dir):
    from fdcli_engine.errors import InvalidRequestError

    off = LLM(str(tiny_llama_dir), max_model_len=64, num_kv_blocks=16, guided_decoding_backend="off")
    with pytest.raises(InvalidRequestError, match="guided-decoding-backend") as exc:
        off.generate(["x"], _params(SO(regex="a"), 0.0, max_tokens=8))
    assert exc.value.param == "structured_outputs"
    assert off.generate(["x"], SamplingParams(max_tokens=2, ignore_eos=True))[0].outputs[0].token_ids


def test_compile_counters_in_engine_stats(llm):
    so = SO(regex=r"[a-z]{2}=[0-9]")  # a constraint no other test compiles
    llm.generate(["warm"], _params(SO(regex="w"), 0.0))  # the backend exists from here on
    before = llm.get_stats()
    llm.generate(["a"], _params(so, 0.0))
    llm.generate(["b"], _params(so, 1.0))
    after = llm.get_stats()
    assert after["grammar_compiles"] - before["grammar_compiles"] == 1
    # The offline LLM compiles a constraint before queueing it (a bad one is a ValueError), so each
    # request looks it up twice: a compile then a hit, and two hits for the repeat.
    assert after["grammar_cache_hits"] - before["grammar_cache_hits"] == 3
    assert after["grammar_compile_seconds"] > before["grammar_compile_seconds"]


FILTERS = dict(
    top_k=3, top_p=0.8, min_p=0.05, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3
)


@pytest.mark.parametrize("sampling_class", ["base", "rejection"])
def test_mask_comes_before_bias_penalties_and_filters(tiny_llama_dir, monkeypatch, sampling_class):
    """A disallowed token stays out whatever logit_bias, penalties, top-k/top-p/min-p or the
    rejection sampler do with the row."""
    monkeypatch.setenv("FD_SAMPLING_CLASS", sampling_class)
    llm = LLM(str(tiny_llama_dir), max_model_len=128, block_size=8, num_kv_blocks=64)
    regex = r"[0-9]{2,6}"
    banned_looking = llm.tokenizer.encode("x")[0]  # outside the regex, pushed with +100
    params = [
        _params(SO(regex=regex), 1.3, seed=s, logit_bias={banned_looking: 100.0}, max_tokens=16, **FILTERS)
        for s in range(4)
    ]
    for out in llm.generate(["p"] * 4, params):
        assert re.fullmatch(regex, _done(out)), out.outputs[0].text
