"""The scheduler with drafts, against tests/core's fake runner oracle (a token is a hash of everything
before it, read back through the block tables): drafts that are partly right must give exactly the
tokens of plain decoding, never a token past a stop or a limit, and the KV of rejected drafts must never
be read as a real token's."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from test_scheduler import FakeRunner, make_prompts, next_token, reference  # noqa: E402

from fdcli_engine.core.kv_cache_manager import KVCacheManager  # noqa: E402
from fdcli_engine.core.scheduler import Scheduler  # noqa: E402
from fdcli_engine.request import Request  # noqa: E402
from fdcli_engine.sampling_params import SamplingParams  # noqa: E402
from fdcli_engine.step_types import ModelRunnerOutput  # noqa: E402


class SpecFakeRunner(FakeRunner):
    """Writes every scheduled token (drafts included) into its "cache", samples each draft row from the
    prefix read back through the block table, accepts like runner/spec_decode.accept, and proposes
    drafts that are right for a random number of positions, then wrong."""

    def __init__(self, block_size, seed=0):
        super().__init__(block_size)
        self.rng = random.Random(seed)
        self.max_drafts_seen = 0

    def execute(self, so):
        out = ModelRunnerOutput(sampled_token_ids={})
        for sr in so.scheduled:
            for j, t in enumerate(sr.token_ids):
                self.slots[self.slot(sr.block_ids, sr.num_computed_tokens + j)] = t
            if not sr.do_sample:
                continue
            k = len(sr.spec_token_ids)
            self.max_drafts_seen = max(self.max_drafts_seen, k)
            end = sr.num_computed_tokens + len(sr.token_ids)
            emitted = []
            for j in range(k + 1):
                prefix = [self.slots[self.slot(sr.block_ids, p)] for p in range(end - k + j)]
                emitted.append(next_token(prefix))
                if j == k or emitted[-1] != sr.spec_token_ids[j]:
                    break
            out.sampled_token_ids[sr.req_id] = emitted
            if sr.num_drafts_wanted:
                seq = sr.prompt_token_ids + sr.output_token_ids + emitted
                right = self.rng.randint(0, sr.num_drafts_wanted)
                drafts = []
                for _ in range(sr.num_drafts_wanted):
                    t = next_token(seq + drafts)
                    drafts.append(t if len(drafts) < right else (t + 1) % 50)
                out.spec_token_ids[sr.req_id] = drafts
        return out


def run_spec(prompts, params, k=3, num_blocks=64, block_size=4, budget=32, max_model_len=256, lookahead=0):
    kv = KVCacheManager(num_blocks, block_size)
    sched = Scheduler(
        kv, 8, budget, max_model_len=max_model_len, num_speculative_tokens=k, num_lookahead_slots=lookahead
    )
    runner = SpecFakeRunner(block_size)
    for i, p in enumerate(prompts):
        sched.add_request(Request(f"r{i}", p, params, max_model_len=max_model_len))
    results: dict[str, list[int]] = {}
    reasons = {}
    for _ in range(10_000):
        if not sched.has_unfinished_requests():
            break
        so = sched.schedule()
        assert so.num_scheduled_tokens <= budget
        for sr in so.scheduled:  # the table covers every draft and the lookahead
            assert len(sr.block_ids) * block_size >= sr.num_computed_tokens + len(sr.token_ids)
        for o in sched.update_from_output(so, runner.execute(so)):
            results.setdefault(o.req_id, []).extend(o.new_token_ids)
            if o.finish_reason:
                reasons[o.req_id] = (o.finish_reason, o.stop_reason)
    assert kv.num_free_blocks == num_blocks
    return (
        [results[f"r{i}"] for i in range(len(prompts))],
        [reasons[f"r{i}"] for i in range(len(prompts))],
        sched,
        runner,
    )


@pytest.mark.parametrize("num_blocks", [64, 14])  # 14: preemptions
@pytest.mark.parametrize("lookahead", [0, 3])
def test_drafts_give_plain_tokens(num_blocks, lookahead):
    prompts = make_prompts(10, seed=2)
    outs, _, sched, runner = run_spec(
        prompts, SamplingParams(max_tokens=20), num_blocks=num_blocks, lookahead=lookahead
    )
    assert outs == [reference(p, 20) for p in prompts]
    stats = sched.get_stats()
    assert stats["spec_decode_num_accepted_tokens_total"] > 0
    assert stats["spec_decode_num_draft_tokens_total"] > stats["spec_decode_num_accepted_tokens_total"]
    assert runner.max_drafts_seen == 3
    if num_blocks == 14:
        assert stats["num_preemptions"] > 0
    assert stats["generation_tokens_total"] == 200


def test_never_past_max_tokens_or_max_model_len():
    prompts = make_prompts(6, seed=4)
    for max_tokens in (1, 2, 5):
        outs, reasons, _, _ = run_spec(prompts, SamplingParams(max_tokens=max_tokens), k=4)
        assert outs == [reference(p, max_tokens) for p in prompts]
        assert all(r == ("length", None) for r in reasons)
    outs, _, _, _ = run_spec([list(range(1, 31))], SamplingParams(max_tokens=100), k=4, max_model_len=37)
    assert outs == [reference(list(range(1, 31)), 7)]


def test_a_stop_inside_the_drafts_drops_the_rest():
    prompts = make_prompts(8, seed=5)
    plain = [reference(p, 30) for p in prompts]
    # Stop on each request's 6th plain token: the step that emits it may carry accepted drafts after it.
    for p, want in zip(prompts, plain):
        stop = want[5]
        outs, reasons, _, _ = run_spec([p], SamplingParams(max_tokens=30, stop_token_ids=[stop]), k=4)
        cut = want.index(stop) + 1
        assert outs == [want[:cut]]
        assert reasons == [("stop", stop)]
    # min_tokens: a stop token before min_tokens does not stop, even when it arrives as a draft.
    p, want = prompts[0], plain[0]
    outs, _, _, _ = run_spec([p], SamplingParams(max_tokens=30, stop_token_ids=[want[1]], min_tokens=3), k=4)
    later = [i for i, t in enumerate(want) if t == want[1] and i >= 3]
    assert outs == [want[: later[0] + 1] if later else want]
