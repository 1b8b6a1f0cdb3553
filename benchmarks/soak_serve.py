"""Soak `fd serve` with a mix of normal, abusive and abandoned requests for a given time (#28).

Workers run side by side for --duration seconds, each picking its next request at random:
- normal: completions and chat, streamed and not, with a few output tokens; every answer is checked
  (status 200, a choice, [DONE] at the end of a stream). A 5xx here is a failure of the server.
- abusive: bodies the server must refuse with a 4xx: bad JSON, JSON nested 100,000 deep, wrong types,
  an unknown model, a prompt past the context, a 1,000-item prompt list of empty strings, a wrong API
  key, many and large headers, a hostile chat template (with --trust-request-chat-template, which this
  script passes to the server it starts). Any 5xx counts too.
- abandoned: a stream whose connection is closed after its first chunk, and a request whose body is
  never finished (the connection is dropped mid-body).
Every --sample-every seconds it records the server's resident memory, threads and open files (front
end and engine core, from psutil), and /health's answer time. It prints the counts per kind and the
drift of each resource (last sample minus the first after warm-up), and exits 1 if a valid request got
a 5xx or failed its check.

    python benchmarks/soak_serve.py [--duration 1800] [--workers 6] [--model PATH] [--base-url URL]
        [--api-key KEY] [--sample-every 30] [--json out.json]

Without --base-url it starts `fd serve` on a free port (the default model unless --model), with an API
key, and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
API_KEY = "soak-key"
HOSTILE_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"


def start_server(model: str | None) -> tuple[subprocess.Popen, str]:
    from stream_client import free_port, wait_ready

    port = free_port()
    cmd = [sys.executable, "-m", "fdcli.main", "serve", "--port", str(port), "--trust-request-chat-template"]
    cmd += ["--max-model-len", "1024", "--api-key-file", _key_file()]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, "fd serve", 300, path="/health")
    deadline = time.monotonic() + 300
    while httpx.get(f"{url}/ready", headers=_auth(API_KEY)).status_code != 200:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("fd serve did not become ready")
        time.sleep(0.5)
    return proc, url


def _key_file() -> str:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"fd-soak-key-{os.getpid()}"
    path.write_text(API_KEY + "\n")
    return str(path)


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


# ---------------- the requests ----------------


def _normal_bodies(model: str) -> list[tuple[str, dict]]:
    msgs = [{"role": "user", "content": "Name a colour."}]
    return [
        ("/v1/completions", {"model": model, "prompt": "The sky is", "max_tokens": 8}),
        ("/v1/completions", {"model": model, "prompt": ["a", "b"], "max_tokens": 4, "stream": True}),
        ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 8}),
        ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 8, "stream": True}),
    ]


async def normal(client: httpx.AsyncClient, model: str, stats: Counter) -> None:
    path, body = random.choice(_normal_bodies(model))
    kind = f"normal {'stream' if body.get('stream') else 'json'}"
    try:
        if body.get("stream"):
            async with client.stream("POST", path, json=body) as r:
                text = "".join([chunk async for chunk in r.aiter_text()])
            ok = r.status_code == 200 and text.rstrip().endswith("data: [DONE]") and '"error"' not in text
        else:
            r = await client.post(path, json=body)
            ok = r.status_code == 200 and bool(r.json().get("choices"))
    except httpx.HTTPError as e:
        stats[f"{kind}: transport error {type(e).__name__}"] += 1
        stats["valid failed"] += 1
        return
    stats[f"{kind}: {r.status_code}"] += 1
    if not ok:
        stats["valid failed"] += 1
    if r.status_code >= 500:
        stats["valid 5xx"] += 1


def _abusive_requests(model: str) -> list[tuple[str, dict]]:
    deep = "[" * 100_000 + "]" * 100_000
    msgs = [{"role": "user", "content": "hi"}]
    return [
        ("bad json", {"content": b'{"model": ', "headers": {"content-type": "application/json"}}),
        ("deep json", {"content": f'{{"model": "{model}", "prompt": {deep}}}'.encode()}),
        ("wrong type", {"json": {"model": model, "prompt": "x", "max_tokens": "many"}}),
        ("unknown model", {"json": {"model": "gpt-9", "prompt": "x"}}),
        ("past context", {"json": {"model": model, "prompt": "word " * 3000, "max_tokens": 4}}),
        ("empty prompt list", {"json": {"model": model, "prompt": [""] * 1000}}),
        ("wrong key", {"json": {"model": model, "prompt": "x"}, "headers": _auth("nope")}),
        ("many headers", {"json": {"model": model, "prompt": "x", "max_tokens": 1}, "many_headers": True}),
        ("hostile template", {"json": {"model": model, "messages": msgs, "chat_template": HOSTILE_TEMPLATE}}),
    ]


async def abusive(client: httpx.AsyncClient, model: str, stats: Counter) -> None:
    name, req = random.choice(_abusive_requests(model))
    path = "/v1/chat/completions" if "messages" in req.get("json", {}) else "/v1/completions"
    headers = dict(client.headers)
    headers.update(req.get("headers", {}))
    if req.get("many_headers"):
        headers.update({f"x-pad-{i}": "y" * 64 for i in range(500)})
    try:
        r = await client.post(path, json=req.get("json"), content=req.get("content"), headers=headers)
        stats[f"abusive {name}: {r.status_code}"] += 1
        if r.status_code >= 500:
            stats["abusive 5xx"] += 1
    except httpx.HTTPError as e:  # a refused header block may close the connection: not a 5xx
        stats[f"abusive {name}: closed ({type(e).__name__})"] += 1


async def abandoned(url: str, model: str, stats: Counter) -> None:
    host, port = url.removeprefix("http://").split(":")
    if random.random() < 0.5:
        body = {"model": model, "prompt": "Once upon a time", "max_tokens": 200, "stream": True}
        async with httpx.AsyncClient(base_url=url, headers=_auth(API_KEY), timeout=60) as c:
            try:
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    async for _ in r.aiter_bytes():
                        break  # leave after the first chunk
                stats["abandoned stream"] += 1
            except httpx.HTTPError as e:
                stats[f"abandoned stream: {type(e).__name__}"] += 1
        return
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    writer.write(head.encode() + b'{"model": "')
    await writer.drain()
    await asyncio.sleep(random.uniform(0.1, 1.0))
    writer.close()
    stats["abandoned body"] += 1


async def worker(url: str, model: str, until: float, stats: Counter) -> None:
    async with httpx.AsyncClient(base_url=url, headers=_auth(API_KEY), timeout=120) as client:
        while time.monotonic() < until:
            pick = random.random()
            if pick < 0.6:
                await normal(client, model, stats)
            elif pick < 0.85:
                await abusive(client, model, stats)
            else:
                await abandoned(url, model, stats)


# ---------------- resources ----------------


def sample(server_pid: int, url: str) -> dict:
    procs = [psutil.Process(server_pid)]
    procs += procs[0].children(recursive=True)
    rss = threads = files = 0
    for p in procs:
        try:
            with p.oneshot():
                rss += p.memory_info().rss
                threads += p.num_threads()
                files += p.num_fds()
        except psutil.Error:
            pass
    t0 = time.perf_counter()
    try:
        health = httpx.get(f"{url}/health", timeout=5).status_code
    except httpx.HTTPError:
        health = -1
    return {
        "t": time.monotonic(),
        "rss_mb": rss / 2**20,
        "threads": threads,
        "open_files": files,
        "health": health,
        "health_ms": (time.perf_counter() - t0) * 1e3,
    }


async def sampler(pid: int, url: str, until: float, every: float, out: list) -> None:
    while time.monotonic() < until:
        out.append(await asyncio.to_thread(sample, pid, url))
        await asyncio.sleep(every)


async def soak(url: str, model: str, pid: int | None, args) -> tuple[Counter, list]:
    stats: Counter = Counter()
    samples: list = []
    until = time.monotonic() + args.duration
    tasks = [worker(url, model, until, stats) for _ in range(args.workers)]
    if pid is not None:
        tasks.append(sampler(pid, url, until, args.sample_every, samples))
    await asyncio.gather(*tasks)
    if pid is not None:
        await asyncio.sleep(5)  # let abandoned requests finish before the last sample
        samples.append(sample(pid, url))
    return stats, samples


def report(stats: Counter, samples: list, duration: float) -> dict:
    print(f"\n{'requests':52} {'count':>8}")
    for key in sorted(stats):
        print(f"{key:52} {stats[key]:8d}")
    result = {"duration_s": duration, "counts": dict(stats), "samples": samples}
    if len(samples) >= 3:
        first, last = samples[1], samples[-1]  # the first sample is before warm-up
        print(f"\n{'resource':16} {'after warm-up':>14} {'end':>10} {'max':>10} {'drift':>10}")
        for key in ("rss_mb", "threads", "open_files", "health_ms"):
            peak = max(s[key] for s in samples[1:])
            print(
                f"{key:16} {first[key]:14.1f} {last[key]:10.1f} {peak:10.1f} {last[key] - first[key]:10.1f}"
            )
        result["drift"] = {k: last[k] - first[k] for k in ("rss_mb", "threads", "open_files")}
        result["health_not_200"] = sum(s["health"] != 200 for s in samples)
        print(f"/health not 200 in {result['health_not_200']} of {len(samples)} samples")
    print(
        f"\n5xx on valid requests: {stats['valid 5xx']}; valid requests failing their check: {stats['valid failed']}"
    )
    print(f"5xx on abusive requests: {stats['abusive 5xx']}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=1800)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--model")
    ap.add_argument("--base-url")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--sample-every", type=float, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    global API_KEY
    proc = None
    if args.base_url:
        url, pid = args.base_url.rstrip("/"), None
        API_KEY = args.api_key or API_KEY
    else:
        proc, url = start_server(args.model)
        pid = proc.pid
    try:
        model = httpx.get(f"{url}/v1/models", headers=_auth(API_KEY)).json()["data"][0]["id"]
        stats, samples = asyncio.run(soak(url, model, pid, args))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    result = report(stats, samples, args.duration)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    sys.exit(1 if stats["valid 5xx"] or stats["valid failed"] else 0)


if __name__ == "__main__":
    main()
