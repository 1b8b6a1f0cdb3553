"""runner/grammar_masks.GrammarMasks with a scripted backend (no model, no llguidance): which tokens
each matcher consumes, when a constraint starts, what a faulty or finished grammar leaves allowed, and
that a step without constrained rows submits nothing."""

from __future__ import annotations

import numpy as np
import pytest

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.runner.grammar_masks import GrammarMasks, allowed_rows
from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.step_types import ScheduledRequest
from fdcli_engine.structured_output import StructuredOutputsParams as SO

VOCAB = 70
EOS = 2


class Matcher:
    """Allows tokens 10..19 (or what `allow` says); records what it consumed."""

    def __init__(self, allow=range(10, 20), fail_fill=False, stop_after=None):
        self.allow, self.fail_fill, self.stop_after = list(allow), fail_fill, stop_after
        self.consumed: list[int] = []

    def accept(self, token_id):
        self.consumed.append(token_id)
        return token_id in self.allow

    def fill_bitmask(self, bitmask, row):
        if self.fail_fill:
            raise RuntimeError("lexer fuel exhausted")
        bitmask[row] = 0
        bits = bitmask[row].view(np.uint32)
        for t in self.allow:
            bits[t >> 5] |= np.uint32(1 << (t & 31))

    def is_terminated(self):
        return self.stop_after is not None and len(self.consumed) >= self.stop_after


class Backend:
    name, vocab_size = "scripted", VOCAB

    def __init__(self):
        self.matchers: dict[str, Matcher] = {}
        self.next: list[Matcher] = []

    def compile(self, params):
        if params.regex == "bad":
            raise InvalidRequestError("invalid regex: bad", param="structured_outputs")
        m = self.next.pop(0) if self.next else Matcher()
        return type("G", (), {"matcher": lambda _self: m})()

    def allocate_bitmask(self, n):
        return np.full((n, (VOCAB + 31) // 32), -1, dtype=np.int32)


def _sr(rid, so=None, output=(), do_sample=True):
    return ScheduledRequest(
        req_id=rid,
        token_ids=[5],
        num_computed_tokens=0,
        block_ids=[0],
        sampling_params=SamplingParams(structured_outputs=so),
        do_sample=do_sample,
        output_token_ids=list(output),
    )


def _step(gm, reqs):
    return gm.wait(gm.begin(reqs, [r for r in reqs if r.do_sample]))


def _allowed(masks, row):
    return set(np.flatnonzero(allowed_rows(masks.bitmask, [row], VOCAB)[0]))


def test_unconstrained_step_submits_nothing():
    gm = GrammarMasks(Backend(), {EOS})
    assert gm.begin([_sr("a"), _sr("b")], [_sr("a"), _sr("b")]) is None
    assert gm._executor is None


def test_mask_rows_and_catch_up():
    backend = Backend()
    gm = GrammarMasks(backend, {EOS})
    m = Matcher()
    backend.next.append(m)
    a, b = _sr("a"), _sr("b", SO(regex="x"))
    masks = _step(gm, [a, b])
    assert masks.rows == [1] and not masks.failed
    assert _allowed(masks, 1) == set(range(10, 20))
    assert _allowed(masks, 0) == set(range(VOCAB))  # the unconstrained row is untouched
    b.output_token_ids += [12, 15]
    _step(gm, [a, b])
    assert m.consumed == [12, 15]
    _step(gm, [a, b])  # nothing new: nothing consumed twice
    assert m.consumed == [12, 15]


def test_start_after_token_ids():
    backend = Backend()
    gm = GrammarMasks(backend, {EOS})
    m = Matcher()
    backend.next.append(m)
    r = _sr("r", SO(regex="x", start_after_token_ids=[40, 41]))
    masks = _step(gm, [r])
    assert masks.rows == [] and _allowed(masks, 0) == set(range(VOCAB))  # free before the trigger
    r.output_token_ids += [3, 40, 7, 40]
    assert _allowed(_step(gm, [r]), 0) == set(range(VOCAB))
    r.output_token_ids += [41]
    assert _allowed(_step(gm, [r]), 0) == set(range(10, 20))  # the trigger is out: constrained
    r.output_token_ids += [11]
    _step(gm, [r])
    assert m.consumed == [11]  # the tokens before and of the trigger were never the grammar's


def test_finished_faulty_and_empty_grammars_allow_only_eos():
    backend = Backend()
    gm = GrammarMasks(backend, {EOS})
    backend.next += [Matcher(stop_after=1), Matcher(fail_fill=True), Matcher(allow=[]), Matcher()]
    reqs = [_sr(k, SO(regex=k)) for k in "abcd"]
    _step(gm, reqs)  # "b" fails its first fill already
    reqs[0].output_token_ids.append(10)  # "a" is done after one token
    masks = _step(gm, reqs)
    assert [_allowed(masks, i) for i in range(4)] == [{EOS}, {EOS}, {EOS}, set(range(10, 20))]
    reqs[3].output_token_ids.append(99)  # a token the grammar refuses (never sampled under the mask)
    assert _allowed(_step(gm, reqs), 3) == {EOS}


def test_compile_failure_is_reported_and_dropped():
    gm = GrammarMasks(Backend(), {EOS})
    bad, good = _sr("bad", SO(regex="bad"), do_sample=False), _sr("good", SO(regex="x"))
    masks = _step(gm, [bad, good])
    assert masks.failed == {"bad": "invalid regex: bad"}  # reported while still in prefill
    assert masks.rows == [0]  # rows index the sampling rows: "good" only
    gm.drop(["bad", "good"])
    assert len(gm) == 0


def test_backend_off_fails_constrained_requests():
    gm = GrammarMasks(None, {EOS})
    masks = _step(gm, [_sr("a", SO(regex="x"))])
    assert "not available" in masks.failed["a"]


def test_backend_built_on_first_constrained_request():
    built = []

    def make():
        built.append(Backend())
        return built[-1]

    gm = GrammarMasks(None, {EOS}, make_backend=make)
    _step(gm, [_sr("a")])
    assert built == []  # no constrained request yet: nothing loaded
    masks = _step(gm, [_sr("b", SO(regex="x"))])
    assert len(built) == 1 and gm.backend is built[0] and masks.rows == [0]
    _step(gm, [_sr("c", SO(regex="y"))])
    assert len(built) == 1


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 70])
def test_allowed_rows_bit_order(vocab):
    mask = np.zeros((1, (vocab + 31) // 32), dtype=np.int32)
    ids = [0, vocab // 2, vocab - 1]
    for t in ids:
        mask.view(np.uint32)[0, t >> 5] |= np.uint32(1 << (t & 31))
    assert list(np.flatnonzero(allowed_rows(mask, [0], vocab)[0])) == sorted(set(ids))


def test_prepared_compile_is_used_and_dropped():
    backend = Backend()
    compiled = []
    real = backend.compile
    backend.compile = lambda params: compiled.append(params.regex) or real(params)
    gm = GrammarMasks(backend, {EOS})
    gm.prepare("a", SO(regex="x"))
    gm.prepare("gone", SO(regex="y"))
    gm.prepare("bad", SO(regex="bad"))
    gm.drop(["gone"])  # aborted while waiting: its compile is forgotten
    masks = _step(gm, [_sr("a", SO(regex="x")), _sr("bad", SO(regex="bad"))])
    assert masks.rows == [0] and masks.failed == {"bad": "invalid regex: bad"}
    assert compiled.count("x") == 1  # compiled once, by prepare
    assert "gone" not in gm._compiling and not gm._compiling
