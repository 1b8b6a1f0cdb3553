"""/classify and /v1/classify (vLLM's classification route), framework-free: a
`*ForSequenceClassification` model's class probabilities per prompt, with the most probable class's
label from config.json's id2label. Prompts take the /v1/embeddings forms (`input` or `messages`)."""

from __future__ import annotations

import numpy as np

from fdcli_engine.entrypoints.openai.protocol_pooling import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
    PoolingUsage,
)
from fdcli_engine.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
from fdcli_engine.pooling.postprocess import class_probs, postprocess


class OpenAIServingClassification(OpenAIServingEmbedding):
    route = "/v1/classify"
    task_ok = ("classify",)

    async def create_classify(
        self, req: ClassificationRequest, request_id: str | None = None
    ) -> ClassificationResponse:
        pc = self.pooler_config()
        model, rid, pools, n = await self.raw_pools(req, request_id, "classify")
        id2label = self.engine.config.hf_config.get("id2label") or {}
        data = []
        for i, raw in enumerate(pools):
            # use_activation false: the head's logits (vLLM's), else sigmoid / softmax probabilities.
            probs = (class_probs(raw, pc) if req.activated else postprocess(raw, pc)).reshape(-1)
            label = id2label.get(str(int(np.argmax(probs))))
            data.append(
                ClassificationData(index=i, label=label, probs=probs.tolist(), num_classes=len(probs))
            )
        return ClassificationResponse(
            id=rid, model=model, data=data, usage=PoolingUsage(prompt_tokens=n, total_tokens=n)
        )
