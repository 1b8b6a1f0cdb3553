"""fd's engine against transformers (torch CPU fp32) on SmolLM2-135M-Instruct, same prompts, one run.

Measures single-request decode tokens/s, 16-request batched decode tokens/s and 512-token prefill
tokens/s, and prints fd / transformers ratios. Decode rates exclude prefill: each is
(tokens of a long run - tokens of a 1-token run) / (time of the long run - time of the 1-token run).

    python benchmarks/bench_engine.py [--quantization gguf|wint8|none] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

PROMPT_LEN, DECODE_LEN, BATCH, PREFILL_LEN = 32, 128, 16, 512


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(n)]


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def decode_rate(run, batch: list[list[int]], repeats: int) -> float:
    t_long = best_of(lambda: run(batch, DECODE_LEN), repeats)
    t_one = best_of(lambda: run(batch, 1), repeats)
    return len(batch) * (DECODE_LEN - 1) / (t_long - t_one)


def measure(run, repeats: int) -> dict:
    run(prompts(2, 8, 0), 4)  # warm-up
    single = decode_rate(run, prompts(1, PROMPT_LEN, 1), repeats)
    batched = decode_rate(run, prompts(BATCH, PROMPT_LEN, 2), repeats)
    long_prompt = prompts(1, PREFILL_LEN, 3)
    prefill = PREFILL_LEN / best_of(lambda: run(long_prompt, 1), repeats)
    return {"single_decode_tok_s": single, "batch16_decode_tok_s": batched, "prefill512_tok_s": prefill}


def fd_runner(quantization: str | None):
    from fdcli_engine import LLM, SamplingParams

    llm = LLM(None, max_model_len=1024, quantization=quantization, max_num_batched_tokens=1024)

    def run(batch, n):
        llm.engine.reset_prefix_cache()  # every repeat computes its prefill again
        llm.generate(batch, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))

    return run


def hf_runner():
    import torch
    from transformers import AutoModelForCausalLM

    from fdcli_engine.config import default_model_path

    torch.set_num_threads(os.cpu_count() or 1)
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()

    def run(batch, n):
        ids = torch.tensor(batch)
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quantization", default="gguf", help="fd weight format: gguf (native Q4_1), wint8, none"
    )
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    quant = None if args.quantization == "none" else args.quantization

    results = {"fd": measure(fd_runner(quant), args.repeats)}
    if not args.skip_hf:
        results["transformers"] = measure(hf_runner(), args.repeats)
    print(f"{'metric':<22}{'fd':>12}{'transformers':>14}{'ratio':>8}")
    for key in results["fd"]:
        fd_v = results["fd"][key]
        hf_v = results.get("transformers", {}).get(key)
        ratio = f"{fd_v / hf_v:7.2f}x" if hf_v else "   -"
        print(f"{key:<22}{fd_v:12.1f}{(hf_v or 0):14.1f}{ratio:>8}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"quantization": args.quantization, **results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
