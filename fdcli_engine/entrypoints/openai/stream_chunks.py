"""SSE chunks of streamed completions and chat completions, built without pydantic.

A stream sends a chunk per generated token, so the chunk is the front end's hottest object. Building and
serializing a pydantic response model for each costs an order of magnitude more than this
(docs/engine-measurements.md): a chunk is a prebuilt prefix (id, object, created and model are constant
for a stream) + the choices encoded by msgspec from plain dicts. Invariant (tests/server/test_stream_chunks.py): a chunk is byte for byte the JSON that
`ChatCompletionChunk` / `CompletionResponse(...).model_dump_json(exclude_none=True)` writes — the same
keys in the same order, None fields left out. Keep the dicts' key order that of the protocol models.
"""

from __future__ import annotations

import time

import msgspec
from pydantic import BaseModel


def _enc_hook(obj):
    # Logprobs and tool-call parts arrive as protocol models; they are rare next to plain text deltas.
    if isinstance(obj, BaseModel):
        return obj.model_dump(exclude_none=True)
    raise TypeError(f"cannot encode {type(obj).__name__} in a stream chunk")


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)


def _without_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


class ChunkWriter:
    """The SSE events of one stream: `data: {"id":..,"object":..,"created":..,"model":..,"choices":[..]}`."""

    def __init__(self, request_id: str, object_name: str, model: str, created: int | None = None):
        created = int(time.time()) if created is None else created
        head = {"id": request_id, "object": object_name, "created": created, "model": model}
        # The head's closing brace is replaced by the choices that follow.
        self._prefix = b"data: " + _encoder.encode(head)[:-1] + b',"choices":'

    def chunk(self, choices: list[dict], usage: BaseModel | None = None) -> str:
        """One event; each choice dict in its protocol model's field order (None values are dropped)."""
        body = self._prefix + _encoder.encode([_without_none(c) for c in choices])
        if usage is not None:
            body += b',"usage":' + _encoder.encode(usage)
        return (body + b"}\n\n").decode()


def completion_choice(
    index: int,
    text: str,
    logprobs=None,
    finish_reason=None,
    stop_reason=None,
    token_ids=None,
    prompt_token_ids=None,
    prompt_tokens=None,
    completion_tokens=None,
):
    """A streamed `CompletionChoice`, as a dict in that model's field order. With token ids, FastDeploy's
    completion_token_ids repeats them."""
    d = {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }
    if token_ids is None and prompt_token_ids is None:
        d["token_ids"] = None
        return d
    d["prompt_token_ids"] = prompt_token_ids
    d["token_ids"] = token_ids
    d["completion_token_ids"] = token_ids
    d["prompt_tokens"] = prompt_tokens
    d["completion_tokens"] = completion_tokens
    return d


def chat_delta(role=None, content=None, reasoning_content=None, tool_calls=None) -> dict:
    """A `DeltaMessage` as a dict (None fields dropped; an empty delta is `{}`)."""
    d = {"role": role, "content": content, "reasoning_content": reasoning_content, "tool_calls": tool_calls}
    return _without_none(d)


def with_token_fields(
    delta: dict, prompt_token_ids=None, completion_token_ids=None, prompt_tokens=None, completion_tokens=None
) -> dict:
    """`delta` with FastDeploy's return_token_ids fields added, in `DeltaMessage`'s field order."""
    extra = {
        "prompt_token_ids": prompt_token_ids,
        "completion_token_ids": completion_token_ids,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }
    return {**delta, **_without_none(extra)}


def chat_choice(index: int, delta: dict, logprobs=None, finish_reason=None, token_ids=None) -> dict:
    """A `ChatStreamChoice`, as a dict in that model's field order."""
    return {
        "index": index,
        "delta": delta,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "token_ids": token_ids,
    }
