"""Streamed chunks are built without pydantic (stream_chunks.py); the protocol models stay the reference:
every chunk must be byte for byte what `model_dump_json(exclude_none=True)` of the model writes."""

from __future__ import annotations

import json

import pytest

from fdcli_engine.entrypoints.openai.protocol import (
    ChatCompletionChunk,
    ChatLogprobs,
    ChatStreamChoice,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    DeltaMessage,
    DeltaToolCall,
    PromptTokensDetails,
    TopLogprob,
    UsageInfo,
)
from fdcli_engine.entrypoints.openai.stream_chunks import (
    ChunkWriter,
    chat_choice,
    chat_delta,
    completion_choice,
    with_token_fields,
)

RID, MODEL, CREATED = 'cmpl-"quoted"\\id', "SmolLM2 ünïcode", 1_700_000_000
TEXTS = ["", " hello", 'a "quote" \\ back\nslash\ttab', "ünïcödé 漢字 🙂", "\x00\x1f\u2028"]
USAGE = UsageInfo(
    prompt_tokens=5, completion_tokens=7, total_tokens=12, prompt_tokens_details=PromptTokensDetails()
)
COMPLETION_LPS = CompletionLogprobs(
    text_offset=[0, 3],
    token_logprobs=[-0.1234567890123, -9999.0],
    tokens=[" he", "llo"],
    top_logprobs=[{" he": -0.1234567890123, " ha": -2.5}, {"llo": -1e-9}],
)
CHAT_LPS = ChatLogprobs(
    content=[
        ChatTokenLogprob(
            token="hé",
            logprob=-0.5,
            bytes=list("hé".encode()),
            top_logprobs=[TopLogprob(token="hé", logprob=-0.5)],
        )
    ]
)


def _sse(model) -> str:
    return f"data: {model.model_dump_json(exclude_none=True)}\n\n"


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"token_ids": [1, 49151]},
        {"finish_reason": "stop", "stop_reason": "</s>"},
        {"finish_reason": "length", "stop_reason": 2, "token_ids": []},
        {"logprobs": COMPLETION_LPS},
        # return_token_ids: FastDeploy's fields with vLLM's (completion_token_ids repeats token_ids).
        {"token_ids": [4], "prompt_token_ids": [1, 2], "prompt_tokens": "hé", "completion_tokens": "x"},
        {"token_ids": [4, 5], "completion_tokens": "xy", "finish_reason": "stop"},
    ],
)
def test_completion_chunk_equals_the_pydantic_model(text, extra):
    writer = ChunkWriter(RID, "text_completion", MODEL, CREATED)
    fields = dict(extra)
    if "token_ids" in extra:
        fields["completion_token_ids"] = extra["token_ids"]
    want = _sse(
        CompletionResponse(
            id=RID, model=MODEL, created=CREATED, choices=[CompletionChoice(index=3, text=text, **fields)]
        )
    )
    assert writer.chunk([completion_choice(3, text, **extra)]) == want
    json.loads(want[6:])  # and it is JSON


def test_completion_usage_chunk_equals_the_pydantic_model():
    writer = ChunkWriter(RID, "text_completion", MODEL, CREATED)
    want = _sse(CompletionResponse(id=RID, model=MODEL, created=CREATED, choices=[], usage=USAGE))
    assert writer.chunk([], USAGE) == want


CALLS = [
    DeltaToolCall(index=0, id="call_1", type="function", function={"name": "f", "arguments": '{"a": 1}'})
]


@pytest.mark.parametrize(
    "delta",
    [
        {"role": "assistant", "content": ""},
        {},
        {"content": TEXTS[2]},
        {"content": TEXTS[3], "reasoning_content": "hmm"},
        {"reasoning_content": ""},
        {"tool_calls": CALLS},
    ],
)
@pytest.mark.parametrize(
    "extra",
    [{}, {"finish_reason": "tool_calls"}, {"logprobs": CHAT_LPS, "token_ids": [5, 6]}, {"token_ids": []}],
)
def test_chat_chunk_equals_the_pydantic_model(delta, extra):
    writer = ChunkWriter(RID, "chat.completion.chunk", MODEL, CREATED)
    choice = ChatStreamChoice(index=1, delta=DeltaMessage(**delta), **extra)
    want = _sse(ChatCompletionChunk(id=RID, model=MODEL, created=CREATED, choices=[choice]))
    assert writer.chunk([chat_choice(1, chat_delta(**delta), **extra)]) == want


@pytest.mark.parametrize(
    "delta,ids",
    [
        ({"role": "assistant", "content": ""}, {"prompt_token_ids": [1, 2], "prompt_tokens": "<s>hé"}),
        (
            {"content": TEXTS[3], "reasoning_content": "hm"},
            {"completion_token_ids": [7], "completion_tokens": "x"},
        ),
        ({"tool_calls": CALLS}, {"completion_token_ids": [], "completion_tokens": ""}),
        ({}, {"completion_token_ids": [8, 9], "completion_tokens": TEXTS[2]}),
    ],
)
def test_chat_chunk_with_fastdeploy_token_fields_equals_the_pydantic_model(delta, ids):
    writer = ChunkWriter(RID, "chat.completion.chunk", MODEL, CREATED)
    choice = ChatStreamChoice(index=0, delta=DeltaMessage(**delta, **ids), token_ids=[8])
    want = _sse(ChatCompletionChunk(id=RID, model=MODEL, created=CREATED, choices=[choice]))
    assert (
        writer.chunk([chat_choice(0, with_token_fields(chat_delta(**delta), **ids), token_ids=[8])]) == want
    )


def test_chat_usage_chunk_and_default_created():
    writer = ChunkWriter(RID, "chat.completion.chunk", MODEL)
    got = json.loads(writer.chunk([], USAGE)[6:])
    want = ChatCompletionChunk(id=RID, model=MODEL, choices=[], usage=USAGE).model_dump(exclude_none=True)
    assert abs(got.pop("created") - want.pop("created")) <= 1
    assert got == want
