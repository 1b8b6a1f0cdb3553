"""Request and response models of Cohere's embed API as vLLM serves it (POST /v2/embed; vLLM's
pooling/embed/protocol.py CohereEmbedRequest / CohereEmbedResponse; https://docs.cohere.com/reference/embed).

vLLM takes the embedding types float, binary, ubinary and base64 (Cohere's int8 / uint8 are not
among them) and answers `embeddings` with only the requested types, `texts` only for a texts request.
"""

from __future__ import annotations

import builtins
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_serializer

from fdcli_engine.entrypoints.openai.protocol import MAX_STR, _Request
from fdcli_engine.entrypoints.openai.protocol_pooling import MAX_INPUTS

CohereEmbeddingType = Literal["float", "binary", "ubinary", "base64"]
Text = Annotated[str, Field(max_length=MAX_STR)]


class CohereEmbedContent(_Request):
    type: Literal["text", "image_url"]
    text: str | None = Field(default=None, max_length=MAX_STR)
    image_url: dict[str, str] | None = None  # {"url": ...}


class CohereEmbedInput(_Request):
    content: list[CohereEmbedContent] = Field(max_length=256)


class CohereEmbedRequest(_Request):
    model: str | None = Field(default=None, max_length=512)
    input_type: str | None = Field(default=None, max_length=256)
    texts: list[Text] | None = Field(default=None, max_length=MAX_INPUTS)
    images: list[Annotated[str, Field(max_length=MAX_STR)]] | None = Field(
        default=None, max_length=MAX_INPUTS
    )
    inputs: list[CohereEmbedInput] | None = Field(default=None, max_length=MAX_INPUTS)
    output_dimension: int | None = Field(default=None, ge=1, le=1 << 16)
    embedding_types: list[CohereEmbeddingType] | None = Field(default=None, max_length=8)
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: int | None = Field(default=None, ge=1, le=1 << 20)
    priority: int = 0


class _OmitNone(BaseModel):
    """Serialized without its unset (None) fields, as vLLM dumps these (exclude_none)."""

    @model_serializer(mode="wrap")
    def _omit_none(self, handler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class CohereEmbedByType(_OmitNone):
    # The field `float` shadows the builtin inside the class: annotations name builtins.float.
    float: list[list[builtins.float]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class CohereApiVersion(BaseModel):
    version: str = "2"


class CohereBilledUnits(BaseModel):
    input_tokens: int = 0
    image_tokens: int = 0


class CohereMeta(BaseModel):
    api_version: CohereApiVersion = Field(default_factory=CohereApiVersion)
    billed_units: CohereBilledUnits


class CohereEmbedResponse(_OmitNone):
    id: str
    embeddings: CohereEmbedByType
    texts: list[str] | None = None
    meta: CohereMeta
    response_type: Literal["embeddings_by_type"] = "embeddings_by_type"
