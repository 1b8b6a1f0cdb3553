"""HTTP routes of the pooling API, registered on the server's FastAPI app by `build_app`:
POST /v1/embeddings, /v1/chat/reward and its alias /v1/reward. Thin like the rest of the adapter: the
serving classes hold the logic; `run` (build_app's) adds readiness, admission and disconnect handling.

The raw engine client is used, not the metrics wrapper: pooling requests produce no tokens, so the
TTFT/TPOT histograms would only be skewed by them.
"""

from __future__ import annotations

from fastapi import FastAPI, Request

from fdcli_engine.entrypoints.openai.protocol_pooling import (
    ChatRewardRequest,
    EmbeddingRequest,
    EmbeddingResponse,
    RewardResponse,
)
from fdcli_engine.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
from fdcli_engine.entrypoints.openai.serving_reward import OpenAIServingReward


def add_pooling_routes(app: FastAPI, engine, names: list[str], args, run, error_responses: dict) -> None:
    options = {
        "chat_template": getattr(args, "chat_template", None),
        "allow_request_chat_template": bool(getattr(args, "trust_request_chat_template", False)),
    }
    embedding = OpenAIServingEmbedding(engine, names, **options)
    reward = OpenAIServingReward(engine, names, **options)

    @app.post("/v1/embeddings", response_model=EmbeddingResponse, responses=error_responses)
    async def create_embedding(req: EmbeddingRequest, request: Request):
        return await run(request, lambda: embedding.create_embedding(req))

    @app.post("/v1/chat/reward", response_model=RewardResponse, responses=error_responses)
    async def create_chat_reward(req: ChatRewardRequest, request: Request):
        return await run(request, lambda: reward.create_reward(req))

    @app.post("/v1/reward", response_model=RewardResponse, responses=error_responses)
    async def create_reward(req: ChatRewardRequest, request: Request):
        return await run(request, lambda: reward.create_reward(req))
