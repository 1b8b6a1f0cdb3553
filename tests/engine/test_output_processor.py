"""Detokenization, stop strings and streaming deltas, on the SmolLM2 tokenizer."""

import pytest

from fdcli_engine.output_processor import OutputProcessor
from fdcli_engine.outputs import EngineCoreOutput
from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def feed(tok, text, params, finish_last="length"):
    """Feed `text`'s tokens one per step; returns (outputs, ids to abort, step of the abort)."""
    op = OutputProcessor(tok)
    op.add_request("r", None, [1, 2, 3], params)
    ids = tok.encode(text, add_special_tokens=False)
    outs, abort_step = [], None
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        core = EngineCoreOutput("r", [t], finish_reason=finish_last if last else None)
        res, aborts = op.process_outputs([core])
        outs.extend(res)
        if aborts:
            assert aborts == ["r"] and abort_step is None
            abort_step = i
        if res and res[-1].finished:
            break
    return outs, abort_step


def test_deltas_concatenate_to_full_text(tok):
    text = "Hello wörld 😀 — 東京 123 ok"
    outs, _ = feed(tok, text, SamplingParams())
    assert "".join(o.outputs[0].delta_text for o in outs) == text
    assert outs[-1].outputs[0].text == text
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
    assert all("\ufffd" not in o.outputs[0].delta_text for o in outs)


def test_stop_string_across_tokens(tok):
    text = "The answer is forty-two. STOP HERE and more text"
    outs, abort_step = feed(tok, text, SamplingParams(stop=["STOP HERE"]))
    final = outs[-1].outputs[0]
    assert final.text == "The answer is forty-two. "
    assert final.finish_reason == "stop" and final.stop_reason == "STOP HERE"
    assert abort_step is not None
    streamed = "".join(o.outputs[0].delta_text for o in outs)
    assert streamed == final.text  # the partial stop string was never streamed


def test_include_stop_str(tok):
    outs, _ = feed(tok, "abc END def", SamplingParams(stop=["END"], include_stop_str_in_output=True))
    assert outs[-1].outputs[0].text == "abc END"


def test_earliest_stop_wins_and_core_finish_still_checked(tok):
    outs, abort_step = feed(tok, "one two three", SamplingParams(stop=["three", "two"]), finish_last="length")
    assert outs[-1].outputs[0].text == "one "
    assert outs[-1].outputs[0].stop_reason == "two"
    # A stop string completed by the very token on which the core finished is still honoured.
    outs, abort_step = feed(tok, "alpha beta", SamplingParams(stop=[" beta"]), finish_last="length")
    assert outs[-1].outputs[0].text == "alpha" and outs[-1].outputs[0].finish_reason == "stop"


def test_logprobs_decoded(tok):
    op = OutputProcessor(tok)
    op.add_request("r", None, [1], SamplingParams(logprobs=1))
    t = tok.encode("Hi", add_special_tokens=False)[0]
    [res], _ = op.process_outputs([EngineCoreOutput("r", [t], new_logprobs=[[(t, -0.5, 2), (7, -1.0, 1)]])])
    [entry] = res.outputs[0].logprobs
    assert list(entry) == [t, 7]
    assert entry[t].logprob == -0.5 and entry[t].decoded == "Hi"
    assert entry[t].rank == 2 and entry[7].rank == 1  # the core's ranks, as vLLM's Logprob.rank


def test_cumulative_logprob_sums_the_sampled_tokens(tok):
    """vLLM's CompletionOutput.cumulative_logprob: the running sum of the sampled tokens' logprobs in
    every output kind (a DELTA output too); None when logprobs were not asked for."""
    from fdcli_engine.sampling_params import RequestOutputKind

    for kind in RequestOutputKind:
        op = OutputProcessor(tok)
        op.add_request("r", None, [1], SamplingParams(logprobs=1, output_kind=kind))
        sums = []
        for i, (t, lp) in enumerate(((5, -0.5), (6, -1.25))):
            done = "length" if i == 1 else None
            core = EngineCoreOutput("r", [t], new_logprobs=[[(t, lp, 3), (9, -0.1, 1)]], finish_reason=done)
            sums += [r.outputs[0].cumulative_logprob for r in op.process_outputs([core])[0]]
        assert sums[-1] == pytest.approx(-1.75)
        if kind is not RequestOutputKind.FINAL_ONLY:
            assert sums == pytest.approx([-0.5, -1.75])
    outs, _ = feed(tok, "one two", SamplingParams())
    assert outs[-1].outputs[0].cumulative_logprob is None


def test_output_kinds_carry_the_same_text(tok):
    from fdcli_engine.sampling_params import RequestOutputKind

    text = "The answer is forty-two. STOP HERE and more text"
    ref, _ = feed(tok, text, SamplingParams(stop=["STOP HERE"]))
    delta, _ = feed(tok, text, SamplingParams(stop=["STOP HERE"], output_kind=RequestOutputKind.DELTA))
    final, _ = feed(tok, text, SamplingParams(stop=["STOP HERE"], output_kind=RequestOutputKind.FINAL_ONLY))
    # DELTA: each output holds only what is new; together they are the cumulative final.
    assert [o.outputs[0].text for o in delta] == [o.outputs[0].delta_text for o in ref]
    assert sum((o.outputs[0].token_ids for o in delta), []) == ref[-1].outputs[0].token_ids
    # FINAL_ONLY: one output, the whole result.
    assert len(final) == 1 and final[0].finished
    assert final[0].outputs[0].text == ref[-1].outputs[0].text
    assert final[0].outputs[0].token_ids == ref[-1].outputs[0].token_ids
    assert final[0].outputs[0].finish_reason == "stop" == ref[-1].outputs[0].finish_reason


def test_delta_logprobs_are_the_new_tokens_only(tok):
    from fdcli_engine.sampling_params import RequestOutputKind

    op = OutputProcessor(tok)
    op.add_request("r", None, [1], SamplingParams(logprobs=1, output_kind=RequestOutputKind.DELTA))
    for t in (5, 6):
        [res], _ = op.process_outputs(
            [EngineCoreOutput("r", [t], new_logprobs=[[(t, -0.5, 2), (7, -1.0, 1)]])]
        )
        assert [list(e) for e in res.outputs[0].logprobs] == [[t, 7]]


def test_finished_output_carries_metrics(tok):
    outs, _ = feed(tok, "one two three", SamplingParams())
    m = outs[-1].metrics
    assert m is not None and m.arrival_time <= m.first_token_time <= m.finished_time
    assert m.num_generation_tokens == len(outs[-1].outputs[0].token_ids)
    assert all(o.metrics is None for o in outs[:-1])


def test_core_events_become_vllms_request_times(tok):
    """The core's events and step times (as the scheduler stamps them) fill RequestMetrics as vLLM's
    RequestStateStats: the first QUEUED and the first SCHEDULED (a re-admission after a preemption
    does not move it), the first and last token steps; the intervals are vLLM's FinishedRequestStats
    definitions, and the inter-token gaps are the steps' time differences."""
    from fdcli_engine.outputs import EngineCoreEvent
    from fdcli_engine.outputs import EngineCoreEventType as T

    op = OutputProcessor(tok)
    op.add_request("r", None, [1, 2, 3], SamplingParams())
    first = [EngineCoreEvent(T.QUEUED, 10.0), EngineCoreEvent(T.SCHEDULED, 12.0)]
    first += [EngineCoreEvent(T.PREEMPTED, 13.0), EngineCoreEvent(T.SCHEDULED, 15.0)]
    steps = [
        EngineCoreOutput("r", [5], events=first, timestamp=16.0),
        EngineCoreOutput("r", [6, 7], timestamp=18.0),  # one step, two tokens (speculative decoding)
        EngineCoreOutput("r", [8], finish_reason="length", timestamp=21.0),
    ]
    outs = [o for s in steps for o in op.process_outputs([s])[0]]
    m = outs[-1].metrics
    assert (m.queued_ts, m.scheduled_ts, m.first_token_ts, m.last_token_ts) == (10.0, 12.0, 16.0, 21.0)
    assert (m.queued_time, m.prefill_time, m.decode_time, m.inference_time) == (2.0, 4.0, 5.0, 9.0)
    assert m.inter_token_latencies == [2.0, 3.0] and m.num_generation_tokens == 4


def test_never_scheduled_request_has_no_phases(tok):
    """Aborted while queued: vLLM's intervals that need a SCHEDULED or a first token are None."""
    from fdcli_engine.outputs import EngineCoreEvent
    from fdcli_engine.outputs import EngineCoreEventType as T

    op = OutputProcessor(tok)
    op.add_request("r", None, [1, 2, 3], SamplingParams())
    core = EngineCoreOutput("r", [], finish_reason="abort", events=[EngineCoreEvent(T.QUEUED, 3.0)])
    [out], _ = op.process_outputs([core])
    m = out.metrics
    assert m.queued_ts == 3.0 and m.first_token_time is None
    assert (m.queued_time, m.prefill_time, m.decode_time, m.inference_time) == (None,) * 4


def test_requests_share_one_id_decodes_per_skip_setting(tok):
    # One processor, two interleaved requests over the same ids (a special token among them), one
    # skipping special tokens and one keeping them: with the one-id decodes the processor shares across
    # its requests, each request's streamed text is still its own full decode.
    ids = tok.encode("Hi<|im_end|> there, wörld 😀 again", add_special_tokens=False)
    special = tok.encode("<|im_end|>", add_special_tokens=False)
    assert len(special) == 1 and special[0] in ids
    op = OutputProcessor(tok)
    op.add_request("skip", None, [1, 2, 3], SamplingParams(skip_special_tokens=True))
    op.add_request("keep", None, [1, 2, 3], SamplingParams(skip_special_tokens=False))
    deltas = {"skip": [], "keep": []}
    for i, t in enumerate(ids):
        finish = "length" if i == len(ids) - 1 else None
        for rid in ("skip", "keep") if i % 2 else ("keep", "skip"):
            res, aborts = op.process_outputs([EngineCoreOutput(rid, [t], finish_reason=finish)])
            assert not aborts and [r.request_id for r in res] == [rid]
            deltas[rid].append(res[0].outputs[0].delta_text)
    assert "".join(deltas["skip"]) == tok.decode(ids, skip_special_tokens=True)
    assert "".join(deltas["keep"]) == tok.decode(ids, skip_special_tokens=False)
    assert "<|im_end|>" in "".join(deltas["keep"]) and "<|im_end|>" not in "".join(deltas["skip"])


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("include", [False, True])
def test_the_stop_token_is_text_only_with_include_stop_str(tok, skip_special_tokens, include):
    """vLLM's rule: the token that stopped the request (EOS here, a special token; or one of
    stop_token_ids) is not in the text unless include_stop_str_in_output; with skip_special_tokens off,
    EOS's text used to end every answer."""
    eos = tok.eos_token
    params = SamplingParams(skip_special_tokens=skip_special_tokens, include_stop_str_in_output=include)
    outs, _ = feed(tok, "Hello there" + eos, params, finish_last="stop")
    final = outs[-1].outputs[0]
    kept = include and not skip_special_tokens  # a special token's text is also subject to skipping
    assert final.text == "Hello there" + (eos if kept else "")
    assert "".join(o.outputs[0].delta_text for o in outs) == final.text
    assert final.token_ids[-1] == tok.eos_token_id  # the id itself stays among the output's tokens


@pytest.mark.parametrize("include", [False, True])
def test_a_plain_stop_token_id_is_text_only_with_include_stop_str(tok, include):
    params = SamplingParams(
        stop_token_ids=[tok.encode(".", add_special_tokens=False)[0]], include_stop_str_in_output=include
    )
    outs, _ = feed(tok, "Hello there.", params, finish_last="stop")
    assert outs[-1].outputs[0].text == "Hello there" + ("." if include else "")
