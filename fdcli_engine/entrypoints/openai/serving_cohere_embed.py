"""POST /v2/embed: Cohere's embed API as vLLM serves it, framework-free. A request becomes the
/v1/embeddings request vLLM builds for it (EmbedIOProcessor._pre_process_cohere_online) and goes down
that one path (OpenAIServingEmbedding.pooled): texts as one batched `input`, each image or mixed
`inputs` item as its own `messages` conversation.

- `input_type` selects a text prefix from the model's `task_instructions` or its sentence-transformers
  `prompts`; a model with neither refuses any input_type (a 400), as vLLM does.
- `truncate`: END (default) keeps the first tokens, START the last, both within `max_tokens` (else
  the model's length); NONE cuts nothing, and an input over `max_tokens` is a 400.
- `output_dimension` is /v1/embeddings' `dimensions`; `embedding_types` (default float) picks the
  answer's forms (pooling/embedding_types.py).
"""

from __future__ import annotations

import asyncio

from pydantic import ValidationError

from fdcli_engine.entrypoints.openai.errors import APIError, bad_request
from fdcli_engine.entrypoints.openai.protocol_cohere import (
    CohereBilledUnits,
    CohereEmbedByType,
    CohereEmbedInput,
    CohereEmbedRequest,
    CohereEmbedResponse,
    CohereMeta,
)
from fdcli_engine.entrypoints.openai.protocol_pooling import EmbeddingRequest
from fdcli_engine.entrypoints.openai.serving_common import random_id
from fdcli_engine.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
from fdcli_engine.entrypoints.openai.validation import validation_error
from fdcli_engine.pooling.config import input_type_prompts
from fdcli_engine.pooling.embedding_types import typed_embeddings

_FORMS = ("texts", "images", "inputs")


class CohereServingEmbedding:
    def __init__(self, embedding: OpenAIServingEmbedding):
        self.embedding = embedding
        self._prompts: dict[str, str] | None | bool = False  # read on first use: False = not yet

    def prompts(self) -> dict[str, str] | None:
        if self._prompts is False:
            config = self.embedding.engine.config
            self._prompts = input_type_prompts(
                getattr(config, "hf_config", None) or {}, getattr(config, "model_path", None)
            )
        return self._prompts

    def prefix(self, input_type: str | None) -> str:
        """The text prefix of `input_type` ("" for none); a 400 when the model does not define it."""
        if input_type is None:
            return ""
        prompts = self.prompts()
        if prompts is None:
            raise bad_request(
                f"Unsupported input_type {input_type!r}: this model defines no input_type task "
                "instructions (task_instructions in its config, or sentence-transformers prompts); "
                "leave input_type out",
                "input_type",
            )
        if input_type not in prompts:
            raise bad_request(
                f"Unsupported input_type {input_type!r}. Supported values: {', '.join(sorted(prompts))}",
                "input_type",
            )
        return prompts[input_type]

    async def create_embed(
        self, req: CohereEmbedRequest, request_id: str | None = None
    ) -> CohereEmbedResponse:
        given = [f for f in _FORMS if getattr(req, f) is not None]
        if len(given) != 1:
            raise bad_request(
                "give one of texts, images or inputs"
                + (f", not {' and '.join(given)} together" if given else ""),
                given[-1] if given else "texts",
            )
        form = given[0]
        if not getattr(req, form):
            raise bad_request(f"{form} is empty", form)
        prefix = self.prefix(req.input_type)
        embedding_types = req.embedding_types or ["float"]
        rid = request_id or random_id("embd")
        try:
            if form == "texts":
                proxies = [self._proxy(req, input=[prefix + t for t in req.texts])]
            elif form == "images":
                proxies = [self._proxy(req, messages=[_image_message(url)]) for url in req.images]
            else:
                proxies = [self._proxy(req, messages=[_mixed_message(item, prefix)]) for item in req.inputs]
        except ValidationError as e:  # what the embeddings request refuses (an image part without url)
            raise _in_cohere_terms(validation_error(e.errors()), form, len(req.texts or ())) from None
        try:
            if req.truncate == "NONE" and req.max_tokens is not None:
                self._check_max_tokens(req, proxies)
            results = await asyncio.gather(
                *(
                    self.embedding.pooled(p, rid if len(proxies) == 1 else f"{rid}-{i}", "embd")
                    for i, p in enumerate(proxies)
                )
            )
        except APIError as e:
            raise _in_cohere_terms(e, form, len(proxies[0].input or ())) from None
        vectors = [v for _, _, vs, _ in results for v in vs]
        tokens = sum(n for *_, n in results)
        try:
            typed = typed_embeddings(vectors, list(embedding_types))
        except ValueError as e:
            raise bad_request(str(e), "embedding_types") from None
        image_tokens = tokens if form == "images" else 0
        return CohereEmbedResponse(
            id=rid,
            embeddings=CohereEmbedByType(**typed),
            texts=list(req.texts) if form == "texts" else None,
            meta=CohereMeta(
                billed_units=CohereBilledUnits(input_tokens=tokens - image_tokens, image_tokens=image_tokens)
            ),
        )

    def _proxy(self, req: CohereEmbedRequest, **prompt) -> EmbeddingRequest:
        """The /v1/embeddings request vLLM makes of `req` for one prompt form."""
        keep, side = None, None
        if req.truncate != "NONE":
            keep = req.max_tokens if req.max_tokens is not None else -1
            side = "left" if req.truncate == "START" else "right"
        return EmbeddingRequest(
            model=req.model,
            dimensions=req.output_dimension,
            truncate_prompt_tokens=keep,
            truncation_side=side,
            **prompt,
        )

    def _check_max_tokens(self, req: CohereEmbedRequest, proxies: list[EmbeddingRequest]) -> None:
        """truncate NONE with max_tokens: an input longer than max_tokens is refused, not cut."""
        for p in proxies:
            if p.input is None:
                continue  # images / inputs: checked against the model's length only
            for i, ids in enumerate(self.embedding.prompts(p)):
                if len(ids) > req.max_tokens:
                    raise bad_request(
                        f"texts[{i}] is {len(ids)} tokens, over max_tokens={req.max_tokens} with "
                        "truncate NONE; send truncate END or START to cut it",
                        "max_tokens",
                    )


# /v1/embeddings' field names in the errors of the request made for it, and Cohere's for them.
_PARAMS = {"dimensions": "output_dimension", "truncate_prompt_tokens": "max_tokens"}


def _in_cohere_terms(e: APIError, form: str, num_texts: int) -> APIError:
    """An error about the /v1/embeddings request made of a Cohere request, naming the Cohere fields."""
    param = e.param
    if param is not None and param.startswith("input"):
        # a single input is named "input"; Cohere's texts is always a list
        name = "texts" + (param[len("input") :] or ("[0]" if num_texts == 1 else ""))
        e.message = e.message.replace(param, name, 1)
        param = name
    elif param is not None and param.startswith("messages"):
        param = form
    elif param is not None:
        param = _PARAMS.get(param, param)
    e.param = param
    e.message = e.message.replace("set truncate_prompt_tokens", "send truncate END or START")
    return e


def _image_message(url: str) -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}


def _mixed_message(item: CohereEmbedInput, prefix: str) -> dict:
    """One `inputs` item as a user message: its text parts (each after the input_type prefix) and
    images, in order."""
    parts = []
    for c in item.content:
        if c.type == "text" and c.text is not None:
            parts.append({"type": "text", "text": prefix + c.text})
        elif c.type == "image_url" and c.image_url is not None:
            parts.append({"type": "image_url", "image_url": {"url": c.image_url.get("url", "")}})
    return {"role": "user", "content": parts}
