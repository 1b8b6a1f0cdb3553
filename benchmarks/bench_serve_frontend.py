"""CPU cost of `fd serve`'s front end per streamed token, with a stub engine core (no model).

The front end (HTTP, SSE, detokenization, routing) shares the machine's cores with the engine core, so
every millisecond it spends per token is taken from the model. This measures that cost alone: the real
server (uvicorn, FastAPI, AsyncLLM, the engine-core process and its ZMQ sockets) with a core that sleeps
--step-ms per step (as a model would, but without using a CPU) and emits one token per running request.
Prints CPU ms per output token of the front-end process (all its threads' run time from schedstat, and
the system part) and of this benchmark as the HTTP client (stream_client.py: a raw asyncio connection that
checks every stream, lighter than httpx). The tokenizer is the default model's (real detokenization).

With --trees A B, one stub server per source tree (its own PYTHONPATH: TREE and TREE/kernels), all started
before the first load and idle while another one serves; each of --rounds rounds runs every load on every
server in turns (the order reversed every other round), so the trees are compared under the same
background load. Front-end CPU per token is deterministic enough to compare this way where wall-clock
TPOT is not.

    python benchmarks/bench_serve_frontend.py [--concurrency 1,16] [--num-requests 16] [--output-len 128]
        [--step-ms 20] [--endpoint completions|chat] [--trees TREE [TREE]] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
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


def start_stub_server(step_ms: float, tree: str | None = None) -> tuple[subprocess.Popen, str]:
    """The stub server, importing fd from `tree` (TREE and TREE/kernels) when given, else as this
    process does."""
    from stream_client import free_port, wait_ready

    port = free_port()
    env = dict(os.environ, FD_STUB_STEP_MS=str(step_ms))
    paths = (HERE, tree, f"{tree}/kernels") if tree else (HERE, env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)],
        env=env,
        cwd=tree,  # `python -c` puts the current directory ahead of PYTHONPATH
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


def cpu_times(pid: int | None = None) -> tuple[dict[str, float], float]:
    """A process's (this one when pid is None) CPU seconds per thread name (its threads' schedstat, in
    nanoseconds: psutil's user + system count 10 ms ticks, too coarse to compare two trees over a few
    thousand tokens) and its system CPU seconds (psutil)."""
    import psutil
    from bench_serve_threads import thread_stats

    pid = pid or os.getpid()
    by_name: dict[str, float] = {}
    for (_, thread), (ns, _, _) in thread_stats({"": pid}).items():
        name = thread.split(":", 1)[1]
        by_name[name] = by_name.get(name, 0.0) + ns / 1e9
    return by_name, psutil.Process(pid).cpu_times().system


def main() -> None:
    sys.path.insert(0, HERE)
    from stream_client import run as run_async

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--trees", nargs="+", default=[None], help="one or more source trees (default: this one)")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    trees = [os.path.abspath(t) if t else None for t in args.trees]
    servers = []
    # (tree, concurrency) -> [(tokens, wall s, front-end CPU s by thread name, its system s, client s)]
    rows: dict = {}
    try:
        for tree in trees:
            servers.append((tree, *start_stub_server(args.step_ms, tree)))
        for _, _, url in servers:
            run_async(run_load(url, args.endpoint, 1, 4, 1))  # warm-up
        for r in range(args.rounds):
            for tree, proc, url in servers if r % 2 == 0 else servers[::-1]:
                for c in (int(x) for x in args.concurrency.split(",")):
                    (f0, s0), (cl0, _) = cpu_times(proc.pid), cpu_times()
                    t0 = time.perf_counter()
                    n = run_async(run_load(url, args.endpoint, args.num_requests, args.output_len, c))
                    wall = time.perf_counter() - t0
                    (f1, s1), (cl1, _) = cpu_times(proc.pid), cpu_times()
                    fe = {k: v - f0[k] for k, v in f1.items() if k in f0}
                    client = sum(cl1.values()) - sum(cl0.values())
                    rows.setdefault((tree, c), []).append((n, wall, fe, s1 - s0, client))
    finally:
        for _, proc, _ in servers:
            proc.terminate()
            proc.wait(60)
    print(
        f"{'tree':>22} {'conc':>5} {'tokens':>7} {'tok/s':>8} {'front end CPU ms/tok':>21} "
        f"{'(system)':>9} {'client CPU ms/tok':>18}"
    )
    for (tree, c), runs in rows.items():
        name = os.path.basename(tree or os.getcwd())[-22:]
        for n, wall, fe, system, client in runs:
            print(
                f"{name:>22} {c:>5} {n:>7} {n / wall:>8.1f} {1000 * sum(fe.values()) / n:>21.3f} "
                f"{1000 * system / n:>9.3f} {1000 * client / n:>18.3f}"
            )
        total = sorted(1000 * sum(r[2].values()) / r[0] for r in runs)
        threads = {k for r in runs for k in r[2]}
        per_thread = {k: statistics.median(1000 * r[2].get(k, 0.0) / r[0] for r in runs) for k in threads}
        busy = ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(per_thread.items(), key=lambda kv: -kv[1]) if v >= 0.001
        )
        print(
            f"{'':>22} {c:>5} median {statistics.median(total):.3f}, min {total[0]:.3f} ms/tok; by thread: {busy}"
        )


if __name__ == "__main__":
    main()
