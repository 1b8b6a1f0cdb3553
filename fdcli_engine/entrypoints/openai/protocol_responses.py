"""Request and response models of POST /v1/responses (OpenAI's Responses API): text and function tools.

The request accepts the fields the `openai` SDK sends for a text conversation; the serving layer
(serving_responses.py) refuses the features fd does not have (built-in tools, stored responses, background
runs) with a 400 that says so. Input items are permissive (`extra="allow"`): an app may send back the
output items of an earlier response as they came, with their `id`, `status` and `annotations`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fdcli_engine.entrypoints.openai.protocol import (
    MAX_MESSAGES,
    MAX_STR,
    MAX_TOKENS_LIMIT,
    JsonSchemaFormat,
    ReasoningEffort,
    _Strict,
)
from fdcli_engine.sampling_params import MAX_LOGPROBS


class InputContentPart(BaseModel):
    """input_text (and output_text, in an assistant item sent back) and input_image (`image_url`: a
    URL string); other types are a 400 later."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(max_length=64)
    text: str | None = Field(default=None, max_length=MAX_STR)
    # An output_text part sent back as it came: its annotations and logprobs say nothing to the model.
    annotations: list | None = Field(default=None, max_length=1024)
    logprobs: list | None = None


class InputItem(BaseModel):
    """A message item: `{"role", "content"}` (EasyInputMessage) or `{"type": "message", ...}`; or a
    reasoning item of an earlier response (`content`: reasoning_text parts, `summary`)."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(default="message", max_length=64)
    id: str | None = Field(default=None, max_length=256)
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    role: Literal["system", "developer", "user", "assistant"] | None = None
    content: (
        Annotated[str, Field(max_length=MAX_STR)]
        | Annotated[list[InputContentPart], Field(max_length=256)]
        | None
    ) = None
    summary: list[InputContentPart] | None = Field(default=None, max_length=256)
    encrypted_content: str | None = Field(default=None, max_length=MAX_STR)
    # function_call (an earlier response's output item) and function_call_output items.
    call_id: str | None = Field(default=None, max_length=256)
    name: str | None = Field(default=None, max_length=256)
    arguments: str | None = Field(default=None, max_length=MAX_STR)
    output: (
        Annotated[str, Field(max_length=MAX_STR)]
        | Annotated[list[InputContentPart], Field(max_length=256)]
        | None
    ) = None


class TextFormat(JsonSchemaFormat):
    """text.format: text, json_object, or json_schema with the chat's json_schema keys (name,
    description, schema, strict) flat beside `type`; other keys are extras (ignored, and said so)."""

    type: str = Field(default="text", max_length=64)

    def echo(self) -> dict:
        """The format as the response object repeats it (OpenAI's shape): the keys fd applies."""
        return self.model_dump(by_alias=True, exclude_none=True, exclude=set(self.model_extra or {}))


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: TextFormat | None = None


class ReasoningConfig(BaseModel):
    """`reasoning`: `effort` goes to the chat template as `reasoning_effort` (vLLM's rule); the other
    keys (`summary`...) are only repeated in the Response."""

    model_config = ConfigDict(extra="allow")
    effort: ReasoningEffort | None = None
    summary: str | None = Field(default=None, max_length=64)
    generate_summary: str | None = Field(default=None, max_length=64)  # OpenAI's older name of summary
    context: str | None = Field(default=None, max_length=64)
    mode: str | None = Field(default=None, max_length=64)


class ResponsesRequest(_Strict):
    model: str | None = Field(default=None, max_length=512)
    input: (
        Annotated[str, Field(max_length=MAX_STR)] | Annotated[list[InputItem], Field(max_length=MAX_MESSAGES)]
    )
    instructions: str | None = Field(default=None, max_length=MAX_STR)
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    text: TextConfig | None = None
    # Function tools ({"type": "function", "name", "description", "parameters", "strict"}) go to the
    # chat path as chat tools; other tool types are refused.
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = Field(default=None, max_length=256)
    background: bool | None = None
    # OpenAI's server-side state fd does not have: refused (vLLM refuses `prompt` too).
    prompt: Any = None
    conversation: Any = None
    reasoning: ReasoningConfig | None = None  # effort: the template's reasoning_effort
    # Accepted and ignored: fd keeps no responses, and these only describe the request (truncation
    # and include are read by the serving layer).
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = Field(default=None, max_length=256)
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = Field(default=None, max_length=32)
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)  # with LOGPROBS_INCLUDE
    service_tier: str | None = Field(default=None, max_length=64)
    prompt_cache_key: str | None = Field(default=None, max_length=256)
    safety_identifier: str | None = Field(default=None, max_length=256)
    request_id: str | None = Field(default=None, max_length=128)
    # vLLM's extra sampling fields (VLLM_SAMPLING_FIELDS): handed as sent to the chat request, whose
    # model checks them (a bad value is a 400 naming the field).
    top_k: Any = None
    repetition_penalty: Any = None
    seed: Any = None
    stop: Any = None
    ignore_eos: Any = None
    logit_bias: Any = None
    skip_special_tokens: Any = None
    include_stop_str_in_output: Any = None
    cache_salt: Any = None
    priority: Any = None
    mm_processor_kwargs: Any = None
    structured_outputs: Any = None


# The fields of vLLM's ResponsesRequest beyond OpenAI's that fd's chat request takes as they are.
VLLM_SAMPLING_FIELDS = (
    "top_k",
    "repetition_penalty",
    "seed",
    "stop",
    "ignore_eos",
    "logit_bias",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "cache_salt",
    "priority",
    "mm_processor_kwargs",
    "structured_outputs",
)


# ---------------- responses ----------------


# The `include` entry that asks for the answer's token logprobs (top_logprobs alternatives each).
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)  # the chat path's token logprobs


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """The text the server's --reasoning-parser splits out, before the message (as vLLM returns it)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list = Field(default_factory=list)
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class FunctionCallItem(BaseModel):
    """A call of one of the request's function tools, read by the server's --tool-call-parser."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """OpenAI's Response object: the non-streamed reply, and the payload of the lifecycle events."""

    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["in_progress", "completed", "incomplete"]
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[ReasoningItem | OutputMessage | FunctionCallItem]
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    store: bool = False  # fd keeps no responses
    background: bool = False
    temperature: float | None = None  # the values sampled with (vLLM's and OpenAI's echo)
    top_p: float | None = None
    text: dict = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    # Repeated from the request as vLLM's ResponsesResponse.from_request does.
    user: str | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str = "auto"
    top_logprobs: int | None = None
