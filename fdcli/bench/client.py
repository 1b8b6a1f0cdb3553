"""One streamed request to an OpenAI-compatible server, timestamped into a `RequestRecord`.

Assumes nothing fd-specific: only the OpenAI streaming format (`data:` JSON chunks, `[DONE]`), with
`stream_options.include_usage` requested so servers that support it (vLLM, fd, recent llama.cpp) report
exact token counts. Any failure — HTTP status, timeout, transport error, malformed JSON, an `error`
object in the stream, a stream that ends without `[DONE]` or a finish reason — becomes a failed record
with its message; it never raises (except cancellation, which is how Ctrl-C stops a run).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from fdcli.bench.datasets import SampleRequest
from fdcli.bench.metrics import RequestRecord
from fdcli.bench.sse import SSEDecoder
from fdcli_engine.errors import ConfigError

BACKENDS = {
    "openai": "/v1/completions",
    "openai-chat": "/v1/chat/completions",
    "embeddings": "/v1/embeddings",  # one non-streamed request per prompt: E2EL and throughput only
}
# vLLM's --backend names for the same request shapes (its ASYNC_REQUEST_FUNCS: "vllm" is its
# completions backend, "openai-embeddings" its /v1/embeddings one).
VLLM_BACKENDS = {"vllm": "openai", "openai-embeddings": "embeddings"}
ERROR_BODY_CHARS = 300


@dataclass
class BackendConfig:
    base_url: str
    backend: str = "openai"
    endpoint: str | None = None  # None: the backend's standard path
    model: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    temperature: float | None = None  # None: not sent
    top_p: float | None = None
    top_k: int | None = None
    ignore_eos: bool = False
    include_usage: bool = True  # off for servers that reject stream_options
    request_timeout: float = 600.0
    logprobs: int | None = None
    # Sent last, so it wins over every field above (vLLM's --extra-body and its sampling flags).
    extra_body: dict = field(default_factory=dict)
    request_id_prefix: str | None = None  # x-request-id = prefix + request index, as vLLM sends it
    verify: bool = True  # TLS certificate check for https URLs (off with --insecure)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + (self.endpoint or BACKENDS[self.backend])


def resolve_backend(name: str) -> str:
    """fd's backend for `name`, which may be vLLM's spelling; one line naming the choices otherwise."""
    if name in BACKENDS:
        return name
    if name in VLLM_BACKENDS:
        return VLLM_BACKENDS[name]
    names = ", ".join([*BACKENDS, *VLLM_BACKENDS])
    raise ConfigError(f"--backend {name!r} is not supported: use one of {names}")


def request_headers(cfg: BackendConfig, index: int) -> dict[str, str]:
    """The configured headers plus x-request-id (warmups, which have negative indexes, get their own)."""
    if cfg.request_id_prefix is None:
        return cfg.headers
    suffix = str(index) if index >= 0 else f"warmup-{-1 - index}"
    return {**cfg.headers, "x-request-id": f"{cfg.request_id_prefix}{suffix}"}


def build_payload(cfg: BackendConfig, req: SampleRequest) -> dict:
    """The request body; sampling fields go on both backends (top_k/ignore_eos as extra fields),
    then --extra-body over everything, as vLLM merges it."""
    body: dict = {"model": cfg.model}
    if cfg.backend == "openai-chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    body.update(max_tokens=req.output_len, stream=True)
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    if cfg.include_usage:
        body["stream_options"] = {"include_usage": True}
    if cfg.top_p is not None:
        body["top_p"] = cfg.top_p
    if cfg.top_k is not None:
        body["top_k"] = cfg.top_k
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.logprobs is not None:
        if cfg.backend == "openai-chat":
            body.update(logprobs=True, top_logprobs=cfg.logprobs)
        else:
            body["logprobs"] = cfg.logprobs
    body.update(cfg.extra_body)
    return body


class StreamError(Exception):
    """The server sent something that is not a valid OpenAI stream, or an error inside it."""


@dataclass
class _StreamState:
    texts: list[str] = field(default_factory=list)
    usage: dict | None = None
    done: bool = False
    finished: bool = False


def _chunk_text(obj: dict, chat: bool) -> str | None:
    """The output text a chunk carries, "" for a token whose text the server holds back (part of a
    character); None for a chunk that is no token's: usage only, the role-only opening delta, or an
    empty one that ends the choice (OpenAI's closing chunk: its finish reason alone)."""
    choices = obj.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if chat:
        delta = choice.get("delta") or {}
        # Reasoning tokens are output tokens too (vLLM: reasoning_content; others: reasoning).
        parts = [delta.get(k) for k in ("reasoning_content", "reasoning", "content")]
        parts = [part for part in parts if isinstance(part, str)]
        text = "".join(parts) if parts else None
        opening = "role" in delta
    else:
        text = choice.get("text") if isinstance(choice.get("text"), str) else None
        opening = False
    if not text and (opening or choice.get("finish_reason")):
        return None
    return text


def handle_event(data: str, state: _StreamState, record: RequestRecord, now: float, chat: bool) -> None:
    if data.strip() == "[DONE]":
        state.done = True
        return
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        raise StreamError(f"malformed stream: not JSON: {data[:100]!r}") from None
    if not isinstance(obj, dict):
        raise StreamError(f"malformed stream: expected a JSON object, got {data[:100]!r}")
    if obj.get("error"):
        err = obj["error"]
        raise StreamError(f"error in stream: {err.get('message', err) if isinstance(err, dict) else err}")
    # Every token's chunk is an arrival, its text empty or not (vLLM's client counts each chunk with
    # choices): skipping the empty ones would merge two steps into one inter-token gap.
    text = _chunk_text(obj, chat)
    if text is not None:
        record.chunk_times.append(now)
        state.texts.append(text)
    choices = obj.get("choices") or []
    if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
        state.finished = True
    if isinstance(obj.get("usage"), dict):
        state.usage = obj["usage"]


def finalize_counts(record: RequestRecord, state: _StreamState, req: SampleRequest, tokenizer) -> None:
    """Output/prompt token counts: server usage first, then the tokenizer, then the chunk count."""
    record.generated_text = "".join(state.texts)
    usage = state.usage or {}
    n_chunks = len(state.texts)
    if isinstance(usage.get("completion_tokens"), int):
        record.output_tokens, record.output_tokens_source = usage["completion_tokens"], "usage"
    elif tokenizer is not None:
        record.output_tokens = len(tokenizer.encode(record.generated_text))
        record.output_tokens_source = "tokenizer"
    else:
        record.output_tokens, record.output_tokens_source = n_chunks, "chunks"
    prompt_tokens = usage.get("prompt_tokens")
    record.prompt_len = prompt_tokens if isinstance(prompt_tokens, int) else req.prompt_len
    if n_chunks == record.output_tokens:
        record.chunk_tokens = [1] * n_chunks
    elif tokenizer is not None and n_chunks:
        # Per-chunk counts are exact only if they add up to the total; otherwise ITL falls to chunk mode.
        counts = [len(tokenizer.encode(t)) for t in state.texts]
        ok = sum(counts) == record.output_tokens and min(counts) >= 1
        record.chunk_tokens = counts if ok else None


async def _stream(client, cfg: BackendConfig, req: SampleRequest, record, state, clock) -> None:
    chat = cfg.backend == "openai-chat"
    headers = request_headers(cfg, record.index)
    async with client.stream("POST", cfg.url, json=build_payload(cfg, req), headers=headers) as resp:
        if resp.status_code != 200:
            body = (await resp.aread()).decode("utf-8", errors="replace")
            raise StreamError(f"HTTP {resp.status_code}: {' '.join(body.split())[:ERROR_BODY_CHARS]}")
        decoder = SSEDecoder()
        async for line in resp.aiter_lines():
            event = decoder.feed_line(line)
            if event is not None:
                handle_event(event.data, state, record, clock(), chat)
        tail = decoder.finish()
        if tail is not None:
            handle_event(tail.data, state, record, clock(), chat)
    if not (state.done or state.finished):
        raise StreamError("malformed stream: it ended without [DONE] or a finish_reason")


async def _embed(client, cfg: BackendConfig, req: SampleRequest, record: RequestRecord) -> None:
    """One /v1/embeddings call: no output tokens and no chunks, so only E2EL and throughput apply."""
    # vLLM's backend sends truncate_prompt_tokens -1 (embedding models' contexts are short: an over-long
    # prompt is cut, not a failed request); --extra-body may override it.
    body = {"model": cfg.model, "input": req.prompt, "truncate_prompt_tokens": -1, **cfg.extra_body}
    resp = await client.post(cfg.url, json=body, headers=request_headers(cfg, record.index))
    if resp.status_code != 200:
        text = " ".join(resp.text.split())
        raise StreamError(f"HTTP {resp.status_code}: {text[:ERROR_BODY_CHARS]}")
    try:
        obj = resp.json()
    except ValueError:
        raise StreamError("malformed response: not JSON") from None
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict) or "embedding" not in data[0]:
        raise StreamError("malformed response: no data[0].embedding")
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
    prompt_tokens = usage.get("prompt_tokens")
    record.prompt_len = prompt_tokens if isinstance(prompt_tokens, int) else req.prompt_len
    record.output_tokens, record.output_tokens_source = 0, "usage"


async def send_request(
    client, cfg: BackendConfig, req: SampleRequest, index: int, tokenizer=None, clock=time.perf_counter
) -> RequestRecord:
    import httpx

    record = RequestRecord(index=index, prompt_len=req.prompt_len)
    state = _StreamState()
    record.start = clock()
    try:
        if cfg.backend == "embeddings":
            await asyncio.wait_for(_embed(client, cfg, req, record), cfg.request_timeout)
        else:
            await asyncio.wait_for(_stream(client, cfg, req, record, state, clock), cfg.request_timeout)
            finalize_counts(record, state, req, tokenizer)
        record.ok = True
    except asyncio.TimeoutError:
        record.error = f"timed out after {cfg.request_timeout:g} s (--request-timeout)"
    except StreamError as exc:
        record.error = str(exc)
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except Exception as exc:  # a benchmark run must survive anything one request does
        record.error = f"{type(exc).__name__}: {exc}"
    record.end = clock()
    return record
