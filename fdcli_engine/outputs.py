"""What the engine hands back: token-level core outputs and detokenized request outputs. Leaf module."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import msgspec


class EngineCoreEventType(enum.IntEnum):
    """What happened to a request in the engine core (vLLM's vllm/v1/engine EngineCoreEventType)."""

    QUEUED = 1  # the scheduler took the request into its waiting queue
    SCHEDULED = 2  # the scheduler admitted it into a step (again after each preemption)
    PREEMPTED = 3  # the scheduler freed its blocks; it waits to be recomputed


class EngineCoreEvent(msgspec.Struct, array_like=True):
    """One event of a request, stamped with the core's time.monotonic(): on one machine the front end's
    clock too (Linux CLOCK_MONOTONIC is system-wide), so intervals across the two are meaningful."""

    type: EngineCoreEventType
    timestamp: float


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """One step's news for one request, token-level. Crosses the ZMQ socket as msgpack."""

    req_id: str
    new_token_ids: list[int]
    # Per new token: [(token_id, logprob, rank), ...] with the sampled token first, then the top-k
    # (ranks 1..k); rank is 1 + the number of tokens more likely, as vLLM's.
    new_logprobs: list[list[tuple[int, float, int]]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    # The core's time.monotonic() when the step that made this output ended (vLLM's
    # EngineCoreOutputs.timestamp): the time of new_token_ids; 0.0: not stamped. Ahead of the rarer
    # fields, since an array_like struct sends every field up to its last non-default one.
    timestamp: float = 0.0
    pooled: list | None = None  # pooling runner: the pooled vector (or per-token/per-step scores)
    # Once, with the first sampled token of a request with prompt_logprobs: per prompt position from the
    # second, [(token_id, logprob, rank), ...] with the prompt token first, then the top-k.
    prompt_logprobs: list[list[tuple[int, float, int]]] | None = None
    # The request's events since its previous output, in order (None: none).
    events: list[EngineCoreEvent] | None = None


@dataclass
class Logprob:
    token_id: int
    logprob: float
    decoded: str = ""
    rank: int | None = None  # 1 + the number of tokens more likely

    @property
    def decoded_token(self) -> str:  # vLLM's name
        return self.decoded


# vLLM's shape of RequestOutput.prompt_logprobs: None for the first prompt token (nothing predicts
# it), then {token_id: Logprob} per position, the prompt token's entry first.
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # One entry per generated token: {token_id: Logprob}, sampled token first.
    logprobs: list[dict[int, Logprob]] | None = None
    # Text and tokens added since the previous RequestOutput of this request (streaming).
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    # vLLM's: the sum of the sampled tokens' logprobs so far (the whole output, whatever the output
    # kind); None when the request did not ask for logprobs. Last, so positional construction holds.
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Times of one request (time.monotonic() seconds). `arrival_time`, `first_token_time` and
    `finished_time` are the front end's (when it took the request, handed out its first token, made
    its finished output); the `*_ts` fields are the engine core's (vLLM's RequestStateStats names;
    0.0 until it happened): when the scheduler queued it, first admitted it into a step (a preemption
    does not move it), and when the steps that brought its first and last tokens ended."""

    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0
    # Seconds between consecutive engine steps that brought this request tokens, after the first
    # (vLLM's inter-token latency: one value per step, however many tokens the step brought); they
    # add up to decode_time.
    inter_token_latencies: list[float] = field(default_factory=list)
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0

    # vLLM's per-request intervals (vllm/v1/metrics/stats.py FinishedRequestStats); None where the
    # request never reached the event that starts or ends one (scheduled, or its first token).
    @property
    def queued_time(self) -> float | None:
        """First scheduled − queued: the wait in the engine's queue."""
        return self.scheduled_ts - self.queued_ts if self.scheduled_ts else None

    @property
    def prefill_time(self) -> float | None:
        """First token − first scheduled (a preemption during prefill counts in it)."""
        return self.first_token_ts - self.scheduled_ts if self.first_token_ts and self.scheduled_ts else None

    @property
    def decode_time(self) -> float | None:
        """Last token − first token."""
        return self.last_token_ts - self.first_token_ts if self.first_token_ts else None

    @property
    def inference_time(self) -> float | None:
        """Last token − first scheduled: prefill_time + decode_time."""
        return self.last_token_ts - self.scheduled_ts if self.first_token_ts and self.scheduled_ts else None


@dataclass
class RequestOutput:
    """One sequence's news. What `outputs[0]` holds (everything so far, or only the delta, or the
    whole result once) is the request's `SamplingParams.output_kind`. A pooling request yields one
    output, finished, with `pooled` set and an empty completion."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None  # set on the finished output of a generated sequence
    pooled: list | None = None  # pooling requests: the pooled vector (or per-token/per-step scores)
    prompt_logprobs: PromptLogprobs | None = None  # SamplingParams.prompt_logprobs set: vLLM's shape


# The offline LLM's pooling results, named and shaped as vLLM's (vllm/outputs.py), with numpy where
# vLLM has torch: `llm.encode` -> PoolingRequestOutput(.outputs.data), `llm.embed` ->
# EmbeddingRequestOutput(.outputs.embedding), `llm.classify` -> ClassificationRequestOutput
# (.outputs.probs), `llm.score` -> ScoringRequestOutput(.outputs.score).


@dataclass
class PoolingOutput:
    data: Any  # numpy array: the pooled vector (or per-token / per-step scores), post-processed


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float


@dataclass
class PoolingRequestOutput:
    request_id: str
    outputs: Any  # PoolingOutput; the subclasses' own output type
    prompt_token_ids: list[int]
    num_cached_tokens: int = 0
    finished: bool = True


class EmbeddingRequestOutput(PoolingRequestOutput):
    outputs: EmbeddingOutput


class ClassificationRequestOutput(PoolingRequestOutput):
    outputs: ClassificationOutput


class ScoringRequestOutput(PoolingRequestOutput):
    outputs: ScoringOutput
