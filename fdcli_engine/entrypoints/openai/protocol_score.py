"""Request and response models of vLLM's scoring routes: /score and /v1/score (text pairs), /rerank,
/v1/rerank and /v2/rerank (a query against documents, Jina/Cohere style)."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from fdcli_engine.entrypoints.openai.protocol import MAX_STR, _Strict
from fdcli_engine.entrypoints.openai.protocol_pooling import MAX_INPUTS, ActivationFields, PoolingUsage

ScoreText = Annotated[str, Field(min_length=1, max_length=MAX_STR)]
ScoreTexts = Annotated[list[ScoreText], Field(min_length=1, max_length=MAX_INPUTS)]


# vLLM's ScoreRequest forms, tried in its order: (first, second) field names of each.
SCORE_FORMS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))


class ScoreRequest(ActivationFields):
    """One text against each of a list, or two lists of the same length zipped (vLLM's rule). The
    two sides are named as in any of vLLM's forms (SCORE_FORMS); `names` says which one was sent."""

    model: str | None = Field(default=None, max_length=512)
    queries: ScoreText | ScoreTexts | None = None
    documents: ScoreText | ScoreTexts | None = None
    items: ScoreText | ScoreTexts | None = None
    data_1: ScoreText | ScoreTexts | None = None
    data_2: ScoreText | ScoreTexts | None = None
    text_1: ScoreText | ScoreTexts | None = None
    text_2: ScoreText | ScoreTexts | None = None
    # -1: max-model-len; k > 0: each pair (cross-encoder) or text (embedding model) cut to k tokens.
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=1 << 20)
    user: str | None = Field(default=None, max_length=256)
    request_id: str | None = Field(default=None, max_length=256)

    @model_validator(mode="after")
    def _one_form(self):
        sent = [f for f in SCORE_FORMS if getattr(self, f[0]) is not None and getattr(self, f[1]) is not None]
        if not sent:
            forms = ", ".join(f"{a}/{b}" for a, b in SCORE_FORMS)
            raise PydanticCustomError("score_fields", f"give the two sides of the score as one of {forms}")
        given = {n for f in SCORE_FORMS for n in f if getattr(self, n) is not None}
        if given != set(sent[0]):
            raise PydanticCustomError("score_fields", f"give one pair of score fields, not {sorted(given)}")
        return self

    @property
    def names(self) -> tuple[str, str]:
        return next(
            f for f in SCORE_FORMS if getattr(self, f[0]) is not None and getattr(self, f[1]) is not None
        )

    @property
    def sides(self) -> tuple[str | list[str], str | list[str]]:
        a, b = self.names
        return getattr(self, a), getattr(self, b)


class DocumentObject(_Strict):
    """A document given as Cohere's v1 / Jina's object form."""

    text: ScoreText


class RerankRequest(ActivationFields):
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
