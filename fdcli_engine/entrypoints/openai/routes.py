"""The route table: url → request model and serving call, one entry per POST url of the OpenAI API.
`fd serve` registers every route on its FastAPI app (http_app.py); `fd run-batch` serves the lines
whose url is in `BATCH_ROUTES`. Framework-free.

`admitted` routes pass the server's readiness check, admission control (429) and disconnect handling;
the others (tokenizer only) answer at once, even while the model loads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fdcli_engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from fdcli_engine.entrypoints.openai.protocol_cohere import CohereEmbedRequest, CohereEmbedResponse
from fdcli_engine.entrypoints.openai.protocol_pooling import (
    ChatRewardRequest,
    ClassificationRequest,
    ClassificationResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingRequest,
    PoolingResponse,
    RewardResponse,
)
from fdcli_engine.entrypoints.openai.protocol_responses import ResponsesRequest
from fdcli_engine.entrypoints.openai.protocol_score import (
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)


@dataclass(frozen=True)
class Route:
    name: str  # the handler's name (the OpenAPI operation)
    request_model: type  # validates the body
    call: Callable[[Any, Any], Awaitable[Any]]  # (ServingLayer, request) -> response model or SSE stream
    response_model: type | None = None  # None: the response may be a stream
    admitted: bool = True
    in_batch: bool = True  # run-batch serves this url


ROUTES: dict[str, Route] = {
    "/v1/completions": Route(
        "create_completion", CompletionRequest, lambda s, req: s.completion.create_completion(req)
    ),
    "/v1/chat/completions": Route(
        "create_chat_completion", ChatCompletionRequest, lambda s, req: s.chat.create_chat_completion(req)
    ),
    "/tokenize": Route(
        "tokenize",
        TokenizeRequest,
        lambda s, req: s.tokenization.tokenize(req),
        TokenizeResponse,
        admitted=False,
        in_batch=False,
    ),
    "/detokenize": Route(
        "detokenize",
        DetokenizeRequest,
        lambda s, req: s.tokenization.detokenize(req),
        DetokenizeResponse,
        admitted=False,
        in_batch=False,
    ),
    "/v1/embeddings": Route(
        "create_embedding",
        EmbeddingRequest,
        lambda s, req: s.embedding.create_embedding(req),
        EmbeddingResponse,
    ),
    "/pooling": Route(
        "create_pooling", PoolingRequest, lambda s, req: s.pooling.create_pooling(req), PoolingResponse
    ),
    # Cohere's embed API, as vLLM serves it (vLLM's run-batch has no such url).
    "/v2/embed": Route(
        "create_cohere_embedding",
        CohereEmbedRequest,
        lambda s, req: s.cohere_embed.create_embed(req),
        CohereEmbedResponse,
        in_batch=False,
    ),
    "/v1/chat/reward": Route(
        "create_chat_reward", ChatRewardRequest, lambda s, req: s.reward.create_reward(req), RewardResponse
    ),
    "/v1/reward": Route(
        "create_reward", ChatRewardRequest, lambda s, req: s.reward.create_reward(req), RewardResponse
    ),
    "/v1/responses": Route(
        "create_response", ResponsesRequest, lambda s, req: s.responses.create_response(req)
    ),
}

# vLLM's scoring routes: each url of a family is the same call (its own OpenAPI operation name).
for _url in ("/score", "/v1/score"):
    ROUTES[_url] = Route(
        "create_score" + _url.replace("/", "_").removesuffix("_score"),
        ScoreRequest,
        lambda s, req: s.score.create_score(req),
        ScoreResponse,
    )
for _url in ("/classify", "/v1/classify"):
    ROUTES[_url] = Route(
        "create_classify" + _url.replace("/", "_").removesuffix("_classify"),
        ClassificationRequest,
        lambda s, req: s.classify.create_classify(req),
        ClassificationResponse,
    )
for _url in ("/rerank", "/v1/rerank", "/v2/rerank"):
    ROUTES[_url] = Route(
        "do_rerank" + _url.replace("/", "_").removesuffix("_rerank"),
        RerankRequest,
        lambda s, req: s.score.create_rerank(req),
        RerankResponse,
    )

BATCH_ROUTES: dict[str, Route] = {url: r for url, r in ROUTES.items() if r.in_batch}
