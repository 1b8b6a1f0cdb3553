"""What speculative decoding buys on the default model: one process, two engines (without and with
--speculative-config), the same loads run on both in alternated pairs, ratios printed.

Loads (SmolLM2 GGUF by default, greedy):
- repetitive, concurrency 1: chat prompts (template applied) that ask to repeat or rewrite a passage
  given in the prompt and to edit a code block shown in it: prompt lookup finds the output in the prompt;
- random, concurrency 1: `fd bench serve`'s random dataset (random-token prompts of --input-len tokens),
  exactly --max-tokens output tokens (EOS ignored): nothing to look up, the adaptive switch-off's case;
- concurrency 16: output tokens/s on the random prompts and on the repetitive ones.

Prints per load the time per output token after the first (concurrency 1) or the output throughput
(concurrency 16) of each engine and the ratio spec / plain (the issue's bounds: repetitive <= 0.6,
random <= 1.05, concurrency 16 throughput >= 0.95); the acceptance rate of the drafts (the speculative
engine's own stats: accepted / drafted, per position, and tokens per verification step); and a profile
of both engines' decode steps at concurrency 1 (ms per step in schedule, propose, forward, logits,
sample, the rest of the runner, and the scheduler's update), timed here by wrapping those methods (the
engine has no timers). Greedy outputs must be token-identical with and without speculation: the run fails
otherwise.

    python benchmarks/bench_spec_decode.py [--model PATH] [--method ngram] [--num-speculative-tokens 3]
        [--quantization Q] [--max-tokens 128] [--pairs 3] [--input-len 128] [--json out.json]

Run it when nothing else is busy: both engines share the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

PASSAGE = (
    "The lighthouse stood on a rock at the end of the harbour wall. Every evening the keeper climbed the "
    "hundred and twelve steps, trimmed the wick, wound the clockwork that turned the lens, and wrote the "
    "weather in a book that nobody read. Ships passed in the dark and never knew his name, but they knew "
    "his light, and that was enough for him."
)
CODE = """def total_price(items, tax):
    total = 0
    for item in items:
        total = total + item["price"] * item["quantity"]
    total = total + total * tax
    return round(total, 2)


def cheapest(items):
    best = None
    for item in items:
        if best is None or item["price"] < best["price"]:
            best = item
    return best
"""
REPETITIVE = [
    f"Repeat the following passage word for word, then stop.\n\n{PASSAGE}",
    f"Rewrite this passage in the present tense and change nothing else:\n\n{PASSAGE}",
    f"Rename the function total_price to order_total in this code and show the whole file:\n\n```python\n"
    f"{CODE}```",
    f"Add a docstring to each function of this code and return the complete code:\n\n```python\n{CODE}```",
]


class Profile:
    """Seconds spent in each wrapped method over decode steps (every scheduled request computes one
    known token, plus its drafts): prompt steps would swamp the per-step figures."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0
        self.on = False
        self.counting = False  # the current step is a decode step, timed

    def clear(self) -> None:
        self.seconds.clear()
        self.steps = 0

    def wrap(self, obj, attr: str, key: str) -> None:
        fn = getattr(obj, attr)

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                if self.counting:
                    self.seconds[key] += time.perf_counter() - t0

        setattr(obj, attr, timed)

    def wrap_schedule(self, scheduler) -> None:
        fn = scheduler.schedule

        def schedule():
            t0 = time.perf_counter()
            so = fn()
            self.counting = (
                self.on and bool(so.scheduled) and all(r.num_known_tokens == 1 for r in so.scheduled)
            )
            if self.counting:
                self.steps += 1
                self.seconds["schedule"] += time.perf_counter() - t0
            return so

        scheduler.schedule = schedule

    def per_step_ms(self) -> dict[str, float]:
        s = dict(self.seconds)
        inner = sum(s.get(k, 0.0) for k in ("propose", "forward", "logits", "sample"))
        s["runner other"] = max(s.pop("execute", 0.0) - inner, 0.0)
        s["total"] = sum(s.values())
        return {k: v / max(self.steps, 1) * 1e3 for k, v in s.items()}


def instrument(llm) -> Profile:
    """Timers around the engine's step parts (the instance's attributes; the classes are untouched)."""
    prof = Profile()
    core, runner = llm.engine, llm.engine.runner
    prof.wrap_schedule(core.scheduler)
    prof.wrap(core.scheduler, "update_from_output", "update")
    prof.wrap(runner, "execute", "execute")
    prof.wrap(runner.model, "forward", "forward")
    prof.wrap(runner.model, "compute_logits", "logits")
    prof.wrap(runner.sampler, "sample", "sample")
    if runner.proposer is not None:
        prof.wrap(runner.proposer, "propose", "propose")
    return prof


def run_load(llm, prof: Profile, prompts: list[list[int]], params, concurrency: int) -> dict:
    """A closed loop of `concurrency` requests over the prompts; per request the token ids and the
    times of its first and last token."""
    pending = list(enumerate(prompts))
    ids: dict[int, list[int]] = {}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    inflight: dict[str, int] = {}
    prof.on = True
    t0 = time.perf_counter()
    while pending or inflight:
        while pending and len(inflight) < concurrency:
            i, p = pending.pop(0)
            rid = f"bench-{time.monotonic_ns()}-{i}"
            inflight[rid] = i
            ids[i] = []
            llm.add_request(rid, p, params)
        core_outputs = llm.engine.step()
        outs, to_abort = llm.processor.process_outputs(core_outputs)
        if to_abort:
            llm.engine.abort_requests(to_abort)
        now = time.perf_counter()
        for o in outs:
            i = inflight[o.request_id]
            new = o.outputs[0].delta_token_ids
            if new:
                first.setdefault(i, now)
                last[i] = now
                ids[i] += new
            if o.finished:
                del inflight[o.request_id]
    wall = time.perf_counter() - t0
    prof.on = False
    tokens = sum(len(v) for v in ids.values())
    decode_s = sum(last[i] - first[i] for i in ids if i in first)
    decode_tokens = sum(max(len(v) - 1, 0) for v in ids.values())
    return {
        "wall_s": wall,
        "output_tokens": tokens,
        "tok_s": tokens / wall,
        "tpot_ms": decode_s / max(decode_tokens, 1) * 1e3,
        "ids": [ids[i] for i in range(len(prompts))],
    }


SPEC_KEYS = (
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
    "spec_decode_num_emitted_tokens_total",
)


def stats_delta(before: dict, after: dict) -> dict:
    d = {k: (after.get(k) or 0) - (before.get(k) or 0) for k in SPEC_KEYS}
    a, b = (
        after.get("spec_decode_num_accepted_tokens_per_pos") or [],
        before.get("spec_decode_num_accepted_tokens_per_pos")
        or [0] * len(after.get("spec_decode_num_accepted_tokens_per_pos") or []),
    )
    d["per_pos"] = [x - y for x, y in zip(a, b)]
    return d


def acceptance(d: dict) -> dict:
    drafts, drafted = d["spec_decode_num_drafts"], d["spec_decode_num_draft_tokens_total"]
    accepted, emitted = d["spec_decode_num_accepted_tokens_total"], d["spec_decode_num_emitted_tokens_total"]
    return {
        "verification_steps": drafts,
        "draft_tokens": drafted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "tokens_per_verification_step": emitted / drafts if drafts else 0.0,
        "acceptance_rate_per_pos": [n / drafts if drafts else 0.0 for n in d["per_pos"]],
    }


def chat_ids(llm, text: str) -> list[int]:
    rendered = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return llm.tokenizer.encode(rendered, add_special_tokens=False)


def random_ids(llm, num: int, input_len: int, output_len: int) -> list[list[int]]:
    from fdcli.bench.datasets import DatasetOptions, random_requests
    from fdcli.bench.tokenize import wrap_fd_tokenizer

    opts = DatasetOptions(random_input_len=input_len, random_output_len=output_len)
    reqs = random_requests(opts, wrap_fd_tokenizer(llm.tokenizer), num, seed=0)
    return [llm.tokenizer.encode(r.prompt, add_special_tokens=False) for r in reqs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--method", default="ngram", help="ngram (ngram_match), mtp or draft_model")
    ap.add_argument("--num-speculative-tokens", type=int, default=3)
    ap.add_argument("--draft-model", default=None, help='the "model" key (draft_model, a separate MTP)')
    ap.add_argument("--quantization", default=None, help="the target's --quantization (both engines)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=128, help="random prompts' tokens")
    ap.add_argument("--pairs", type=int, default=3, help="alternated plain/spec pairs per load")
    ap.add_argument("--num-random", type=int, default=4, help="random prompts at concurrency 1")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from fdcli_engine import LLM, SamplingParams
    from fdcli_engine.sampling_params import RequestOutputKind

    spec_config = {"method": args.method, "num_speculative_tokens": args.num_speculative_tokens}
    if args.draft_model:
        spec_config["model"] = args.draft_model
    common = dict(max_model_len=2048, max_num_seqs=max(args.concurrency, 1))
    if args.quantization:
        common["quantization"] = args.quantization
    engines = {
        "plain": LLM(args.model, **common),
        "spec": LLM(args.model, speculative_config=spec_config, **common),
    }
    profiles = {name: instrument(llm) for name, llm in engines.items()}
    llm = engines["plain"]
    repetitive = [chat_ids(llm, t) for t in REPETITIVE]
    n_random = max(args.num_random, args.concurrency)
    random_prompts = random_ids(llm, n_random, args.input_len, args.max_tokens)
    delta = RequestOutputKind.DELTA
    greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens, output_kind=delta)
    fixed_len = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, output_kind=delta)
    loads = {  # name: (prompts, params, concurrency, the figure compared)
        "repetitive c1": (repetitive, greedy, 1, "tpot_ms"),
        "random c1": (random_prompts[: args.num_random], fixed_len, 1, "tpot_ms"),
        f"random c{args.concurrency}": (random_prompts, fixed_len, args.concurrency, "tok_s"),
        f"repetitive c{args.concurrency}": (
            repetitive * -(-args.concurrency // len(repetitive)),  # at least one per slot
            greedy,
            args.concurrency,
            "tok_s",
        ),
    }
    for name, eng in engines.items():  # warm-up: kernels, first allocations
        run_load(eng, profiles[name], repetitive[:1], SamplingParams(temperature=0, max_tokens=8), 1)

    result: dict = {"spec_config": spec_config, "max_tokens": args.max_tokens, "loads": {}}
    mismatches = 0
    step_profile: dict[str, dict] = {}
    for load, (prompts, params, concurrency, figure) in loads.items():
        rows: dict[str, list[float]] = {"plain": [], "spec": []}
        spec_stats = {k: 0 for k in SPEC_KEYS}
        spec_stats["per_pos"] = [0] * args.num_speculative_tokens
        for prof in profiles.values():
            prof.clear()
        for pair in range(args.pairs):
            order = ("plain", "spec") if pair % 2 == 0 else ("spec", "plain")
            runs = {}
            for name in order:
                eng = engines[name]
                before = eng.get_stats()
                runs[name] = run_load(eng, profiles[name], prompts, params, concurrency)
                if name == "spec":
                    d = stats_delta(before, eng.get_stats())
                    for k in SPEC_KEYS:
                        spec_stats[k] += d[k]
                    spec_stats["per_pos"] = [x + y for x, y in zip(spec_stats["per_pos"], d["per_pos"])]
                rows[name].append(runs[name][figure])
            mismatches += sum(a != b for a, b in zip(runs["plain"]["ids"], runs["spec"]["ids"]))
        if concurrency == 1:
            step_profile[load] = {name: prof.per_step_ms() for name, prof in profiles.items()}
        ratios = [s / p for p, s in zip(rows["plain"], rows["spec"])]
        result["loads"][load] = {
            "figure": figure,
            "plain": statistics.median(rows["plain"]),
            "spec": statistics.median(rows["spec"]),
            "ratio": statistics.median(ratios),
            "ratios": ratios,
            "mean_output_tokens": runs["spec"]["output_tokens"] / len(prompts),
            **acceptance(spec_stats),
        }
    result["step_profile_ms"] = step_profile
    result["greedy_mismatches"] = mismatches
    report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if mismatches:
        sys.exit(f"{mismatches} greedy outputs differ with speculation: verification is not exact")


BOUNDS = {"repetitive c1": "<=0.6", "random c1": "<=1.05"}


def report(result: dict) -> None:
    print(f"speculative config: {json.dumps(result['spec_config'])}, max_tokens {result['max_tokens']}")
    print(
        f"{'load':18} {'figure':18} {'plain':>9} {'spec':>9} {'ratio':>7} {'bound':>7} {'accept':>7} {'tok/step':>8}"
    )
    for load, r in result["loads"].items():
        figure = "ms/token (TPOT)" if r["figure"] == "tpot_ms" else "output tok/s"
        bound = BOUNDS.get(load, ">=0.95" if r["figure"] == "tok_s" else "")
        print(
            f"{load:18} {figure:18} {r['plain']:9.2f} {r['spec']:9.2f} {r['ratio']:7.3f} {bound:>7} "
            f"{r['acceptance_rate']:7.3f} {r['tokens_per_verification_step']:8.2f}"
        )
    for load, r in result["loads"].items():
        per_pos = ", ".join(f"{x:.2f}" for x in r["acceptance_rate_per_pos"])
        print(
            f"{load}: {r['verification_steps']} verification steps, {r['draft_tokens']} drafts, "
            f"acceptance per position [{per_pos}], {r['mean_output_tokens']:.0f} tokens per request"
        )
    for load, engines in result["step_profile_ms"].items():
        for name, parts in engines.items():
            shown = ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
            print(f"decode-step profile, {load}, {name} (ms per step): {shown}")
    print(f"greedy outputs differing with speculation: {result['greedy_mismatches']}")


if __name__ == "__main__":
    main()
