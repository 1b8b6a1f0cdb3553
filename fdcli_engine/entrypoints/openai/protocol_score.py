"""Request and response models of vLLM's scoring routes: /score and /v1/score (text pairs), /rerank,
/v1/rerank and /v2/rerank (a query against documents, Jina/Cohere style)."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from fdcli_engine.entrypoints.openai.protocol import MAX_STR, _Strict
from fdcli_engine.entrypoints.openai.protocol_pooling import MAX_INPUTS, PoolingUsage

ScoreText = Annotated[str, Field(min_length=1, max_length=MAX_STR)]
ScoreTexts = Annotated[list[ScoreText], Field(min_length=1, max_length=MAX_INPUTS)]


class ScoreRequest(_Strict):
    """text_1 against text_2: one text against each of a list, or two lists of the same length
    zipped (vLLM's rule)."""

    model: str | None = Field(default=None, max_length=512)
    text_1: ScoreText | ScoreTexts
    text_2: ScoreText | ScoreTexts
    # -1: max-model-len; k > 0: each pair (cross-encoder) or text (embedding model) cut to k tokens.
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=1 << 20)
    user: str | None = Field(default=None, max_length=256)
    request_id: str | None = Field(default=None, max_length=256)


class DocumentObject(_Strict):
    """A document given as Cohere's v1 / Jina's object form."""

    text: ScoreText


class RerankRequest(_Strict):
    model: str | None = Field(default=None, max_length=512)
    query: ScoreText
    # Strings, or {"text": ...} objects (Cohere v1, Jina); either way the text is what is scored.
    documents: Annotated[list[ScoreText | DocumentObject], Field(min_length=1, max_length=MAX_INPUTS)]
    top_n: int | None = Field(default=None, ge=0, le=MAX_INPUTS)  # None or 0: every document
    return_documents: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=1 << 20)
    user: str | None = Field(default=None, max_length=256)
    request_id: str | None = Field(default=None, max_length=256)

    @property
    def document_texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreData]
    usage: PoolingUsage


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int  # the document's position in the request
    document: RerankDocument | None = None  # left out when return_documents is false
    relevance_score: float


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: PoolingUsage
    results: list[RerankResult]  # best first
