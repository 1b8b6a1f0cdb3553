"""A scripted engine for the serving layer and the in-process `fd serve` app (no model, no subprocess):
it says fixed text pieces whatever the prompt and records what it was asked, so a test pins exact
text, chunks and usage. `scripted_client` wraps it in the FastAPI app behind the official openai SDK."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import NamedTuple

import openai
from fastapi.testclient import TestClient

from fdcli_engine.entrypoints.openai.app_state import Admission, AppState, ServerArgs
from fdcli_engine.entrypoints.openai.http_app import build_app
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions
from fdcli_engine.outputs import CompletionOutput, RequestOutput
from fdcli_engine.sampling_params import RequestOutputKind


@dataclass
class ModelConfig:
    served_model_name: str = "fake"
    max_model_len: int = 256
    vocab_size: int = 0
    model: str = "scripted"
    default_sampling_params: dict = field(default_factory=dict)
    max_logprobs: int = 20  # fdcli_engine.api.protocol.ModelConfig's default (--max-logprobs)


class Call(NamedTuple):
    prompt: str | None
    prompt_token_ids: list[int]
    params: object
    request_id: str


@dataclass
class ScriptedEngine:
    """Says `pieces`, piece k as token id k + 3, like the real engine would: one DELTA output per
    piece, or one FINAL_ONLY output with the whole text; after `params.max_tokens` pieces it stops
    with finish_reason "length". With `replies`, child k of an n>1 request (request id "<id>-k")
    says replies[k] instead. `produced` counts the outputs yielded so far."""

    tokenizer: object
    pieces: list[str] = field(default_factory=list)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    replies: list[list[str]] | None = None
    is_ready: bool = True
    is_dead: bool = False
    dead_reason: str | None = None
    calls: list[Call] = field(default_factory=list)
    produced: int = 0

    def _script(self, request_id: str) -> list[str]:
        if self.replies is None:
            return self.pieces
        tail = request_id.rsplit("-", 1)[-1]
        return self.replies[int(tail) if tail.isdigit() else 0]

    async def generate(self, prompt_token_ids, params, request_id, prompt=None):
        self.calls.append(Call(prompt, list(prompt_token_ids), params, request_id))
        script = self._script(request_id)
        pieces = script[: params.max_tokens]
        reason = "stop" if len(pieces) == len(script) else "length"
        delta = params.output_kind == RequestOutputKind.DELTA
        text, ids = "", []
        for k, piece in enumerate(pieces):
            await asyncio.sleep(0)
            last = k == len(pieces) - 1
            text += piece
            ids.append(k + 3)
            if last or delta:
                comp = CompletionOutput(
                    0, text, list(ids), reason if last else None, None, None, piece, [k + 3]
                )
                self.produced += 1
                yield RequestOutput(request_id, prompt, list(prompt_token_ids), [comp], last)

    def abort(self, request_id):
        pass

    async def get_stats(self):
        return {}


def scripted_client(tokenizer, pieces=(), *, replies=None, model_config=None, **serving):
    """(openai client, raw httpx client, engine) of an app serving `pieces` with these ServingOptions."""
    args = ServerArgs(serving=ServingOptions(**serving))
    engine = ScriptedEngine(tokenizer, list(pieces), model_config or ModelConfig(), replies)
    http = TestClient(build_app(engine, args, AppState(args, Admission(8, -1))))
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    return client, http, engine
