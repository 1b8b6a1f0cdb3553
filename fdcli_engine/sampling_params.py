"""Per-request sampling parameters. Leaf module."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.reasoning_budget import ReasoningMarkers
from fdcli_engine.structured_output.params import StructuredOutputsParams

# Bounds that keep a single request from exhausting the engine; the server reports them as 400s.
MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on each logit_bias value
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_CACHE_SALT = 1024  # characters


# Fields whose None is a value, not "the default": from_optional keeps it.
_NONE_IS_A_VALUE = frozenset({"max_tokens"})


class RequestOutputKind(enum.IntEnum):
    """What each RequestOutput of a request holds (vLLM's names).

    CUMULATIVE: everything so far (text, token ids, logprobs), plus the delta fields; copies the
    request's lists on every step. DELTA: only what is new since the previous output (text, token
    ids, logprobs are the delta); for streaming. FINAL_ONLY: one output, when the request finishes,
    with the whole text; for non-streaming callers."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top log-probabilities per sampled token (0: only the sampled one)
    # vLLM's meaning: for each prompt position after the first, the logprob of the prompt token there and
    # the top-k (0: only the prompt token). Such a request skips the prefix cache (its rows are needed).
    prompt_logprobs: int | None = None
    # token id -> value added to that token's logit before penalties, temperature and top-k/top-p
    # (OpenAI's logit_bias; -100 bans a token, +100 all but forces it). Reported logprobs stay raw.
    logit_bias: dict[int, float] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    bad_words: list[str] = field(default_factory=list)
    # Filled by the front end from bad_words once the tokenizer is known.
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # vLLM's prefix-cache isolation: requests with different salts (or one with and one without) never
    # share cached blocks; the salt is mixed into the hash of the first block (request.py).
    cache_salt: str | None = None
    # The constraint on the output (JSON schema, regex, choice, grammar...); the runner masks the logits
    # to what its grammar allows next (runner/grammar_masks.py).
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's prefill/decode hand-off asked by the router (kv_transfer/pd/params.py): where a prefill
    # instance sends the prompt's KV, or which transfer a decode instance waits for.
    kv_transfer_params: dict | None = None
    # vLLM's legacy field: V1 removed best-of-n ranking, and fd never had it. Accepted when it equals
    # n (the same outputs), as fd's /v1/completions does; anything else is refused naming n.
    best_of: int | None = None
    # The reasoning budget (reasoning_budget.py): FastDeploy's reasoning_max_tokens and vLLM's
    # thinking_token_budget are one cap under two names (-1: none, vLLM's); FastDeploy's
    # response_max_tokens caps the answer after the reasoning block.
    reasoning_max_tokens: int | None = None
    thinking_token_budget: int | None = None
    response_max_tokens: int | None = None
    # Filled by the front end from its reasoning parser and the prompt: where the block lies in the
    # output. None: no reasoning block is coming, so the whole output is the answer.
    reasoning_markers: ReasoningMarkers | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias(self.logit_bias)
        if self.thinking_token_budget == -1 and not isinstance(self.thinking_token_budget, bool):
            self.thinking_token_budget = None  # vLLM's "unlimited"
        self.validate()

    @classmethod
    def from_optional(cls, **fields) -> SamplingParams:
        """vLLM's constructor for callers holding Optional values (an API request's fields): a field
        given as None takes its default, except where None has a meaning of its own (max_tokens: up
        to the context; seed, logprobs...: off)."""
        defaults = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - set(defaults))
        if unknown:
            raise TypeError(f"SamplingParams.from_optional() got unexpected fields {unknown}")
        kept = {
            name: value
            for name, value in fields.items()
            if value is not None or name in _NONE_IS_A_VALUE or defaults[name].default is None
        }
        return cls(**kept)

    def for_sample(self, index: int) -> SamplingParams:
        """Params of the index-th of `n` parallel samples: n=1 and, when seeded, seed + index, so the
        samples differ yet each stays reproducible."""
        seed = None if self.seed is None else (self.seed + index) % 2**64
        child = dataclasses.replace(self, n=1, seed=seed, best_of=None)
        child.bad_words_token_ids = self.bad_words_token_ids
        return child

    def bad_words_ids(self, encode) -> list[list[int]]:
        """bad_words as the token id sequences the sampler bans (vLLM's update_from_tokenizer): each word
        as written and with a leading space, as it appears mid-sentence; `encode(text)` tokenizes
        without special tokens."""
        return [
            list(ids)
            for w in self.bad_words
            for ids in dict.fromkeys(tuple(encode(v)) for v in (w, " " + w))
            if ids
        ]

    @property
    def reasoning_budget(self) -> int | None:
        """The reasoning cap, under whichever name it was given."""
        if self.reasoning_max_tokens is not None:
            return self.reasoning_max_tokens
        return self.thinking_token_budget

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1

    def validate(self) -> None:
        def bad(msg: str, param: str) -> None:
            raise InvalidRequestError(msg, param=param)

        if not 1 <= self.n <= MAX_N:
            bad(f"n must be between 1 and {MAX_N}, got {self.n}", "n")
        if self.best_of is not None and self.best_of != self.n:
            bad(
                f"best_of={self.best_of} is not supported (as in vLLM V1, no candidates are ranked): "
                f"best_of must equal n; use n={self.best_of} for that many samples",
                "best_of",
            )
        if not 0.0 <= self.temperature <= 2.0:
            bad(f"temperature must be between 0 and 2, got {self.temperature}", "temperature")
        if not 0.0 < self.top_p <= 1.0:
            bad(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k < 0:
            bad(f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}", "top_k")
        if not 0.0 <= self.min_p <= 1.0:
            bad(f"min_p must be between 0 and 1, got {self.min_p}", "min_p")
        if not 0.0 < self.repetition_penalty <= 2.0:
            bad(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}", "repetition_penalty")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                bad(f"{name} must be between -2 and 2, got {getattr(self, name)}", name)
        if self.cache_salt is not None and not 0 < len(self.cache_salt) <= MAX_CACHE_SALT:
            bad(f"cache_salt must have 1 to {MAX_CACHE_SALT} characters", "cache_salt")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad(f"max_tokens must be at least 1, got {self.max_tokens}", "max_tokens")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            bad(f"min_tokens must be between 0 and max_tokens, got {self.min_tokens}", "min_tokens")
        if len(self.stop) > MAX_STOP_STRINGS:
            bad(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(self.stop)}", "stop")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop strings must be non-empty strings", "stop")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            bad(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}", "logprobs")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            bad(
                f"prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {self.prompt_logprobs}",
                "prompt_logprobs",
            )
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            bad("seed must fit in 64 bits", "seed")
        self._validate_budgets(bad)

    def _validate_budgets(self, bad) -> None:
        """FastDeploy's bounds on its two fields (at least 1), vLLM's on its own (0 or more, -1 none)."""
        for name in ("reasoning_max_tokens", "response_max_tokens"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                bad(f"{name} must be an integer of at least 1, got {value!r}", name)
        budget = self.thinking_token_budget
        if budget is not None and (not _is_int(budget) or budget < 0):
            bad(
                f"thinking_token_budget must be a non-negative integer or -1 for unlimited, got {budget!r}",
                "thinking_token_budget",
            )
        if (
            budget is not None
            and self.reasoning_max_tokens is not None
            and budget != self.reasoning_max_tokens
        ):
            bad(
                "reasoning_max_tokens (FastDeploy's name) and thinking_token_budget (vLLM's) are the same "
                "cap: send one of them",
                "thinking_token_budget",
            )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _logit_bias(bias) -> dict[int, float]:
    """{token id: bias} from OpenAI's {"id as text": value}; ids must be integers >= 0, values within
    +-MAX_LOGIT_BIAS (the vocabulary bound is the engine's check: request_limits)."""
    if not isinstance(bias, dict):
        raise InvalidRequestError("logit_bias must map token ids to numbers", param="logit_bias")
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise InvalidRequestError(
            f"logit_bias may hold at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(bias)}",
            param="logit_bias",
        )
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            tid = int(key) if not isinstance(key, bool) else None
        except (TypeError, ValueError):
            tid = None
        if tid is None or tid < 0 or (isinstance(key, str) and key.strip() != str(tid)):
            raise InvalidRequestError(
                f"logit_bias keys must be token ids (non-negative integers), got {key!r}", param="logit_bias"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidRequestError(f"logit_bias values must be numbers, got {value!r}", param="logit_bias")
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise InvalidRequestError(
                f"logit_bias values must be between -100 and 100, got {value} for token {tid}",
                param="logit_bias",
            )
        out[tid] = float(value)
    return out
