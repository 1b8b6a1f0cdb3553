"""Per-request sampling over a batch of logits, on the host.

Every row is processed with its own request's parameters, so one request's settings never leak into
another's. The batch goes to the `sample` op in one call: the fused C++ kernel when the native ops are
bound (fdcli_engine.ops), else its numpy reference; both implement fd_kernels/reference/sampler.py, on
rows in the layout of fd_kernels.sampler_layout.

The random numbers stay here: a request with a `seed` draws from its own generator, advanced by a fixed
amount per sampled token (one uniform, or REJECTION_TRIES + 1 with FD_SAMPLING_CLASS=rejection), so its
tokens are the same whatever else is in the batch and however often it was preempted. Log-probs are
those of the model's raw distribution (before logit_bias, penalties and temperature), as vLLM reports
them. A request's `logit_bias` is added to its own row before the sampling op, which then applies
penalties, temperature and the filters on the biased logits.
Structured outputs: a constrained row's grammar mask (runner/grammar_masks.py) comes first, on the same
copy: the tokens it disallows are -inf before logit_bias, the bans and everything else. When the bans
(min_tokens' EOS ban, bad words) would leave such a row nothing, the grammar wins: the row's bans are
lifted, so a finished grammar still ends with EOS (the scheduler then stops it only once min_tokens
tokens are out, the extra tokens being EOS).
The bans (`banned_token_ids`) are the sampler's share of the stop rules described in step_types.
A reasoning budget (fdcli_engine.reasoning_budget) forces a row's token once the budget is spent: on the
same copy, every other token of the row is -inf and its bans are lifted, so the op can only return the
end marker's next token (a row inside the reasoning block has no grammar mask: the constraint starts
after the block).
A step whose rows are all plain greedy (no penalty, ban, logit_bias or grammar mask: decode's usual
batch) skips the op and its per-row tables: each row's token is its first argmax, what the op returns
for such a row. When such a step also wants no logprobs (`argmax_suffices`), the runner asks the model
for the argmax alone (ops.linear_argmax: the LM head's logits never leave the op) and skips this class;
a row whose logits hold a NaN sends the step back here.
"""

from __future__ import annotations

import itertools
import math
import os
from operator import attrgetter

import numpy as np
from fd_kernels.reference import sampler as reference_sampler
from fd_kernels.reference.sampler import log_softmax
from fd_kernels.sampler_layout import META_COLUMNS, PARAM_COLUMNS, MetaRow

from fdcli_engine import ops
from fdcli_engine.errors import ConfigError
from fdcli_engine.reasoning_budget import forced_token
from fdcli_engine.runner.grammar_masks import StepMasks, allowed_rows
from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.step_types import ScheduledRequest

__all__ = [
    "SAMPLING_CLASSES",
    "Sampler",
    "filter_probs",
    "log_softmax",
    "sampling_class_from_env",
    "with_logit_bias",
]

# FastDeploy's FD_SAMPLING_CLASS values: "base" samples the filtered distribution directly; "rejection"
# draws from the whole temperature distribution and accepts tokens inside the top-k/top-p/min-p set
# (FlashInfer-style), falling back to the exact draw. Same distribution either way.
SAMPLING_CLASSES = ("base", "rejection")
REJECTION_TRIES = 4  # draws from the whole distribution before the exact fallback
# A request's params row: PARAM_COLUMNS are SamplingParams field names, read in the layout's order.
_param_row = attrgetter(*PARAM_COLUMNS)


def sampling_class_from_env() -> str:
    name = os.environ.get("FD_SAMPLING_CLASS", "").strip().lower() or "base"
    if name not in SAMPLING_CLASSES:
        raise ConfigError(f"FD_SAMPLING_CLASS={name!r} is not supported: use {' or '.join(SAMPLING_CLASSES)}")
    return name


def filter_probs(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Temperature, top-k, top-p, min-p of one row; returns normalised probabilities (the reference's)."""
    return reference_sampler.filter_probs(row, params.temperature, params.top_k, params.top_p, params.min_p)


def banned_token_ids(params: SamplingParams, output_ids: list[int], eos_ids: set[int]) -> list[int]:
    """Tokens this step must not produce: stop and EOS tokens before min_tokens, and the last token of
    each bad word whose prefix the output ends with."""
    banned: list[int] = []
    if len(output_ids) < params.min_tokens:
        banned.extend(sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else eos_ids)))
    for seq in params.bad_words_token_ids:
        if not seq:
            continue
        prefix = seq[:-1]
        if not prefix or (len(output_ids) >= len(prefix) and output_ids[-len(prefix) :] == prefix):
            banned.append(seq[-1])
    return banned


def with_logit_bias(logits: np.ndarray, reqs: list[ScheduledRequest]) -> np.ndarray:
    """`logits` with each request's logit_bias added to its row; the same array when no row has one
    (the raw logits stay intact for the logprobs)."""
    rows = [(i, sr.sampling_params.logit_bias) for i, sr in enumerate(reqs) if sr.sampling_params.logit_bias]
    if not rows:
        return logits
    biased = logits.copy()
    for i, bias in rows:
        ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        biased[i, ids] += np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
    return biased


def forced_token_of(sr: ScheduledRequest) -> int | None:
    """The token this row must produce under its request's reasoning budget, else None."""
    sp = sr.sampling_params
    budget = sp.reasoning_budget
    if budget is None or sp.reasoning_markers is None:
        return None
    return forced_token(sr.output_token_ids, sp.reasoning_markers, budget)


def _bans_leave_nothing(allowed: np.ndarray, banned: list[int]) -> bool:
    ids = np.unique(np.asarray(banned, dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < allowed.shape[0])]
    return int(allowed.sum()) <= int(allowed[ids].sum())


def _penalized(sp: SamplingParams) -> bool:
    """Whether any penalty (repetition, presence, frequency) applies to the row."""
    return sp.repetition_penalty != 1.0 or bool(sp.presence_penalty) or bool(sp.frequency_penalty)


def _is_plain_greedy(sr: ScheduledRequest, eos_ids: set[int]) -> bool:
    """A greedy row the sampling op would argmax as it is: no penalty, no ban this step, no logit_bias,
    no forced token. Its token is the row's first argmax, drawn from no generator."""
    sp = sr.sampling_params
    return (
        sp.is_greedy
        and not _penalized(sp)
        and not sp.logit_bias
        and not banned_token_ids(sp, sr.output_token_ids, eos_ids)
        and forced_token_of(sr) is None
    )


def _first_argmax(logits: np.ndarray) -> list[int] | None:
    """Each row's first argmax, as the sampling op gives a plain greedy row; None when a row holds a NaN
    (numpy's argmax then points at it; the op's own NaN rule decides those rows)."""
    tokens = logits.argmax(axis=1).tolist()
    # Row by row: one scalar read a row costs less than the vectorised gather and test at decode's
    # batch sizes, where each numpy call runs with cold caches after the step's weights went by.
    for row, token in enumerate(tokens):
        if math.isnan(logits[row, token]):
            return None
    return tokens


class Sampler:
    def __init__(
        self, seed: int = 0, eos_token_ids: set[int] | None = None, sampling_class: str | None = None
    ):
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.request_rngs: dict[str, np.random.Generator] = {}
        self.eos_token_ids = set(eos_token_ids or ())
        self.sampling_class = sampling_class or sampling_class_from_env()
        if self.sampling_class not in SAMPLING_CLASSES:
            raise ConfigError(
                f"sampling class {self.sampling_class!r} is not supported: use base or rejection"
            )
        self.rejection = self.sampling_class == "rejection"
        self.num_uniforms = REJECTION_TRIES + 1 if self.rejection else 1

    def drop(self, req_ids) -> None:
        for rid in req_ids:
            self.request_rngs.pop(rid, None)

    def _rng_for(self, sr: ScheduledRequest) -> np.random.Generator:
        seed = sr.sampling_params.seed
        if seed is None:
            return self.rng
        rng = self.request_rngs.get(sr.req_id)
        if rng is None:
            rng = self.request_rngs[sr.req_id] = np.random.Generator(np.random.PCG64(seed % 2**64))
        return rng

    def _draw(self, rng: np.random.Generator):
        return rng.random() if self.num_uniforms == 1 else rng.random(self.num_uniforms)

    def draw_states(self, reqs: list[ScheduledRequest]) -> dict[str, dict]:
        """Before a step with drafts: the generator state of each seeded, sampled request with drafts
        (runner/spec_decode.py gives back the draws of its rejected rows with `keep_draws`)."""
        return {
            sr.req_id: self._rng_for(sr).bit_generator.state
            for sr in reqs
            if sr.spec_token_ids and sr.sampling_params.seed is not None and not sr.sampling_params.is_greedy
        }

    def keep_draws(self, req_id: str, state: dict, num_rows: int) -> None:
        """Put a request's generator back to `state`, then advanced by the draws of `num_rows` rows."""
        rng = self.request_rngs[req_id]
        rng.bit_generator.state = state
        for _ in range(num_rows):
            self._draw(rng)

    def plain_greedy(self, reqs: list[ScheduledRequest], masks: StepMasks | None = None) -> bool:
        """Whether every row's token is its logits' first argmax (module docstring): no grammar mask in
        the step and every row plain greedy. The fast path's one rule, here and in the runner."""
        return not (masks is not None and masks.rows) and all(
            _is_plain_greedy(sr, self.eos_token_ids) for sr in reqs
        )

    def argmax_suffices(self, reqs: list[ScheduledRequest], masks: StepMasks | None = None) -> bool:
        """Whether the step needs nothing from its logits but each row's first argmax: plain greedy and
        no row asks for logprobs. The runner may then take the tokens from the LM head's fused argmax
        (ops.linear_argmax), which is what `sample` returns for such a step."""
        return self.plain_greedy(reqs, masks) and all(sr.sampling_params.logprobs is None for sr in reqs)

    def sample(
        self, logits: np.ndarray, reqs: list[ScheduledRequest], masks: StepMasks | None = None
    ) -> tuple[list[int], list[list[tuple[int, float]] | None]]:
        n = len(reqs)
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        if self.plain_greedy(reqs, masks):
            tokens = _first_argmax(logits)
            if tokens is not None:
                return tokens, self._all_logprobs(logits, reqs, tokens)
        allowed = {}  # row -> bool [V]: the grammar's allowed tokens
        if masks is not None and masks.rows:
            bits = allowed_rows(masks.bitmask, masks.rows, logits.shape[1])
            allowed = dict(zip(masks.rows, bits))
        params = np.empty((n, len(PARAM_COLUMNS)), dtype=np.float64)
        meta = np.zeros((n, len(META_COLUMNS)), dtype=np.int64)
        uniforms = np.zeros((n, self.num_uniforms), dtype=np.float64)
        chunks: list = []
        offset = 0
        forced: dict[int, int] = {}  # row -> the token its reasoning budget forces
        for i, sr in enumerate(reqs):
            sp = sr.sampling_params
            params[i] = _param_row(sp)
            # Only the ids a penalty reads: the prompt's for repetition, the output's for any penalty.
            prompt = sr.prompt_token_ids if sp.repetition_penalty != 1.0 else ()
            output = sr.output_token_ids if _penalized(sp) else ()
            banned = banned_token_ids(sp, sr.output_token_ids, self.eos_token_ids)
            if banned and i in allowed and _bans_leave_nothing(allowed[i], banned):
                banned = []  # the grammar wins (module docstring)
            token = forced_token_of(sr)
            if token is not None:
                forced[i] = token
                banned = []  # the forced token wins
            meta[i] = MetaRow(
                offset=offset, num_prompt=len(prompt), num_output=len(output), num_banned=len(banned)
            )
            offset += len(prompt) + len(output) + len(banned)
            chunks += (prompt, output, banned)
            if not sp.is_greedy:  # greedy rows draw nothing: their generators stay where they are
                uniforms[i] = self._draw(self._rng_for(sr))
        ids = np.fromiter(itertools.chain.from_iterable(chunks), dtype=np.int64, count=offset)
        biased = logits
        if allowed:
            biased = logits.copy()  # the raw logits stay for the logprobs
            biased[masks.rows] = np.where(bits, biased[masks.rows], np.float32(-np.inf))
        biased = with_logit_bias(biased, reqs)
        if forced:
            biased = biased.copy() if biased is logits else biased
            for i, token in forced.items():
                biased[i] = -np.inf
                biased[i, token] = 0.0
        tokens = ops.sample(biased, params, ids, meta, uniforms, self.rejection).tolist()
        return tokens, self._all_logprobs(logits, reqs, tokens)

    def _all_logprobs(
        self, logits: np.ndarray, reqs, tokens: list[int]
    ) -> list[list[tuple[int, float, int]] | None]:
        all_logprobs: list[list[tuple[int, float, int]] | None] = []
        for i, sr in enumerate(reqs):
            k = sr.sampling_params.logprobs
            all_logprobs.append(None if k is None else self._logprobs(log_softmax(logits[i]), tokens[i], k))
        return all_logprobs

    @staticmethod
    def _logprobs(lp: np.ndarray, tok: int, k: int) -> list[tuple[int, float, int]]:
        """[(sampled id, logprob, rank), (top-1 id, logprob, 1), ..., (top-k id, logprob, k)]: vLLM's
        ranks, 1 + the number of tokens more likely (one compare over the row log_softmax made)."""
        out = [(tok, float(lp[tok]), int(np.count_nonzero(lp > lp[tok])) + 1)]
        if k > 0:
            top = np.argpartition(-lp, k)[:k] if k < lp.shape[0] else np.arange(lp.shape[0])
            top = top[np.argsort(-lp[top], kind="stable")]
            out.extend((int(t), float(lp[t]), r) for r, t in enumerate(top, 1))
        return out
