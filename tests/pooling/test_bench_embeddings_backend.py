"""`fd bench serve --backend embeddings`: one non-streamed /v1/embeddings call per prompt; prompt
tokens from usage, no output tokens, E2EL only; HTTP errors and malformed bodies are failed records."""

from __future__ import annotations

import asyncio
import json

import httpx

from fdcli.bench.client import BackendConfig, send_request
from fdcli.bench.datasets import SampleRequest
from fdcli.bench.metrics import compute_metrics


def _run(handler, prompt="hello world"):
    seen = []

    def wrapped(request: httpx.Request):
        seen.append((request.url.path, json.loads(request.content)))
        return handler(request)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(wrapped)) as client:
            cfg = BackendConfig(base_url="http://x", backend="embeddings", model="m")
            return await send_request(
                client, cfg, SampleRequest(prompt=prompt, prompt_len=3, output_len=1), 0
            )

    return asyncio.run(go()), seen


def test_embeddings_record_uses_usage_and_has_no_ttft():
    body = {"data": [{"index": 0, "embedding": [0.1, 0.2]}], "usage": {"prompt_tokens": 7, "total_tokens": 7}}
    record, seen = _run(lambda r: httpx.Response(200, json=body))
    # vLLM's body (benchmarks/lib/endpoint_request_func.py): over-long prompts are truncated, not refused.
    assert seen == [("/v1/embeddings", {"model": "m", "input": "hello world", "truncate_prompt_tokens": -1})]
    assert record.ok and record.prompt_len == 7 and record.output_tokens == 0
    assert record.ttft is None and record.e2el >= 0
    m = compute_metrics([record], 1.0, record.start, [50.0], {})
    assert (m["completed"], m["total_input_tokens"], m["total_output_tokens"]) == (1, 7, 0)
    assert (
        m["request_throughput"] == 1.0 and m["e2el"]["mean_ms"] is not None and m["ttft"]["mean_ms"] is None
    )


def test_embeddings_errors_become_failed_records():
    record, _ = _run(lambda r: httpx.Response(400, json={"error": {"message": "input is empty"}}))
    assert not record.ok and record.error.startswith("HTTP 400") and "input is empty" in record.error
    record, _ = _run(lambda r: httpx.Response(200, json={"object": "list"}))
    assert not record.ok and "no data[0].embedding" in record.error
