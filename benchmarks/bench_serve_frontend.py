"""CPU cost of `fd serve`'s front end per streamed token, with a stub engine core (no model).

The front end (HTTP, SSE, detokenization, routing) shares the machine's cores with the engine core, so
every millisecond it spends per token is taken from the model. This measures that cost alone: the real
server (uvicorn, FastAPI, AsyncLLM, the engine-core process and its ZMQ sockets) with a core that sleeps
--step-ms per step (as a model would, but without using a CPU) and emits one token per running request.
Prints CPU ms per output token of the front-end process (user + system) and of this benchmark as the
HTTP client (stream_client.py: a raw asyncio connection that checks every stream, lighter than httpx).
The tokenizer is the default model's (real detokenization).

    python benchmarks/bench_serve_frontend.py [--concurrency 1,16] [--num-requests 16] [--output-len 128]
        [--step-ms 20] [--endpoint completions|chat]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

from fdcli_engine.engine import EngineCoreRequest  # the core's add message (core_messages.AddRequest)
from fdcli_engine.outputs import EngineCoreOutput

HERE = os.path.dirname(os.path.abspath(__file__))


class StubCore:
    """An engine core without a model: each step sleeps, then gives every request one more token."""

    vocab_size = 49152
    step_s = float(os.environ.get("FD_STUB_STEP_MS", "20")) / 1000

    def __init__(self, config):
        self.requests: dict[str, list] = {}  # req_id -> [max_tokens, tokens so far]

    def add_request(self, req: EngineCoreRequest) -> None:
        self.requests[req.req_id] = [req.sampling_params.max_tokens or 16, 0]

    def abort_requests(self, req_ids: list[str]) -> list[EngineCoreOutput]:
        gone = [r for r in req_ids if self.requests.pop(r, None) is not None]
        return [EngineCoreOutput(r, [], finish_reason="abort") for r in gone]

    def step(self) -> list[EngineCoreOutput]:
        time.sleep(self.step_s)
        outs = []
        for req_id, state in list(self.requests.items()):
            state[1] += 1
            token = 300 + (state[1] * 7919) % 20000  # ordinary words and pieces of SmolLM2's vocabulary
            done = state[1] >= state[0]
            outs.append(EngineCoreOutput(req_id, [token], finish_reason="length" if done else None))
            if done:
                del self.requests[req_id]
        return outs

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_stats(self) -> dict:
        return {"num_running": len(self.requests)}


SERVER = """
import sys
from fdcli_engine.entrypoints.openai.app_state import ServerArgs
from fdcli_engine.entrypoints.openai.launcher import run_server
from fdcli_engine.resolved_config import ResolvedConfig
cfg = ResolvedConfig(max_model_len=4096)
sys.exit(run_server(cfg, ServerArgs(port=int(sys.argv[1])),
                    core_spec="bench_serve_frontend:StubCore"))
"""


def start_stub_server(step_ms: float) -> tuple[subprocess.Popen, str]:
    from stream_client import free_port, wait_ready

    port = free_port()
    env = dict(os.environ, FD_STUB_STEP_MS=str(step_ms))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, "the stub server", 100)
    return proc, url


async def run_load(url: str, endpoint: str, n: int, output_len: int, concurrency: int) -> int:
    """Streams `n` requests, `concurrency` at a time; returns the output tokens received. Every stream is
    checked (stream_client.py): exactly `output_len` tokens, a finish_reason, [DONE], no error."""
    from stream_client import stream_completion

    sem = asyncio.Semaphore(concurrency)
    tokens = 0
    body: dict = {"max_tokens": output_len, "stream": True, "return_token_ids": True}
    if endpoint == "chat":
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": "hi"}]
    else:
        path, body["prompt"] = "/v1/completions", list(range(100, 228))

    async def one():
        nonlocal tokens
        async with sem:
            n = await stream_completion(url, path, body, expected_tokens=output_len)
            tokens += n  # after the await: `tokens += await ...` would read `tokens` before it

    await asyncio.gather(*(one() for _ in range(n)))
    return tokens


def main() -> None:
    sys.path.insert(0, HERE)
    from bench_serve_overhead import cpu_s
    from stream_client import run as run_async

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    args = p.parse_args()
    proc, url = start_stub_server(args.step_ms)
    rows = []
    try:
        run_async(run_load(url, args.endpoint, 1, 4, 1))  # warm-up
        for c in (int(x) for x in args.concurrency.split(",")):
            before, client_before = cpu_s(proc.pid), cpu_s()
            t0 = time.perf_counter()
            n = run_async(run_load(url, args.endpoint, args.num_requests, args.output_len, c))
            wall = time.perf_counter() - t0
            fe, cl = cpu_s(proc.pid) - before, cpu_s() - client_before
            rows.append((c, n, n / wall, 1000 * fe / n, 1000 * cl / n))
    finally:
        proc.terminate()
        proc.wait(60)
    print(f"{'conc':>5} {'tokens':>7} {'tok/s':>8} {'front end CPU ms/tok':>21} {'client CPU ms/tok':>18}")
    for c, n, tok_s, fe, cl in rows:
        print(f"{c:>5} {n:>7} {tok_s:>8.1f} {fe:>21.3f} {cl:>18.3f}")


if __name__ == "__main__":
    main()
