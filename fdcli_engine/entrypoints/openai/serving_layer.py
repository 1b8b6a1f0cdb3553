"""The serving layer of one engine: every OpenAI serving object, built once by `build_serving` and
shared by `fd serve` (the FastAPI app maps `routes.ROUTES` onto HTTP) and `fd run-batch` (its
dispatcher calls the same routes without HTTP). Framework-free.

Token metrics (TTFT/TPOT histograms) observe chat and completions only: pooling requests produce no
tokens, so the embedding and reward objects use the raw engine client.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fdcli_engine.entrypoints.openai.chat_images import ImageInputs
from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls
from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from fdcli_engine.entrypoints.openai.serving_classify import OpenAIServingClassification
from fdcli_engine.entrypoints.openai.serving_cohere_embed import CohereServingEmbedding
from fdcli_engine.entrypoints.openai.serving_completion import OpenAIServingCompletion
from fdcli_engine.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions, image_limit, media_policy
from fdcli_engine.entrypoints.openai.serving_pooling import OpenAIServingPooling
from fdcli_engine.entrypoints.openai.serving_responses import OpenAIServingResponses
from fdcli_engine.entrypoints.openai.serving_reward import OpenAIServingReward
from fdcli_engine.entrypoints.openai.serving_score import OpenAIServingScore
from fdcli_engine.entrypoints.openai.serving_tokenize import OpenAIServingTokenization
from fdcli_engine.entrypoints.openai.structured_outputs import StructuredOutputs
from fdcli_engine.entrypoints.openai.tool_parsers import get_tool_parser_cls
from fdcli_engine.multimodal.image_limit import limit_notes

logger = logging.getLogger("fd.serve")


@dataclass(frozen=True)
class ServingLayer:
    engine: object  # the EngineClient every serving object talks to
    served_model_names: list[str]
    completion: OpenAIServingCompletion
    chat: OpenAIServingChat
    embedding: OpenAIServingEmbedding
    pooling: OpenAIServingPooling  # vLLM's /pooling: the embeddings path in its shape
    cohere_embed: CohereServingEmbedding  # /v2/embed: the embeddings path in Cohere's shape
    reward: OpenAIServingReward
    classify: OpenAIServingClassification  # /classify, /v1/classify
    tokenization: OpenAIServingTokenization
    responses: OpenAIServingResponses
    score: OpenAIServingScore  # /score and /rerank


def served_names(engine, options: ServingOptions) -> list[str]:
    """The names the server answers to: --served-model-name's, else the engine's own (the first is the
    one responses and metrics report)."""
    return list(options.served_model_names or [engine.model_config.served_model_name])


def build_serving(engine, options: ServingOptions, metrics=None) -> ServingLayer:
    """The serving objects of `engine`. With `metrics` (the server's ServerMetrics), chat and
    completions report their token timings to it."""
    names = served_names(engine, options)
    generating = engine
    if metrics is not None:
        from fdcli_engine.entrypoints.openai.metrics import ObservedEngine

        generating = ObservedEngine(engine, metrics)
    for note in limit_notes(options.limit_mm_per_prompt):
        logger.warning(note)
    structured = StructuredOutputs(engine)  # one grammar backend (and cache) for chat and completions
    chat = OpenAIServingChat(
        generating,
        names,
        chat_template=options.chat_template,
        reasoning_parser_cls=get_parser_cls(options.reasoning_parser),
        allow_request_chat_template=options.trust_request_chat_template,
        tool_parser_cls=get_tool_parser_cls(options.tool_call_parser),
        structured_outputs=structured,
        images=ImageInputs(engine, media_policy(options), image_limit(options)),
        tokens_as_ids=options.return_tokens_as_token_ids,
        response_role=options.response_role,
        force_include_usage=options.enable_force_include_usage,
    )
    embedding = OpenAIServingEmbedding(engine, names, chat)
    return ServingLayer(
        engine=engine,
        served_model_names=names,
        completion=OpenAIServingCompletion(
            generating,
            names,
            structured,
            tokens_as_ids=options.return_tokens_as_token_ids,
            force_include_usage=options.enable_force_include_usage,
            reasoning_parser_cls=chat.reasoning_parser_cls,
            chat_template=options.chat_template,
        ),
        chat=chat,
        embedding=embedding,
        pooling=OpenAIServingPooling(engine, names, chat),
        cohere_embed=CohereServingEmbedding(embedding),
        reward=OpenAIServingReward(engine, names, chat),
        classify=OpenAIServingClassification(engine, names, chat),
        tokenization=OpenAIServingTokenization(engine, names, chat),
        responses=OpenAIServingResponses(chat),
        score=OpenAIServingScore(engine, names, chat),
    )
