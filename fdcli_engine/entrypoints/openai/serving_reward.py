"""/v1/chat/reward (alias /v1/reward): the conversation rendered with the chat template, scored by the
model's reward / classification head. Framework-free, shared with `fd run-batch`."""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.protocol_pooling import (
    ChatRewardRequest,
    PoolingUsage,
    RewardData,
    RewardResponse,
)
from fdcli_engine.entrypoints.openai.serving_common import check_model, random_id
from fdcli_engine.entrypoints.openai.serving_embedding import PoolingServing
from fdcli_engine.pooling.postprocess import postprocess


class OpenAIServingReward(PoolingServing):
    route = "/v1/chat/reward"
    task_ok = ("classify", "reward", "process_reward")

    async def create_reward(self, req: ChatRewardRequest, request_id: str | None = None) -> RewardResponse:
        model = check_model(req.model, self.served_model_names)
        pc = self.pooler_config()
        ids, features = await self.render_messages(req, self.limit(req.truncate_prompt_tokens))
        rid = request_id or req.request_id or random_id("reward")
        (raw,) = await self.pool_all([ids], rid, mm_features=features)
        scores = postprocess(raw, pc)
        if scores.ndim == 2 and scores.shape[1] == 1:
            scores = scores[:, 0]  # one label per token / step: a flat list of scores
        data = [RewardData(index=0, score=scores.tolist())]
        n = len(ids)
        return RewardResponse(
            id=rid, model=model, data=data, usage=PoolingUsage(prompt_tokens=n, total_tokens=n)
        )
