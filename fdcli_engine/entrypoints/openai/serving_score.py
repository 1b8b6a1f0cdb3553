"""/score, /v1/score and /rerank, /v1/rerank, /v2/rerank (vLLM's scoring routes), framework-free.

Two kinds of model score a pair (a, b), as in vLLM:
- a cross-encoder (`*ForSequenceClassification` with one label) reads the pair as one sequence, the
  tokenizer's pair template applied (BERT: [CLS] a [SEP] b [SEP], b with token type 1; a decoder's
  tokenizer concatenates), and the score is sigmoid(logit): sentence-transformers' CrossEncoder
  default activation for one label, which vLLM applies too;
- an embedding model embeds a and b apart, and the score is their cosine similarity.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.protocol_pooling import PoolingUsage
from fdcli_engine.entrypoints.openai.protocol_score import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from fdcli_engine.entrypoints.openai.serving_common import check_model, encode, random_id
from fdcli_engine.entrypoints.openai.serving_embedding import (
    _TASK_NAMES,
    PoolingServing,
)
from fdcli_engine.pooling.config import PoolerConfig, get_pooler_config, num_labels
from fdcli_engine.pooling.postprocess import cosine, postprocess
from fdcli_engine.pooling.score_pairs import cross_encoder_input, cross_encoder_score, pair_up
from fdcli_engine.pooling.truncation import truncate_text_ids

SCORE_MODELS = "cross-encoders (*ForSequenceClassification with one label) and embedding models"

Pair = tuple[tuple[str, str], tuple[str, str]]  # ((text a, its param), (text b, its param))


class OpenAIServingScore(PoolingServing):
    route = "/v1/score"
    task_ok = ("embed", "classify")

    def pooler_config(self) -> PoolerConfig:
        pc = get_pooler_config(self.engine.config)
        if pc is None or pc.task not in self.task_ok:
            kind = "a generative model" if pc is None else f"{_TASK_NAMES.get(pc.task, pc.task)} model"
            raise bad_request(f"/v1/score and /rerank are served by {SCORE_MODELS}; this server runs {kind}")
        labels = num_labels(self.engine.config.hf_config) if pc.task == "classify" else 1
        if labels != 1:
            raise bad_request(
                f"this classification model has {labels} labels, a cross-encoder has one: "
                "use /v1/chat/reward for its label scores",
                "model",
            )
        return pc

    async def scores(
        self, pairs: list[Pair], request_id: str, truncate: int | None = None, activation: bool = True
    ) -> tuple[list[float], int]:
        """One score per pair, and the prompt tokens the engine read. `activation` false: a
        cross-encoder's logits (a cosine has no activation)."""
        pc = self.pooler_config()
        limit = self.limit(truncate)
        if pc.task == "embed":
            return await self._cosines(pairs, pc, request_id, limit)
        prompts, params = [], []
        for (a, param_a), (b, param_b) in pairs:
            ids, p = cross_encoder_input(self.engine.tokenizer, a, b, limit)
            self.check_length(ids, param_a if len(a) >= len(b) else param_b)  # the likely culprit
            prompts.append(ids)
            params.append(p)
        pools = await self.pool_all(prompts, request_id, params)
        return [cross_encoder_score(raw, pc, activation) for raw in pools], sum(map(len, prompts))

    async def _cosines(self, pairs: list[Pair], pc: PoolerConfig, request_id: str, limit: int | None):
        texts: dict[str, str] = {}  # each distinct text embedded once -> the param named in its errors
        for a, b in pairs:
            for text, param in (a, b):
                texts.setdefault(text, param)
        prompts = []
        tok = self.engine.tokenizer
        for text, param in texts.items():
            # As /v1/embeddings truncates: [CLS] … [SEP] kept.
            ids = truncate_text_ids(encode(tok, text), limit, lambda text=text: encode(tok, text, False))
            self.check_length(ids, param)
            prompts.append(ids)
        pools = await self.pool_all(prompts, request_id)
        vectors = {text: postprocess(raw, pc) for text, raw in zip(texts, pools)}
        return [cosine(vectors[a], vectors[b]) for (a, _), (b, _) in pairs], sum(map(len, prompts))

    async def create_score(self, req: ScoreRequest, request_id: str | None = None) -> ScoreResponse:
        model = check_model(req.model, self.served_model_names)
        (one, other), (first, second) = req.names, req.sides
        pairs = pair_up(_named(first, one), _named(second, other), (one, other), one)
        rid = request_id or req.request_id or random_id("score")
        scores, n = await self.scores(pairs, rid, req.truncate_prompt_tokens, req.activated)
        data = [ScoreData(index=i, score=s) for i, s in enumerate(scores)]
        return ScoreResponse(
            id=rid, model=model, data=data, usage=PoolingUsage(prompt_tokens=n, total_tokens=n)
        )

    async def create_rerank(self, req: RerankRequest, request_id: str | None = None) -> RerankResponse:
        model = check_model(req.model, self.served_model_names)
        texts = req.document_texts
        docs = _named(texts, "documents")
        rid = request_id or req.request_id or random_id("rerank")
        pairs = [((req.query, "query"), d) for d in docs]
        scores, n = await self.scores(pairs, rid, req.truncate_prompt_tokens, req.activated)
        order = sorted(range(len(docs)), key=lambda i: -scores[i])  # stable: ties keep request order
        if req.top_n:
            order = order[: req.top_n]
        results = [
            RerankResult(
                index=i,
                document=RerankDocument(text=texts[i]) if req.return_documents else None,
                relevance_score=scores[i],
            )
            for i in order
        ]
        return RerankResponse(
            id=rid, model=model, results=results, usage=PoolingUsage(prompt_tokens=n, total_tokens=n)
        )


def _named(texts: str | list[str], param: str) -> list[tuple[str, str]]:
    if isinstance(texts, str):
        return [(texts, param)]
    return [(t, f"{param}[{i}]") for i, t in enumerate(texts)]
