"""Greedy speculative decoding of a few requests over a target model and a model proposer, without the
engine: the scheduler's and the verifier's parts written plainly, so the proposers are tested before and
apart from the engine wiring. Blocks are handed out shuffled (the block table indirection is always
exercised); a prefix-cache hit is a request starting on another's full blocks; a preemption frees a
request's blocks and recomputes its prompt and output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import paddle

from fdcli_engine.runner.input_batch import build_inputs
from fdcli_engine.runner.kv_cache import allocate_kv_caches
from fdcli_engine.runner.proposer import ProposeInputs
from fdcli_engine.step_types import ScheduledRequest


@dataclass
class Seq:
    prompt: list[int]
    max_tokens: int
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    block_ids: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_tokens


class SpecLoop:
    def __init__(
        self,
        target,
        proposer,
        k: int,
        block_size: int = 4,
        num_blocks: int = 256,
        seed: int = 0,
        after_step=None,
    ):
        """`after_step(loop)` runs after every step; with `loop.accept_all` every draft is taken as
        accepted (the tokens are then no model's greedy ones: for tests of the proposer's own cache)."""
        self.target, self.proposer, self.k, self.block_size = target, proposer, k, block_size
        self.after_step = after_step
        self.accept_all = False
        self.kv = allocate_kv_caches(target, num_blocks, block_size)
        proposer.allocate_kv(num_blocks, block_size, "float32")
        self.free = [int(b) for b in np.random.default_rng(seed).permutation(num_blocks)]
        self.seqs: dict[str, Seq] = {}
        self.num_draft_tokens = 0
        self.num_accepted = 0

    def add(self, rid: str, prompt: list[int], max_tokens: int, share_from: str | None = None) -> None:
        """`share_from`: start on that request's full blocks of the common prefix (a prefix-cache hit)."""
        seq = Seq(list(prompt), max_tokens)
        if share_from is not None:
            other = self.seqs[share_from]
            common = 0
            while (
                common < min(len(prompt) - 1, other.num_computed) and prompt[common] == other.tokens[common]
            ):
                common += 1
            full = common // self.block_size
            seq.block_ids = other.block_ids[:full]
            seq.num_computed = full * self.block_size
        self.seqs[rid] = seq

    def preempt(self, rid: str) -> None:
        seq = self.seqs[rid]
        self.free.extend(seq.block_ids)
        seq.block_ids, seq.num_computed, seq.drafts = [], 0, []

    def step(self, chunk: int | None = None) -> None:
        scheduled = []
        for rid, seq in self.seqs.items():
            if seq.done:
                continue
            todo = seq.tokens[seq.num_computed :]
            if chunk is not None and len(todo) > chunk:
                todo, drafts, do_sample = todo[:chunk], [], False
            else:
                drafts, do_sample = seq.drafts, True
            need = seq.num_computed + len(todo) + len(drafts) + self.k  # + the proposer's lookahead
            while len(seq.block_ids) * self.block_size < need:
                seq.block_ids.append(self.free.pop())
            wanted = min(self.k, seq.max_tokens - len(seq.output) - 1) if do_sample else 0
            scheduled.append(
                ScheduledRequest(
                    req_id=rid,
                    token_ids=todo + drafts,
                    num_computed_tokens=seq.num_computed,
                    block_ids=list(seq.block_ids),
                    sampling_params=None,
                    do_sample=do_sample,
                    output_token_ids=seq.output,
                    prompt_token_ids=seq.prompt,
                    spec_token_ids=list(drafts),
                    num_drafts_wanted=max(wanted, 0),
                )
            )
        inputs = build_inputs(scheduled, self.block_size, mark_prompt_rows=True)
        hidden = self.target.forward(inputs.input_ids, inputs.positions, self.kv, inputs.meta)
        logits = self.target.compute_logits(hidden).numpy()
        starts = inputs.meta.query_start_loc_np
        sampled = {}
        for i, sr in enumerate(scheduled):
            if not sr.do_sample:
                continue
            nd = len(sr.spec_token_ids)
            best = logits[starts[i + 1] - nd - 1 : starts[i + 1]].argmax(axis=-1).tolist()
            produced = []
            for d, t in zip(sr.spec_token_ids, best):
                if d != t and not self.accept_all:
                    break
                produced.append(d)
            produced.append(best[len(produced)])
            self.num_draft_tokens += nd
            self.num_accepted += len(produced) - 1
            sampled[sr.req_id] = produced
        drafts = self.proposer.propose(ProposeInputs(scheduled, inputs, hidden, sampled))
        for sr in scheduled:
            seq = self.seqs[sr.req_id]
            produced = sampled.get(sr.req_id)
            seq.num_computed += sr.num_known_tokens + (len(produced) - 1 if produced else 0)
            if produced:
                seq.output.extend(produced[: seq.max_tokens - len(seq.output)])
            got = drafts.get(sr.req_id, [])
            assert len(got) <= sr.num_drafts_wanted, (sr.req_id, got, sr.num_drafts_wanted)
            seq.drafts = got if produced else []
        if self.after_step is not None:
            self.after_step(self)

    def run(self, chunk: int | None = None, preempt_at: dict[int, str] | None = None) -> dict[str, list[int]]:
        n = 0
        while not all(s.done for s in self.seqs.values()):
            if preempt_at and n in preempt_at:
                self.preempt(preempt_at[n])
            self.step(chunk)
            n += 1
        return {rid: s.output for rid, s in self.seqs.items()}


def paddle_ids(ids) -> paddle.Tensor:
    return paddle.to_tensor(np.asarray(ids, dtype=np.int64))


def plain_greedy(model, prompt: list[int], max_tokens: int, block_size: int = 4) -> list[int]:
    """The target's own greedy tokens, one token per step (the reference of the speculative runs)."""
    from tiny_models import PagedRunner  # noqa: PLC0415

    with paddle.no_grad():
        return PagedRunner(model, block_size=block_size).greedy("s", prompt, max_tokens)


PROMPTS = {
    "a": [5, 17, 42, 99, 3, 250, 7, 128, 64, 311, 12, 45, 200],
    "b": [9, 8, 7, 6, 5, 4, 3],
    "c": [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110],
}
MAX_TOKENS = 10


def run_scenario(target, proposer, k: int, scenario: str, after_step=None, accept_all=False) -> SpecLoop:
    """Scenarios: "chunked": three requests, prompts in chunks of 5 tokens; "prefix": a second request starts on
    the first one's cached blocks; "preempt": a request loses its blocks mid-generation and recomputes."""
    loop = SpecLoop(target, proposer, k, after_step=after_step)
    loop.accept_all = accept_all
    if scenario == "chunked":
        for rid, prompt in PROMPTS.items():
            loop.add(rid, prompt, MAX_TOKENS)
        loop.run(chunk=5)
    elif scenario == "prefix":
        loop.add("a", PROMPTS["a"], MAX_TOKENS)
        loop.step()
        loop.step()
        loop.add("b", PROMPTS["a"][:10] + [77, 78], MAX_TOKENS, share_from="a")
        assert loop.seqs["b"].num_computed == 8
        loop.run()
    elif scenario == "preempt":
        loop.add("a", PROMPTS["a"], MAX_TOKENS)
        loop.add("b", PROMPTS["b"], MAX_TOKENS)
        loop.run(preempt_at={2: "a", 3: "b"})
    else:
        raise ValueError(scenario)
    return loop


SCENARIOS = ("chunked", "prefix", "preempt")
