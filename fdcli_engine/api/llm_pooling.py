"""The offline LLM's pooling calls, vLLM's: `embed`, `encode`, `classify`, `score` on a pooling model
(fd's default embedding model all-MiniLM-L6-v2, a cross-encoder, a reward model; docs/pooling.md).

One path with the server's pooling routes: each prompt is a pooling request opened on the same
front end (`EngineFrontEnd.open_request` with PoolingParams, as its `encode`), pooled by the core
in one step, and post-processed by fdcli_engine.pooling.postprocess (normalization, softmax,
cosine, the cross-encoder's sigmoid), with the model's own pooler settings (`--pooler-config`).
"""

from __future__ import annotations

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from fdcli_engine.pooling.config import PoolerConfig, get_pooler_config, num_labels
from fdcli_engine.pooling.postprocess import class_probs, cosine, embedding_options, postprocess
from fdcli_engine.pooling.score_pairs import cross_encoder_input, cross_encoder_score, pair_up
from fdcli_engine.pooling.truncation import truncate_ids, truncate_text_ids
from fdcli_engine.pooling_params import PoolingParams
from fdcli_engine.request_limits import truncate_limit

# Each call -> the pooler tasks (docs/pooling.md) of the models that serve it.
_TASKS = {
    "embed": ("embed",),
    "classify": ("classify",),
    "score": ("embed", "classify"),
    "encode": ("embed", "classify", "reward", "process_reward"),
    "reward": ("reward", "process_reward"),
}


class PoolingMethods:
    """Mixed into LLM, which provides config, client, _finals, _ids, tokenizer, _prompt_ids and
    run_until_done."""

    def _pooler(self, call: str, tasks: tuple[str, ...]) -> PoolerConfig:
        pc = get_pooler_config(self.config)
        if pc is None:
            raise InvalidRequestError(
                f"LLM.{call} needs a pooling model, but this LLM generates text (runner generate); load "
                "an embedding, cross-encoder or reward model (e.g. LLM(model=default_embedding_model_path()))",
                param="model",
            )
        if pc.task not in tasks:
            raise InvalidRequestError(
                f"LLM.{call} is not served by this {pc.task} model (docs/pooling.md names each model's task)",
                param="model",
            )
        return pc

    def _pool(
        self, prompt_ids: list[tuple[list[int], list]], params: list[PoolingParams], use_tqdm: bool
    ) -> list[RequestOutput]:
        """The engine's raw pool of each (ids, image features), as the server's pool_all submits them:
        together, so the scheduler batches them; a refused one leaves none behind."""
        rids: list[str] = []
        try:
            for (ids, features), p in zip(prompt_ids, params):
                rid = f"pool-{next(self._ids)}"
                self.client.open_request(rid, ids, p, self._finals, mm_features=features)
                rids.append(rid)
            done = self.run_until_done(len(rids), use_tqdm)
        finally:
            for rid in rids:
                self.client.abort(rid)
        outs = [done[r] for r in rids]
        for out, (ids, _) in zip(outs, prompt_ids):
            out.prompt_token_ids = list(ids)  # a pooling output carries none (front_end.pooling_output)
        return outs

    def _limit(self, truncate_prompt_tokens: int | None) -> int | None:
        return truncate_limit(truncate_prompt_tokens, self.config.max_model_len)

    def _text_ids(self, text: str, limit: int | None) -> list[int]:
        """A text's ids, cut to `limit` as /v1/embeddings cuts them (the special-token frame kept)."""
        tok = self.tokenizer
        return truncate_text_ids(tok.encode(text), limit, lambda: tok.encode(text, add_special_tokens=False))

    def _pool_prompts(
        self, prompts, pooling_params, use_tqdm: bool, truncate: int | None, pc: PoolerConfig
    ) -> list[tuple[RequestOutput, tuple[int | None, bool | None]]]:
        """Each prompt's raw pool with its (dimensions, normalize) for `postprocess`, checked first."""
        from fdcli_engine.api.prompt_inputs import parse_prompts

        limit = self._limit(truncate)
        parsed = []
        for prompt in parse_prompts(prompts):
            ids, features = self._prompt_ids(prompt)
            if limit and len(ids) > limit:
                if features:  # a cut through an image's rows would leave it half there
                    raise InvalidRequestError(
                        "truncate_prompt_tokens would cut a prompt with images; shorten its text instead",
                        param="truncate_prompt_tokens",
                    )
                ids = (
                    self._text_ids(prompt.text, limit)
                    if prompt.token_ids is None
                    else truncate_ids(ids, limit)
                )
            parsed.append((ids, features))
        params = _params_list(pooling_params, len(parsed))
        hidden = int(self.config.hf_config.get("hidden_size") or 0)
        options = [embedding_options(p, pc, hidden) for p in params]
        return list(zip(self._pool(parsed, params, use_tqdm), options))

    def encode(
        self,
        prompts,
        pooling_params: PoolingParams | list[PoolingParams] | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = False,
        pooling_task: str | None = None,
    ) -> list[PoolingRequestOutput]:
        """vLLM's LLM.encode: each prompt's pooled output (`.outputs.data`, a numpy array), post-processed
        as the model's pooler says (an embedding normalized, a process reward softmaxed)."""
        call = f"encode(pooling_task={pooling_task!r})" if pooling_task else "encode()"
        pc = self._pooler(call, (pooling_task,) if pooling_task else _TASKS["encode"])
        outs = self._pool_prompts(prompts, pooling_params, use_tqdm, truncate_prompt_tokens, pc)
        return [
            _request_output(PoolingRequestOutput, o, PoolingOutput(postprocess(o.pooled, pc, *opts)))
            for o, opts in outs
        ]

    def reward(
        self,
        prompts,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = False,
        pooling_params: PoolingParams | list | None = None,
    ) -> list[PoolingRequestOutput]:
        """vLLM's LLM.reward on a reward model: `.outputs.data`, the scores /v1/chat/reward gives
        (one per label, per token under ALL pooling, or per step tag under STEP)."""
        pc = self._pooler("reward()", _TASKS["reward"])
        outs = self._pool_prompts(prompts, pooling_params, use_tqdm, truncate_prompt_tokens, pc)
        return [
            _request_output(PoolingRequestOutput, o, PoolingOutput(postprocess(o.pooled, pc)))
            for o, _ in outs
        ]

    def embed(
        self,
        prompts,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = False,
        pooling_params: PoolingParams | list | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """vLLM's LLM.embed: `.outputs.embedding` (a list of floats), as fd serve's /v1/embeddings."""
        pc = self._pooler("embed()", _TASKS["embed"])
        outs = self._pool_prompts(prompts, pooling_params, use_tqdm, truncate_prompt_tokens, pc)
        return [
            _request_output(
                EmbeddingRequestOutput, o, EmbeddingOutput(postprocess(o.pooled, pc, *opts).tolist())
            )
            for o, opts in outs
        ]

    def classify(
        self,
        prompts,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = False,
        pooling_params: PoolingParams | list | None = None,
    ) -> list[ClassificationRequestOutput]:
        """vLLM's LLM.classify on a `*ForSequenceClassification` model: `.outputs.probs`, one per label
        (sigmoid of a single label, else softmax; postprocess.class_probs)."""
        pc = self._pooler("classify()", _TASKS["classify"])
        outs = self._pool_prompts(prompts, pooling_params, use_tqdm, truncate_prompt_tokens, pc)
        return [
            _request_output(
                ClassificationRequestOutput,
                o,
                ClassificationOutput(class_probs(o.pooled, pc).reshape(-1).tolist()),
            )
            for o, _ in outs
        ]

    def score(
        self,
        data_1: str | list[str],
        data_2: str | list[str],
        /,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = False,
    ) -> list[ScoringRequestOutput]:
        """vLLM's LLM.score, as fd serve's /v1/score: one text against each of `data_2`, or two lists
        of one length zipped. A one-label cross-encoder reads each pair as one sequence (score: the
        sigmoid of its logit); an embedding model embeds the texts apart (score: their cosine)."""
        pc = self._pooler("score()", _TASKS["score"])
        first, second = _texts(data_1, "data_1"), _texts(data_2, "data_2")
        pairs = pair_up(first, second, ("data_1", "data_2"), param="data_2")
        limit = self._limit(truncate_prompt_tokens)
        if pc.task == "embed":
            return self._cosine_scores(pairs, pc, use_tqdm, limit)
        labels = num_labels(self.config.hf_config)
        if labels != 1:
            raise InvalidRequestError(
                f"this classification model has {labels} labels, a cross-encoder has one: use "
                "LLM.classify for its label probabilities",
                param="model",
            )
        prompt_ids, params = [], []
        for a, b in pairs:
            ids, p = cross_encoder_input(self.tokenizer, a, b, limit)
            prompt_ids.append((ids, []))
            params.append(p)
        outs = self._pool(prompt_ids, params, use_tqdm)
        return [
            _request_output(ScoringRequestOutput, o, ScoringOutput(cross_encoder_score(o.pooled, pc)))
            for o in outs
        ]

    def _cosine_scores(self, pairs, pc: PoolerConfig, use_tqdm: bool, limit) -> list[ScoringRequestOutput]:
        texts = list(dict.fromkeys(t for pair in pairs for t in pair))  # each distinct text embedded once
        outs = self._pool(
            [(self._text_ids(t, limit), []) for t in texts], [PoolingParams()] * len(texts), use_tqdm
        )
        vectors = {t: postprocess(o.pooled, pc) for t, o in zip(texts, outs)}
        by_text = dict(zip(texts, outs))
        return [
            ScoringRequestOutput(  # vLLM's ids and tokens of an embedding pair: both texts'
                request_id=f"{by_text[a].request_id}_{by_text[b].request_id}",
                outputs=ScoringOutput(cosine(vectors[a], vectors[b])),
                prompt_token_ids=list(by_text[a].prompt_token_ids) + list(by_text[b].prompt_token_ids),
            )
            for a, b in pairs
        ]


def _params_list(pooling_params, count: int) -> list[PoolingParams]:
    if pooling_params is None:
        return [PoolingParams()] * count
    if isinstance(pooling_params, PoolingParams):
        return [pooling_params] * count
    plist = list(pooling_params)
    if len(plist) != count:
        raise ValueError(f"{count} prompts but {len(plist)} pooling params")
    return plist


def _texts(data, param: str) -> list[str]:
    texts = [data] if isinstance(data, str) else list(data) if isinstance(data, (list, tuple)) else None
    if not texts or any(not isinstance(t, str) or not t for t in texts):
        raise InvalidRequestError(f"{param} must be a non-empty string or a list of them", param=param)
    return texts


def _request_output(cls, out: RequestOutput, value) -> PoolingRequestOutput:
    return cls(
        request_id=out.request_id,
        outputs=value,
        prompt_token_ids=list(out.prompt_token_ids),
        num_cached_tokens=out.num_cached_tokens,
        finished=out.finished,
    )
