"""An in-process `fd serve` app over a scripted engine, driven by the official openai SDK (no model,
no subprocess): the engine says fixed pieces whatever the prompt and records what it was asked."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import openai
from fastapi.testclient import TestClient

from fdcli_engine.entrypoints.openai.app_state import Admission, AppState, ServerArgs
from fdcli_engine.entrypoints.openai.http_app import build_app
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions
from fdcli_engine.outputs import CompletionOutput, RequestOutput


@dataclass
class ModelConfig:
    served_model_name: str = "fake"
    max_model_len: int = 256
    vocab_size: int = 0
    model: str = "scripted"


@dataclass
class ScriptedEngine:
    """One DELTA output per piece (token ids 3, 4, ...); `produced` counts outputs yielded so far."""

    tokenizer: object
    pieces: list[str]
    model_config: ModelConfig = field(default_factory=ModelConfig)
    is_ready: bool = True
    is_dead: bool = False
    dead_reason: str | None = None
    calls: list = field(default_factory=list)  # (prompt text, prompt ids, params) per request
    produced: int = 0

    async def generate(self, prompt_token_ids, params, request_id, prompt=None):
        self.calls.append((prompt, list(prompt_token_ids), params))
        text, ids = "", []
        for k, piece in enumerate(self.pieces):
            await asyncio.sleep(0)
            last = k == len(self.pieces) - 1
            text += piece
            ids.append(k + 3)
            comp = CompletionOutput(0, text, list(ids), "stop" if last else None, None, None, piece, [k + 3])
            self.produced += 1
            yield RequestOutput(request_id, prompt, list(prompt_token_ids), [comp], last)

    def abort(self, request_id):
        pass

    async def get_stats(self):
        return {}


def scripted_client(tokenizer, pieces, **serving):
    """(openai client, raw httpx client, engine) of an app serving `pieces` with these ServingOptions."""
    args = ServerArgs(serving=ServingOptions(**serving))
    engine = ScriptedEngine(tokenizer, pieces)
    http = TestClient(build_app(engine, args, AppState(args, Admission(8, -1))))
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    return client, http, engine
