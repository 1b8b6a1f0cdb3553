"""/pooling, vLLM's generic pooling route, framework-free (the server and `fd run-batch` share it).

It is /v1/embeddings (one implementation: OpenAIServingEmbedding.pooled) for every pooling model fd
serves, answered in vLLM's shape: data[i] = {"index", "object": "pooling", "data": the pooler's output}
(a vector, or one row per token / step tag for ALL / STEP pooling). vLLM picks the pooler per request
with `task`; fd's pooler is fixed at start (--pooler-config), so `task` may be omitted or name what it
computes, and any other task is a 400 saying how to start the server for it. A generative model gets
vLLM's 400 "The model does not support Pooling API".
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.protocol_pooling import (
    PoolingData,
    PoolingRequest,
    PoolingResponse,
    PoolingUsage,
)
from fdcli_engine.entrypoints.openai.serving_embedding import OpenAIServingEmbedding, response_bytes
from fdcli_engine.pooling.config import PoolerConfig, get_pooler_config
from fdcli_engine.pooling.encoding import BYTES_FORMATS, encode_vector

PER_TOKEN = ("ALL", "STEP")  # pooling types with one output row per token (STEP: per step tag)


def pooling_task(pc: PoolerConfig) -> str:
    """vLLM's name of what this pooler computes: embed / classify, token_* when it pools per token."""
    kind = "embed" if pc.task == "embed" else "classify"
    return f"token_{kind}" if pc.pooling_type in PER_TOKEN else kind


class OpenAIServingPooling(OpenAIServingEmbedding):
    route = "/pooling"
    task_ok = ("embed", "classify", "reward", "process_reward")

    def pooler_config(self) -> PoolerConfig:
        if get_pooler_config(self.engine.config) is None:
            raise bad_request(
                "The model does not support Pooling API: this server runs a generative model "
                "(--runner generate); start fd serve with an embedding or reward model",
                "model",
            )
        return super().pooler_config()

    async def create_pooling(self, req: PoolingRequest, request_id: str | None = None) -> PoolingResponse:
        served = pooling_task(self.pooler_config())
        if req.task is not None and req.task != served:
            raise bad_request(
                f"task {req.task!r} is not what this server computes: its pooler gives {served} (fixed at "
                'start by the model and --pooler-config, e.g. \'{"pooling_type": "ALL"}\' for one '
                f"vector per token); omit task or send {served!r}",
                "task",
            )
        model, rid, arrays, n = await self.pooled(req, request_id, "pool")
        if req.encoding_format in BYTES_FORMATS:
            return response_bytes(req, rid, model, arrays, n)
        data = [
            PoolingData(index=i, data=encode_vector(a, req.encoding_format, req.embed_dtype, req.endianness))
            for i, a in enumerate(arrays)
        ]
        return PoolingResponse(
            id=rid, model=model, data=data, usage=PoolingUsage(prompt_tokens=n, total_tokens=n)
        )
