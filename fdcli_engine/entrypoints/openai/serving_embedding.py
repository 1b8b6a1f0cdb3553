"""/v1/embeddings, framework-free (the server and `fd run-batch` share it), plus the pooling plumbing the
reward route reuses: runner checks, prompt rendering and truncation, concurrent pooled requests.

The engine returns raw pools; normalization, matryoshka truncation and softmax happen here
(fdcli_engine.pooling.postprocess) with the request's own `normalize` / `dimensions`.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from fdcli_engine.entrypoints.openai.chat_images import check_truncation, image_refs
from fdcli_engine.entrypoints.openai.errors import APIError, bad_request
from fdcli_engine.entrypoints.openai.protocol import ChatCompletionRequest
from fdcli_engine.entrypoints.openai.protocol_pooling import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingUsage,
)
from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from fdcli_engine.entrypoints.openai.serving_common import (
    check_model,
    check_prompt,
    encode,
    off_loop,
    random_id,
    truncate_limit,
)
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.pooling.config import PoolerConfig, get_pooler_config
from fdcli_engine.pooling.encoding import (
    BYTES_FORMATS,
    PoolingBytes,
    encode_vector,
    pooling_bytes,
)
from fdcli_engine.pooling.postprocess import check_dimensions, postprocess
from fdcli_engine.pooling.truncation import truncate_ids, truncate_text_ids
from fdcli_engine.pooling_params import PoolingParams

_TASK_NAMES = {
    "embed": "an embedding",
    "classify": "a classification",
    "reward": "a reward",
    "process_reward": "a process-reward",
}


class PoolingServing:
    """What both pooling routes need. `task_ok` names the pooler tasks the route serves."""

    route = "/v1/embeddings"
    task_ok: tuple[str, ...] = ("embed",)

    def __init__(self, engine, served_model_names: list[str], chat: OpenAIServingChat | None = None):
        self.engine = engine
        self.served_model_names = served_model_names
        self.chat = chat or OpenAIServingChat(engine, served_model_names)  # renders with its template

    def pooler_config(self) -> PoolerConfig:
        """The server's pooler settings; a 400 when this route does not fit the model being served."""
        pc = get_pooler_config(self.engine.config)
        if pc is None:
            raise bad_request(
                f"{self.route} needs a pooling model, but this server runs a generative model "
                "(--runner generate); start fd serve with an embedding or reward model",
                "model",
            )
        if pc.task not in self.task_ok:
            other = {"embed": "/v1/embeddings", "classify": "/v1/classify or /v1/chat/reward"}.get(
                pc.task, "/v1/chat/reward"
            )
            kind = _TASK_NAMES.get(pc.task, pc.task)
            raise bad_request(f"this server runs {kind} model: use {other}, not {self.route}", "model")
        return pc

    async def render_messages(self, req, limit: int | None = None) -> tuple[list[int], list | None]:
        """The messages' prompt ids, truncated to `limit`, and their images' features (None without
        images). Image parts are loaded and checked as for chat (chat_images.py)."""
        refs = image_refs(req.messages)
        images = await self.chat.images.load(refs)
        chat_req = ChatCompletionRequest(
            messages=req.messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            chat_template=req.chat_template,
            chat_template_kwargs=req.chat_template_kwargs,
        )
        self.chat.check_request_template(req.chat_template)
        try:
            ids = (await off_loop(self.chat.render, chat_req))[1]
        except InvalidRequestError as e:
            raise bad_request(str(e), e.param or "messages") from None
        features = None
        if images:
            ids, features = await off_loop(
                self.chat.images.expand, ids, images, req.mm_processor_kwargs, refs[0].param
            )
        if limit:
            truncated = truncate_ids(ids, limit, side=getattr(req, "truncation_side", None))
            check_truncation(len(ids), len(truncated), bool(features))
            ids = truncated
        self.check_length(ids, "messages")
        return ids, features

    def limit(self, truncate: int | None, param: str = "truncate_prompt_tokens") -> int | None:
        return truncate_limit(truncate, self.engine.model_config.max_model_len, param)

    def check_length(self, ids: list[int], param: str) -> None:
        check_prompt(ids, None, self.engine.model_config, prompt_param=param, pooling=True)

    async def pool_all(
        self,
        prompts: list[list[int]],
        request_id: str,
        params: list[PoolingParams] | None = None,
        mm_features: list | None = None,
    ) -> list[np.ndarray]:
        """Raw pools of every prompt (with `params[i]`, default PoolingParams()), submitted together so
        the scheduler batches them. If one fails or the caller is cancelled, the others are cancelled
        (their generators abort in the engine). `mm_features`: the images of a single prompt."""
        extra = {"mm_features": mm_features} if mm_features else {}

        async def one(i: int, ids: list[int]):
            rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            final = None
            async for out in self.engine.encode(ids, params[i] if params else PoolingParams(), rid, **extra):
                final = out
            pooled = final.pooled if final is not None else None
            if pooled is None:
                raise APIError("the engine returned no pooled output for this request", 500)
            return np.asarray(pooled, dtype=np.float32)

        tasks = [asyncio.ensure_future(one(i, ids)) for i, ids in enumerate(prompts)]
        try:
            return list(await asyncio.gather(*tasks))
        except InvalidRequestError as e:  # the engine's own check of the request (as final_outputs)
            raise bad_request(str(e), e.param) from None
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class OpenAIServingEmbedding(PoolingServing):
    def prompts(self, req) -> list[list[int]]:
        """The prompts of an `input` request (the messages form: render_messages)."""
        limit = self.limit(req.truncate_prompt_tokens)
        items = req.input
        if isinstance(items, str) or (isinstance(items, list) and items and isinstance(items[0], int)):
            items = [items]
        if not items:
            raise bad_request("input is empty", "input")
        out, tok = [], self.engine.tokenizer
        for i, item in enumerate(items):
            param = "input" if len(items) == 1 else f"input[{i}]"
            if isinstance(item, str):
                if not item:
                    raise bad_request(f"{param} is an empty string", param)
                plain = (lambda item=item: encode(tok, item, False)) if req.add_special_tokens else None
                ids = truncate_text_ids(
                    encode(tok, item, req.add_special_tokens), limit, plain, req.truncation_side
                )
            else:
                ids = truncate_ids(list(item), limit, side=req.truncation_side) if limit else list(item)
            self.check_length(ids, param)
            out.append(ids)
        return out

    async def pooled(self, req: EmbeddingRequest, request_id: str | None, prefix: str):
        """(model, request id, one output array per prompt, prompt tokens) of an `input` or `messages`
        request: /v1/embeddings and /pooling alike. Arrays are post-processed (normalize, dimensions)."""
        check_model(req.model, self.served_model_names)
        pc = self.pooler_config()
        hidden = int(self.engine.config.hf_config.get("hidden_size") or 0)
        try:
            dims = check_dimensions(req.dimensions, pc, hidden)
        except InvalidRequestError as e:
            raise bad_request(str(e), e.param) from None
        model, rid, pools, n = await self.raw_pools(req, request_id, prefix)
        return model, rid, [postprocess(raw, pc, dims, req.normalize) for raw in pools], n

    async def raw_pools(self, req, request_id: str | None, prefix: str):
        """(model, request id, the engine's raw pool of each prompt, prompt tokens) of a request in
        the `input` or `messages` form (EmbeddingRequest's fields of those)."""
        model = check_model(req.model, self.served_model_names)
        self.pooler_config()
        if (req.input is None) == (req.messages is None):
            raise bad_request("give exactly one of input or messages", "input")
        features = None
        if req.messages is not None:
            if not req.messages:
                raise bad_request("messages is empty", "messages")
            ids, features = await self.render_messages(req, self.limit(req.truncate_prompt_tokens))
            prompts = [ids]
        else:
            prompts = self.prompts(req)
        rid = request_id or req.request_id or random_id(prefix)
        pools = await self.pool_all(prompts, rid, mm_features=features)
        return model, rid, pools, sum(len(p) for p in prompts)

    async def create_embedding(
        self, req: EmbeddingRequest, request_id: str | None = None
    ) -> EmbeddingResponse | PoolingBytes:
        model, rid, vectors, n = await self.pooled(req, request_id, "embd")
        if req.encoding_format in BYTES_FORMATS:
            return response_bytes(req, rid, model, vectors, n)
        data = [
            EmbeddingData(
                index=i, embedding=encode_vector(v, req.encoding_format, req.embed_dtype, req.endianness)
            )
            for i, v in enumerate(vectors)
        ]
        return EmbeddingResponse(
            id=rid, model=model, data=data, usage=PoolingUsage(prompt_tokens=n, total_tokens=n)
        )


def response_bytes(req, rid: str, model: str, arrays, n: int):
    """vLLM's `bytes` / `bytes_only` answer of /v1/embeddings and /pooling (the HTTP app sends it as an
    application/octet-stream body)."""
    usage = {"prompt_tokens": n, "total_tokens": n}
    head = {"id": rid, "created": int(time.time()), "model": model, "usage": usage}
    return pooling_bytes(arrays, req.encoding_format, req.embed_dtype, req.endianness, head)
