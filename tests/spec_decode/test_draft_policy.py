"""The adaptive switch-off: a request whose drafts stay wrong stops drafting, backs off longer each
time, and drafts again once its drafts are right."""

from __future__ import annotations

from fdcli_engine.core import draft_policy
from fdcli_engine.core.draft_policy import DraftPolicy
from fdcli_engine.request import Request
from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.structured_output.params import StructuredOutputsParams


def _req(rid="a", **kw):
    return Request(rid, [1, 2, 3], SamplingParams(max_tokens=1000, **kw), max_model_len=4096)


def _paused_steps(policy, req) -> int:
    n = 0
    while policy.wanted(req, 1) == 0:
        n += 1
    return n


def test_low_acceptance_pauses_with_growing_backoff():
    policy = DraftPolicy(4)
    req = _req()
    assert policy.wanted(req, 1) == 4
    window = draft_policy.WINDOW
    pauses = []
    for _ in range(3):
        policy.record(req.req_id, window, 0)  # a whole window of rejected drafts
        pauses.append(_paused_steps(policy, req))
    assert pauses == [
        draft_policy.FIRST_BACKOFF,
        2 * draft_policy.FIRST_BACKOFF,
        4 * draft_policy.FIRST_BACKOFF,
    ]
    # Good drafts reset the backoff: the next bad window pauses for the first backoff again.
    policy.record(req.req_id, window, window)
    assert policy.wanted(req, 1) == 4
    policy.record(req.req_id, window, 0)
    assert _paused_steps(policy, req) == draft_policy.FIRST_BACKOFF


def test_acceptance_at_the_threshold_keeps_drafting():
    policy = DraftPolicy(2)
    req = _req()
    accepted = int(draft_policy.MIN_ACCEPTANCE * draft_policy.WINDOW + 0.999)
    policy.record(req.req_id, draft_policy.WINDOW, accepted)
    assert policy.wanted(req, 1) == 2


def test_who_never_drafts():
    policy = DraftPolicy(3, disable_by_batch_size=4)
    assert policy.wanted(_req(), 3) == 3
    assert policy.wanted(_req(), 4) == 0  # vLLM's disable_by_batch_size
    constrained = _req(structured_outputs=StructuredOutputsParams(choice=["x", "y"]))
    assert policy.wanted(constrained, 1) == 3
    after_reasoning = StructuredOutputsParams(choice=["x", "y"], start_after_token_ids=[7])
    assert policy.wanted(_req(structured_outputs=after_reasoning), 1) == 0
    near_end = Request("b", [1], SamplingParams(max_tokens=2), max_model_len=64)
    near_end.append_output_token(5)
    assert policy.wanted(near_end, 1) == 0  # its last token is the target's own
    assert DraftPolicy(0).wanted(_req(), 1) == 0


def test_the_row_budget_shares_drafts_among_running_requests():
    policy = DraftPolicy(4)
    budget = draft_policy.ROW_BUDGET
    assert [policy.wanted(_req(), n) for n in (1, 2, 4, budget - 1, budget, 16)] == [
        min(4, budget - 1),
        min(4, (budget - 2) // 2),
        min(4, (budget - 4) // 4),
        min(4, 1 // (budget - 1)),
        0,
        0,
    ]
    # An explicit disable_by_batch_size replaces the budget: all k drafts below it.
    assert DraftPolicy(4, disable_by_batch_size=32).wanted(_req(), 16) == 4
