"""Request and response models of the pooling routes: /v1/embeddings, /v1/chat/reward (/v1/reward) and
vLLM's generic /pooling.

One EmbeddingRequest model covers OpenAI's EmbeddingCompletionRequest form (`input`) and vLLM's
EmbeddingChatRequest form (`messages`); the serving layer insists on exactly one of them.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from fdcli_engine.entrypoints.openai.protocol import (
    MAX_MESSAGES,
    MAX_STR,
    TOKEN_ID,
    ChatMessage,
    Ignored,
    _Request,
    prompt_list_shape,
)

MAX_INPUTS = 2048  # inputs in one embeddings request (OpenAI's limit)
MAX_INPUT_TOKENS = 1 << 17  # token ids in one input given as ids (the model's limit is checked later)

TextInput = Annotated[str, Field(max_length=MAX_STR)]
IdsInput = Annotated[list[TOKEN_ID], Field(max_length=MAX_INPUT_TOKENS)]


class _ChatFields(_Request):
    messages: list[ChatMessage] | None = Field(default=None, max_length=MAX_MESSAGES)
    chat_template: str | None = Field(default=None, max_length=1 << 16)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = False  # an embedding/reward reads the conversation, it does not answer
    continue_final_message: bool = False
    # Accepted, no effect: FastDeploy's metadata. Its mm_processor_kwargs go to the image processor
    # of a request with images (as on chat).
    metadata: Ignored = None
    mm_processor_kwargs: dict[str, Any] | None = Field(default=None, max_length=64)


class PromptRequest(_ChatFields):
    """The prompt of a pooling request: `input` (OpenAI's forms) or `messages` (vLLM's chat form)."""

    model: str | None = Field(default=None, max_length=512)
    input: Annotated[
        TextInput
        | Annotated[list[TextInput], Field(max_length=MAX_INPUTS)]
        | IdsInput
        | Annotated[list[IdsInput], Field(max_length=MAX_INPUTS)]
        | None,
        prompt_list_shape(MAX_INPUTS, "inputs"),
    ] = None
    # -1: keep the first max-model-len tokens; k > 0: keep the first k (special tokens kept at the ends).
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=1 << 20)
    # vLLM's: which end truncate_prompt_tokens cuts, "right" (the default) keeps the first tokens,
    # "left" the last.
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: bool = True
    user: str | None = Field(default=None, max_length=256)
    request_id: str | None = Field(default=None, max_length=256)


class EmbeddingRequest(PromptRequest):
    # bytes / bytes_only: vLLM's binary body (pooling/encoding.py PoolingBytes).
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    # vLLM's: the dtype and byte order of base64 and bytes output (no effect on float output).
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"
    dimensions: int | None = Field(default=None, ge=1, le=1 << 16)
    normalize: bool | None = None


# vLLM's PoolingTask names of what a pooler computes: one vector (embed, classify) or one per token.
PoolingTask = Literal["embed", "classify", "token_embed", "token_classify"]


class PoolingRequest(EmbeddingRequest):
    """vLLM's /pooling body: the embeddings request (either form) plus `task`. fd's pooler is fixed per
    model at start (--pooler-config), so `task` may only be omitted or name what it computes."""

    task: PoolingTask | None = None


class ActivationFields(_Request):
    """vLLM's ClassifyRequestMixin (classify, score, rerank): False gives a classification head's
    raw logits. `softmax` and `activation` are vLLM's deprecated names of `use_activation`."""

    use_activation: bool | None = None
    softmax: bool | None = None
    activation: bool | None = None

    @property
    def activated(self) -> bool:
        """vLLM's get_use_activation: the first of use_activation, softmax, activation that is set."""
        given = [v for v in (self.use_activation, self.softmax, self.activation) if v is not None]
        return given[0] if given else True


class ClassificationRequest(PromptRequest, ActivationFields):
    """vLLM's /classify body (ClassificationCompletionRequest / ClassificationChatRequest)."""


class ChatRewardRequest(_ChatFields):
    model: str | None = Field(default=None, max_length=512)
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=1 << 20)
    user: str | None = Field(default=None, max_length=256)
    request_id: str | None = Field(default=None, max_length=256)


class PoolingUsage(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0


class EmbeddingData(BaseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | list[list[float]] | str  # str: base64 of float32 little-endian


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[EmbeddingData]
    usage: PoolingUsage


class RewardData(BaseModel):
    index: int
    object: Literal["reward"] = "reward"
    # One score per label (classification / reward head), per token (ALL) or per step tag (STEP).
    score: list[float] | list[list[float]]


class RewardResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[RewardData]
    usage: PoolingUsage


class PoolingData(BaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    # The pooler's output: one vector, one row per token / step tag, or base64 of its float32 bytes.
    data: list[float] | list[list[float]] | str


class PoolingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[PoolingData]
    usage: PoolingUsage


class ClassificationData(BaseModel):
    index: int
    label: str | None  # config.json's id2label of the most probable class
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ClassificationData]
    usage: PoolingUsage
