"""What reaches the engine (EngineCoreRequest) and its engine-side state (Request). Leaf module
(imports only the params, limits, prefix hashing, the multi-modal input structs and the core's event
struct)."""

from __future__ import annotations

import enum
import time

import msgspec

from fdcli_engine.multimodal.inputs import MultiModalFeature
from fdcli_engine.outputs import EngineCoreEvent, EngineCoreEventType
from fdcli_engine.pooling_params import PoolingParams
from fdcli_engine.prefix_hash import hash_block_tokens
from fdcli_engine.request_limits import max_output_tokens
from fdcli_engine.sampling_params import SamplingParams


class EngineCoreRequest(msgspec.Struct, tag="add", omit_defaults=True):
    """One request as the front end hands it to the core, in-process or over the socket (where it
    is the `add` message of the core's input union). It carries SamplingParams (generate) or
    PoolingParams (pool); `pooling_params` set means a pooling request."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None = None
    arrival_time: float = 0.0
    pooling_params: PoolingParams | None = None
    # Images: each owns a range of placeholder tokens in prompt_token_ids (multimodal/inputs.py).
    mm_features: list[MultiModalFeature] | None = None

    @property
    def params(self) -> SamplingParams | PoolingParams:
        return self.pooling_params if self.pooling_params is not None else self.sampling_params


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self.value in ("stop", "length", "abort")


class Request:
    """Token-level state of one sequence. `all_token_ids` = prompt + generated tokens; the first
    `num_computed_tokens` of them have K/V in the blocks listed in `block_ids`."""

    def __init__(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams | None,
        max_model_len: int,
        arrival_time: float | None = None,
        pooling_params: PoolingParams | None = None,
        mm_features: list[MultiModalFeature] | None = None,
    ):
        self.req_id = req_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time if arrival_time is not None else time.monotonic()
        self.pooling_params = pooling_params
        # Images, ordered by offset; their placeholder ranges never overlap.
        self.mm_features: list[MultiModalFeature] = sorted(mm_features or [], key=lambda f: f.offset)
        # The prefill/decode hand-off (vLLM's field), read by the PD connector.
        self.kv_transfer_params = sampling_params.kv_transfer_params if sampling_params is not None else None
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        self.block_hashes: list[bytes] = []
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.num_cached_tokens = -1  # prefix-cache hit at first scheduling; -1 until scheduled
        self.num_preemptions = 0
        # Prompt logprobs collected so far (entry j: prompt position j + 1), handed out once with the
        # first sampled token; a recomputed chunk (after preemption) does not add them twice.
        self.prompt_logprobs: list[list[tuple[int, float, int]]] = []
        self.prompt_logprobs_sent = False
        # Speculative decoding: drafts proposed for the next step (verified then, or dropped).
        self.spec_token_ids: list[int] = []
        # Events not yet handed out with an output (vLLM's Request.events).
        self.events: list[EngineCoreEvent] = []
        # The length stop (step_types): check_request has refused what cannot fit; a pooled request
        # generates nothing.
        wanted = 0 if sampling_params is None else sampling_params.max_tokens
        self.max_tokens = max_output_tokens(len(self.prompt_token_ids), wanted, max_model_len)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.sampling_params is not None and self.sampling_params.prompt_logprobs is not None

    def add_prompt_logprobs(self, first_position: int, entries: list) -> None:
        """Entries of prompt positions first_position, first_position + 1, ...; those already held are
        skipped (chunks arrive in order, so positions never leave a gap)."""
        skip = len(self.prompt_logprobs) + 1 - first_position
        if 0 <= skip < len(entries):
            self.prompt_logprobs.extend(entries[skip:])

    def take_prompt_logprobs(self) -> list | None:
        """All prompt logprobs, once (None when not asked for or already taken)."""
        if not self.wants_prompt_logprobs or self.prompt_logprobs_sent:
            return None
        self.prompt_logprobs_sent = True
        out, self.prompt_logprobs = self.prompt_logprobs, []
        return out

    def record_event(self, event_type: EngineCoreEventType, timestamp: float | None = None) -> None:
        self.events.append(EngineCoreEvent(event_type, time.monotonic() if timestamp is None else timestamp))

    def take_events(self) -> list[EngineCoreEvent] | None:
        """The events since the last call, once (None: none)."""
        if not self.events:
            return None
        out, self.events = self.events, []
        return out

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    @property
    def has_mm(self) -> bool:
        return bool(self.mm_features)

    def _block_extra(self, i: int, block_size: int, salt: str | None) -> bytes:
        """What block i's hash covers beside its tokens: the cache salt (first block) and the content
        hash of every image whose placeholder range overlaps the block (placeholder ids are the same
        for every picture, so the tokens alone would let two images share K/V)."""
        parts = [b"s" + salt.encode("utf-8")] if salt and i == 0 else []
        start, end = i * block_size, (i + 1) * block_size
        for f in self.mm_features:
            if f.offset < end and f.end > start:
                parts.append(f"i{f.modality}:{f.content_hash}:{f.offset - start}".encode())
        # tagged ("s" salt, "i" image) and length-prefixed: no salt can pose as an image or run into one
        return b"".join(len(p).to_bytes(4, "little") + p for p in parts)

    def update_block_hashes(self, block_size: int) -> list[bytes]:
        """Extend the chain of hashes to cover every full block of known tokens. The cache salt enters
        the first block's hash, so it separates the whole chain; images enter the blocks they cover."""
        n_full = len(self.all_token_ids) // block_size
        salt = self.sampling_params.cache_salt if self.sampling_params is not None else None
        while len(self.block_hashes) < n_full:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else None
            chunk = self.all_token_ids[i * block_size : (i + 1) * block_size]
            extra = self._block_extra(i, block_size, salt)
            self.block_hashes.append(hash_block_tokens(parent, chunk, extra))
        return self.block_hashes

    def __repr__(self) -> str:
        return (
            f"Request({self.req_id!r}, status={self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_ids})"
        )
