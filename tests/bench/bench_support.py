"""Test support for the bench tests (imported by tests/bench/conftest.py and tests/cli/test_bench_*.py):
a tiny byte-level BPE tokenizer trained in memory (decode→encode is not an identity, like real LLM
tokenizers), a word tokenizer with hand-countable counts, and a scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from contextlib import contextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "serving large language models on a small cpu is a test of patience",
    "tokens per second, time to first token, inter token latency",
    "0123456789 !?.,;:()[]{} café naïve 東京 emoji 🙂",
] * 20


def train_bpe(vocab_size: int = 400):
    """A `tokenizers.Tokenizer` (byte-level BPE) trained on CORPUS in milliseconds."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WordTokenizer:
    """One token per space-separated word: chunk texts tokenize to exact, hand-countable counts."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.vocab_size = 1000
        self.special_ids: set[int] = set()

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        inv = {v: k for k, v in self.vocab.items()}
        return " ".join(inv.get(i, f"w{i}") for i in ids)


# ---------------------------------------------------------------------------------------------------
# A scripted OpenAI-compatible server. The prompt (completions) or the last user message (chat) picks
# the behaviour; timings are server-side sleeps, so client-side measurements have known lower bounds.
FIRST_TOKEN_DELAY = 0.15
TOKEN_GAP = 0.05


class ScriptedServer:
    def __init__(self) -> None:
        self.in_flight = 0
        self.peak_in_flight = 0
        self.payloads: list[dict] = []
        self.auth: list[str | None] = []
        self.request_ids: list[str | None] = []  # the x-request-id header of each request
        self.loading_polls = 0  # /health answers 503 this many more times (a server still loading)
        self.url = ""


def _chunk(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _script(kind: str, body: dict, chat: bool):
    """Yield SSE text for one scripted request."""
    n = int(body.get("max_tokens") or 4)
    want_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def piece(text: str, finish=None) -> dict:
        choice = {"index": 0, "finish_reason": finish}
        choice.update({"delta": {"content": text}} if chat else {"text": text})
        return {"id": "x", "object": "chunk", "choices": [choice]}

    if chat:  # a role-only first chunk, as real servers send: it carries no output and must not count
        yield _chunk({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    await asyncio.sleep(FIRST_TOKEN_DELAY)
    if kind == "malformed":
        yield 'data: {"choices": [oops\n\n'
        return
    if kind == "streamerror":
        yield _chunk({"error": {"message": "scripted stream error"}})
        return
    if kind == "eos":  # an instruct model ending its turn at once: one special token, no text
        yield _chunk(piece("", finish="stop"))
        if want_usage:
            yield _chunk({"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}})
        yield "data: [DONE]\n\n"
        return
    groups = [2, 3] if kind == "multi" else [1] * n
    for i, size in enumerate(groups):
        if i:
            await asyncio.sleep(TOKEN_GAP)
        yield _chunk(piece(" ".join(f"w{i}_{j}" for j in range(size)) + " "))
        if kind == "nodone":
            return  # the connection closes mid-stream
    yield _chunk(piece("", finish="length"))
    if want_usage and kind != "nousage":
        yield _chunk(
            {"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": sum(groups)}}
        )
    yield ": keep-alive comment\n\n"
    yield "data: [DONE]\n\n"


def make_app(state: ScriptedServer):
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "scripted-model", "object": "model"}]}

    @app.get("/health")
    async def health():
        if state.loading_polls > 0:
            state.loading_polls -= 1
            return JSONResponse({"error": {"message": "loading"}}, status_code=503)
        return {}

    async def handle(request: Request, chat: bool):
        body = await request.json()
        state.payloads.append(body)
        state.auth.append(request.headers.get("authorization"))
        state.request_ids.append(request.headers.get("x-request-id"))
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        kind = prompt.split()[0]
        if kind == "fail":
            msg = {"error": {"message": "scripted failure", "type": "server_error", "code": 500}}
            return JSONResponse(msg, status_code=500)
        state.in_flight += 1
        state.peak_in_flight = max(state.peak_in_flight, state.in_flight)

        async def stream():
            try:
                if kind == "slow":
                    await asyncio.sleep(3.0)
                async for part in _script(kind, body, chat):
                    yield part
            finally:
                state.in_flight -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    return app


@contextmanager
def running_server():
    """Start the scripted server on a free 127.0.0.1 port in a thread; stop it on exit."""
    import uvicorn

    state = ScriptedServer()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(state), log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()
