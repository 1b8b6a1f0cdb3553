"""Request and response models of the OpenAI-compatible API (pydantic, every numeric field bounded).

Request fields, three kinds (docs/request-fields.md):
- what fd does: declared with their bounds and honoured;
- documented OpenAI / vLLM / FastDeploy fields that cannot apply here (`store`, `service_tier`,
  `mm_processor_kwargs` on a text model, ...): declared as `Ignored` (any value, no effect);
- anything else: kept by pydantic as an extra (extra="allow", nested models too) and reported by
  request_fields.unknown_fields, which the HTTP app logs and names in the `fd-ignored-fields` header,
  or refuses with OpenAI's 400 under --strict-request-fields.
Bounds here are the static ones; limits that depend on the model (context length, vocabulary) are
checked by the serving layer. The body-size cap bounds the ignored and unknown fields.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt

from fdcli_engine.sampling_params import MAX_LOGPROBS, MAX_N

MAX_PROMPTS = 64  # prompts in one /v1/completions request
MAX_MESSAGES = 512
MAX_TOKENS_LIMIT = 1 << 20
MAX_STR = 1 << 20  # characters in one string field
MAX_STOP_TOKEN_IDS = 64
MAX_BAD_WORDS = 64
TOKEN_ID = Annotated[int, Field(ge=0, le=(1 << 31) - 1)]
SEED = Annotated[int, Field(ge=-(1 << 63), le=(1 << 64) - 1)]
StopStr = Annotated[str, Field(min_length=1, max_length=1024)]


class _Request(BaseModel):
    """Base of every request model: unknown keys are kept as extras (see the module docstring)."""

    model_config = ConfigDict(extra="allow")


_Strict = _Request  # the former name, still imported by the pooling (and other) request modules

# A documented field fd accepts and ignores (it cannot apply here); named in docs/request-fields.md.
Ignored = Any

# reasoning_effort (chat) and reasoning.effort (/v1/responses): the values of OpenAI's ReasoningEffort
# and vLLM's chat field. fd hands the value to the chat template (a template variable, as vLLM does),
# which is where models such as gpt-oss read it.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: every chunk carries the usage so far
    include_obfuscation: Ignored = None  # OpenAI's padding against side channels


class JsonSchemaFormat(_Request):
    """OpenAI's response_format.json_schema: the schema is the `schema` key (an alias: pydantic's
    BaseModel has a `schema` attribute)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str | None = Field(default=None, max_length=256)
    description: str | None = Field(default=None, max_length=MAX_STR)
    json_schema: Any = Field(default=None, alias="schema")
    strict: bool | None = None  # fd always enforces the schema (strict or not)


class ResponseFormat(_Request):
    """OpenAI's text | json_object | json_schema, and vLLM's structural_tag (its other keys, e.g.
    `structures` and `triggers`, are the tag's definition)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    structures: Any = None  # structural_tag (vLLM's legacy form), with triggers
    triggers: Any = None
    format: Any = None  # structural_tag, xgrammar's form: refused by the guidance backend, naming it


class _SamplingFields(_Request):
    """Fields shared by completions and chat (OpenAI's plus the fd/FastDeploy extras)."""

    model: str | None = Field(default=None, max_length=512)
    n: int = Field(default=1, ge=1, le=MAX_N)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=1 << 20)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: SEED | None = None
    stop: StopStr | list[StopStr] | None = Field(default=None)
    stop_token_ids: list[TOKEN_ID] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    min_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS_LIMIT)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    # vLLM's beam search: `n` beams, ranked by cumulative logprob / length ** length_penalty (beam_jobs.py).
    use_beam_search: bool = False
    length_penalty: float = Field(default=1.0, ge=-10.0, le=10.0)
    skip_special_tokens: bool = True
    return_token_ids: bool = False
    # vLLM's: logprobs name each token "token_id:N"; None: the server's --return-tokens-as-token-ids
    return_tokens_as_token_ids: bool | None = None
    bad_words: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None, max_length=MAX_BAD_WORDS
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)
    request_id: str | None = Field(default=None, max_length=128)
    # FastDeploy: tokens per streamed chunk (the first token of each choice is always sent alone).
    max_streaming_response_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    # vLLM: keep only the last k prompt tokens (-1: the last max_model_len - 1).
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=MAX_TOKENS_LIMIT)
    # OpenAI's `metadata` tags (no effect here) and FastDeploy's older option channel, of which chat
    # reads enable_thinking and max_streaming_response_tokens (fastdeploy_fields.apply_chat_metadata);
    # vLLM's scheduling priority: no effect (fd schedules first come, first served).
    metadata: Ignored = None
    priority: Ignored = None
    # FastDeploy's / vLLM's image-processor options (min_pixels, max_pixels, image_size...): passed to
    # the model's processor for a request with images, which refuses a key it does not know.
    mm_processor_kwargs: dict[str, Any] | None = Field(default=None, max_length=64)
    # vLLM's prefix-cache isolation: requests with different salts never share cached blocks.
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    # vLLM's prefill/decode hand-off, set by `fd router` (kv_transfer/pd/params.py checks it).
    kv_transfer_params: dict | None = None
    # FastDeploy: token ids never to generate (each a one-token bad word).
    bad_words_token_ids: list[TOKEN_ID] | None = Field(default=None, max_length=1024)
    # FastDeploy's logprob post-processing (by the temperature / over the top-p set): fd's logprobs
    # are raw, so true is a 400 where it would change them (fastdeploy_fields.py).
    temp_scaled_logprobs: bool = False
    top_p_normalized_logprobs: bool = False
    # FastDeploy fields that cannot apply here (docs/request-fields.md): speculative decoding's draft
    # logprobs, undecoded logprob tokens, custom logits processors' arguments, image-cache keys,
    # tracing and metrics collection, splitwise hand-off (fd router sends kv_transfer_params).
    include_draft_logprobs: Ignored = None
    include_logprobs_decode_token: Ignored = None
    logits_processors_args: Ignored = None
    mm_hashes: Ignored = None
    trace_context: Ignored = None
    collect_metrics: Ignored = None
    disaggregate_info: Ignored = None
    # ---- structured outputs (vLLM's and FastDeploy's forms; OpenAI's response_format below): any
    # JSON here, checked and mapped onto one StructuredOutputsParams by structured_outputs.py, whose
    # 400s name the field. guided_decoding_backend / guided_whitespace_pattern are options, not
    # constraints (docs/structured-outputs.md says what is honoured).
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structural_tag: Any = None
    structured_outputs: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    response_format: ResponseFormat | None = None
    # ---- end of structured outputs


PromptTokens = Annotated[list[TOKEN_ID], Field(min_length=1, max_length=MAX_TOKENS_LIMIT)]


def prompt_list_shape(max_prompts: int, noun: str = "prompts"):
    """A before-check for a prompt field of the form text | [text] | ids | [ids]: it reads the form
    from the first item and refuses a list too long for it, or mixed, before pydantic tries each form
    item by item (a million empty strings would otherwise cost seconds of errors on the event loop)."""

    def check(value: Any) -> Any:
        if not isinstance(value, list) or not value:
            return value
        first = value[0]
        if isinstance(first, int) and not isinstance(first, bool):
            if len(value) > MAX_TOKENS_LIMIT or not all(type(t) is int for t in value):
                raise ValueError(f"token ids must be a list of at most {MAX_TOKENS_LIMIT} integers")
        elif len(value) > max_prompts:
            raise ValueError(f"at most {max_prompts} {noun} in one request, got {len(value)}")
        return value

    return BeforeValidator(check)


class CompletionRequest(_SamplingFields):
    prompt: Annotated[
        Annotated[str, Field(max_length=MAX_STR)]
        | Annotated[
            list[Annotated[str, Field(max_length=MAX_STR)]], Field(min_length=1, max_length=MAX_PROMPTS)
        ]
        | PromptTokens
        | Annotated[list[PromptTokens], Field(min_length=1, max_length=MAX_PROMPTS)],
        prompt_list_shape(MAX_PROMPTS),
    ]
    # 0 only with echo (lm-evaluation-harness's loglikelihood requests): the prompt and nothing more.
    max_tokens: int | None = Field(default=16, ge=0, le=MAX_TOKENS_LIMIT)
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)
    # OpenAI's text (refused) or FastDeploy's option object (fastdeploy_fields.apply_completion_suffix_options).
    suffix: (
        Annotated[str, Field(max_length=MAX_STR)] | Annotated[dict[str, Any], Field(max_length=64)] | None
    ) = None
    # logit_bias / prompt_logprobs: OpenAI's token-id-string keys (SamplingParams checks them); vLLM's
    # prompt_logprobs (echo with logprobs implies it).
    logit_bias: dict[str, float] | None = None
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # FastDeploy: token ids (one prompt, or one list per prompt) that replace `prompt`.
    prompt_token_ids: (
        PromptTokens | Annotated[list[PromptTokens], Field(min_length=1, max_length=MAX_PROMPTS)] | None
    ) = None
    # vLLM's reasoning cap, as on chat (the server's --reasoning-parser says where the block lies).
    thinking_token_budget: StrictInt | None = None


class ContentPart(BaseModel):
    """Any part type parses; the serving layer rejects non-text parts with a clear message."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(max_length=64)
    text: str | None = Field(default=None, max_length=MAX_STR)


class FunctionCall(_Request):
    name: str = Field(min_length=1, max_length=256)
    arguments: str = Field(max_length=MAX_STR)  # a JSON object as text (the OpenAI wire format)


class ToolCall(_Request):
    """A tool call: in an assistant message of the request, and in a response message."""

    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: (
        Annotated[str, Field(max_length=MAX_STR)] | Annotated[list[ContentPart], Field(max_length=256)] | None
    ) = None  # an assistant message that only calls tools has none
    name: str | None = Field(default=None, max_length=256)
    reasoning_content: str | None = Field(default=None, max_length=MAX_STR)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128)
    tool_call_id: str | None = Field(default=None, max_length=256)
    # What `resp.choices[0].message.model_dump()` carries back in an assistant message: ignored (the
    # last four are FastDeploy's return_token_ids fields, fastdeploy_fields.py).
    refusal: Ignored = None
    annotations: Ignored = None
    audio: Ignored = None
    function_call: Ignored = None
    prompt_token_ids: Ignored = None
    completion_token_ids: Ignored = None
    prompt_tokens: Ignored = None
    completion_tokens: Ignored = None


class FunctionDefinition(_Request):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = Field(default=None, max_length=MAX_STR)
    parameters: dict[str, Any] | None = None  # a JSON Schema object
    strict: bool | None = None


class ChatTool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class ChatCompletionRequest(_SamplingFields):
    # May be empty only with prompt_token_ids (checked by the serving layer, as FastDeploy does).
    messages: list[ChatMessage] = Field(max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    chat_template: str | None = Field(default=None, max_length=1 << 16)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[ChatTool] | None = Field(default=None, max_length=128)
    # Checked by the serving layer (serving_tools.py), which says which choices are supported.
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # logit_bias / prompt_logprobs: as on CompletionRequest.
    logit_bias: dict[str, float] | None = None
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # vLLM / FastDeploy extensions that work (serving_chat.py).
    add_special_tokens: bool = False  # vLLM: add BOS etc. when tokenizing the rendered prompt
    documents: list[dict[str, Any]] | None = Field(default=None, max_length=1024)  # to the template
    disable_chat_template: bool = False  # FastDeploy: the first message's content is the raw prompt
    # vLLM: the answer starts with the last message's text when the answer continues that message's role.
    echo: bool = False
    prompt_token_ids: list[TOKEN_ID] | None = Field(default=None, max_length=MAX_TOKENS_LIMIT)
    # FastDeploy: ids the answer already has (a generation resumed), appended to the prompt's.
    completion_token_ids: list[TOKEN_ID] | None = Field(default=None, max_length=MAX_TOKENS_LIMIT)
    # vLLM: the chat template's `reasoning_effort`, and `enable_thinking` (unless chat_template_kwargs
    # sets it) false for "none", true otherwise (serving_chat.template_kwargs).
    reasoning_effort: ReasoningEffort | None = None
    # The reasoning budget (reasoning_budget.py; the server's --reasoning-parser says where the block
    # lies): FastDeploy's reasoning_max_tokens and vLLM's thinking_token_budget cap the reasoning,
    # FastDeploy's response_max_tokens the answer after it. Integers only; SamplingParams bounds them.
    reasoning_max_tokens: StrictInt | None = None
    thinking_token_budget: StrictInt | None = None
    response_max_tokens: StrictInt | None = None
    # OpenAI fields that cannot apply here (no storage, tiers, audio, web search, predicted outputs) and
    # the deprecated `functions` / `function_call` (use tools / tool_choice): ignored.
    store: Ignored = None
    service_tier: Ignored = None
    prompt_cache_key: Ignored = None
    prompt_cache_options: Ignored = None
    prompt_cache_retention: Ignored = None
    safety_identifier: Ignored = None
    modalities: Ignored = None
    prediction: Ignored = None
    verbosity: Ignored = None
    audio: Ignored = None
    web_search_options: Ignored = None
    moderation: Ignored = None
    functions: Ignored = None
    function_call: Ignored = None


class TokenizeRequest(_Request):
    model: str | None = Field(default=None, max_length=512)
    prompt: str | None = Field(default=None, max_length=MAX_STR)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=MAX_MESSAGES)
    tools: list[ChatTool] | None = Field(default=None, max_length=128)  # rendered with messages
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False  # vLLM's: also each token's vocabulary string


class DetokenizeRequest(_Request):
    model: str | None = Field(default=None, max_length=512)
    tokens: list[TOKEN_ID] = Field(max_length=MAX_TOKENS_LIMIT)


# ---------------- responses ----------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    # Chat under a --reasoning-parser: the tokens inside the reasoning blocks (reasoning_budget.py).
    completion_tokens_details: CompletionTokensDetails | None = None


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """One entry of vLLM's prompt_logprobs: {token id: PromptLogprob} per prompt position."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobsOut = list[dict[int, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    prompt_logprobs: PromptLogprobsOut | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    # FastDeploy's return_token_ids fields (vLLM's are the two above): the generated ids again, the
    # prompt's text and the generated text (docs/request-fields.md).
    completion_token_ids: list[int] | None = None
    prompt_tokens: str | None = None
    completion_tokens: str | None = None


def _now() -> int:
    return int(time.time())


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    # FastDeploy's return_token_ids fields: the prompt's and the output's ids, the rendered prompt
    # and the model's raw output text (before reasoning and tool-call parsing).
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    prompt_tokens: str | None = None
    completion_tokens: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobsOut | None = None


class DeltaToolCall(BaseModel):
    """A part of a tool call in a stream: `index` says which call of the choice it is; the first part of
    a call has its id, type and name, later ones argument fragments only (serving_tools.py)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str] | None = None  # {"name": ..., "arguments": ...}


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    # FastDeploy's return_token_ids fields (as on ChatResponseMessage): the prompt's on the role
    # delta, the output's on each delta that carries new tokens.
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    prompt_tokens: str | None = None
    completion_tokens: str | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "fd"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None  # with return_token_strs (vLLM's): the vocabulary strings


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
