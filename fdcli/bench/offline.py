"""`fd bench latency` and `fd bench throughput`: the in-process engine, timed.

latency: `num_iters` timed generate() calls of one batch (`batch_size` prompts of `input_len` random
token ids, exactly `output_len` new tokens each: greedy, EOS ignored), after untimed warmups.
throughput: the same with all `num_prompts` submitted at once; tokens/s are counted from what the
engine actually returned, not from the requested lengths. With --speculative-config, the draft
acceptance of the timed iterations (from the engine's stats) is reported as well. latency
--use-beam-search times LLM.beam_search of width --n instead, as vLLM's does; its output tokens are
the returned beams'.
The engine (`fdcli_engine.api.LLM`) is imported inside `run_offline` only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from fdcli_engine.errors import ConfigError

# The clock run_offline times with; a module attribute so tests can substitute a fake one.
clock = time.perf_counter


@dataclass
class OfflineOptions:
    kind: str  # "latency" | "throughput"
    input_len: int
    output_len: int
    batch_size: int  # latency: --batch-size; throughput: --num-prompts
    num_iters_warmup: int
    num_iters: int
    percentiles: str
    output_json: Path | None = None
    n: int = 1  # completions per prompt (vLLM's --n)
    range_ratio: float = 0.0  # throughput: lengths drawn from [len·(1-r), len·(1+r)] (vLLM's random dataset)
    prefix_len: int = 0  # throughput: random token ids shared by every prompt, before its own
    use_beam_search: bool = False  # latency: LLM.beam_search of width n (vLLM's --use-beam-search)


def check_options(opts: OfflineOptions) -> list[float]:
    from fdcli.bench.metrics import parse_percentiles

    count_flag = "--batch-size" if opts.kind == "latency" else "--num-prompts"
    for flag, value in (("--input-len", opts.input_len), ("--output-len", opts.output_len),
                        (count_flag, opts.batch_size), ("--num-iters", opts.num_iters)):  # fmt: skip
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if opts.num_iters_warmup < 0:
        raise ConfigError("--num-iters-warmup must be 0 or more")
    if opts.n < 1:
        raise ConfigError(f"--n must be at least 1, got {opts.n}")
    if not 0 <= opts.range_ratio < 1:
        raise ConfigError(f"--random-range-ratio must be in [0, 1), got {opts.range_ratio}")
    if opts.prefix_len < 0:
        raise ConfigError(f"--prefix-len must be 0 or more, got {opts.prefix_len}")
    return parse_percentiles(opts.percentiles)


def _lengths(rng, center: int, ratio: float, num: int) -> list[int]:
    lo, hi = max(int(center * (1 - ratio)), 1), max(int(center * (1 + ratio)), 1)
    return rng.integers(lo, hi + 1, size=num).tolist()


def build_prompts(opts: OfflineOptions, vocab_size: int, seed: int, make_params):
    """(prompts, sampling params): one SamplingParams for fixed lengths, else one per prompt."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if opts.range_ratio == 0 and opts.prefix_len == 0:
        return random_token_prompts(vocab_size, opts.batch_size, opts.input_len, seed), make_params(
            opts.output_len
        )
    prefix = rng.integers(0, vocab_size, size=opts.prefix_len).tolist()
    in_lens = _lengths(rng, opts.input_len, opts.range_ratio, opts.batch_size)
    out_lens = _lengths(rng, opts.output_len, opts.range_ratio, opts.batch_size)
    prompts = [prefix + rng.integers(0, vocab_size, size=n).tolist() for n in in_lens]
    return prompts, [make_params(n) for n in out_lens]


def random_token_prompts(vocab_size: int, num: int, length: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size, size=(num, length)).tolist()


def time_iterations(run, prompts, params, iters: int, on_iter=None):
    """Run `run(prompts, params)` (generate or beam_search) `iters` times; return (seconds per
    iteration, outputs of the last one)."""
    times, outputs = [], []
    for _ in range(iters):
        t0 = clock()
        outputs = run(prompts, params)
        times.append(clock() - t0)
        if on_iter is not None:
            on_iter()
    return times, outputs


def summarize_offline(
    opts: OfflineOptions, times: list[float], prompts: list[list[int]], outputs, percentiles: list[float]
) -> dict:
    from fdcli.bench.metrics import summarize

    in_tokens, out_tokens = _token_counts(prompts, outputs)
    mean_s = sum(times) / len(times)
    return {
        "num_prompts": len(outputs),
        "input_tokens_per_iter": in_tokens,
        "output_tokens_per_iter": out_tokens,
        "latency": summarize(times, percentiles),
        "mean_latency_s": mean_s,
        "request_throughput": len(outputs) / mean_s,
        "output_throughput": out_tokens / mean_s,
        "total_token_throughput": (in_tokens + out_tokens) / mean_s,
    }


def _token_counts(prompts: list[list[int]], outputs) -> tuple[int, int]:
    """(prompt tokens, generated tokens) of generate()'s RequestOutputs, or of beam_search()'s
    outputs (one per prompt), whose every sequence holds its prompt and then its own tokens."""
    if outputs and hasattr(outputs[0], "sequences"):
        out_tokens = sum(len(seq.tokens) - len(p) for p, o in zip(prompts, outputs) for seq in o.sequences)
        return sum(len(p) for p in prompts), out_tokens
    out_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return sum(len(o.prompt_token_ids) for o in outputs), out_tokens


def spec_decode_summary(before: dict, after: dict) -> dict:
    """The timed iterations' speculative decoding, from the engine's stats before and after them
    (`{}` without --speculative-config: the stats then carry no spec_decode keys)."""
    if "spec_decode_num_draft_tokens_total" not in after:
        return {}

    def grew(key: str) -> int:
        return (after.get(key) or 0) - (before.get(key) or 0)

    steps, drafted = grew("spec_decode_num_drafts"), grew("spec_decode_num_draft_tokens_total")
    accepted, emitted = (
        grew("spec_decode_num_accepted_tokens_total"),
        grew("spec_decode_num_emitted_tokens_total"),
    )
    return {
        "spec_decode": {
            "num_drafts": steps,
            "num_draft_tokens": drafted,
            "num_accepted_tokens": accepted,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_acceptance_length": emitted / steps if steps else 0.0,  # tokens per verification step
        }
    }


def offline_table(kind: str, metrics: dict):
    from rich.table import Table

    t = Table(title=f"fd bench {kind}", show_header=False, title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("Prompts per iteration", f"{metrics['num_prompts']}")
    t.add_row("Output tokens per iteration", f"{metrics['output_tokens_per_iter']}")
    t.add_row("Request throughput (req/s)", f"{metrics['request_throughput']:.2f}")
    t.add_row("Output token throughput (tok/s)", f"{metrics['output_throughput']:.2f}")
    t.add_row("Total token throughput (tok/s)", f"{metrics['total_token_throughput']:.2f}")
    for key, value in metrics["latency"].items():
        t.add_row(f"Iteration latency {key.removesuffix('_ms')} (ms)", f"{value:.2f}")
    spec = metrics.get("spec_decode")
    if spec is not None:
        t.add_row("Draft acceptance rate", f"{spec['draft_acceptance_rate']:.3f}")
        t.add_row("Tokens per verification step", f"{spec['mean_acceptance_length']:.2f}")
    return t


def run_offline(opts: OfflineOptions, engine_args: dict) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from fdcli.bench.results import build_result, save_result
    from fdcli.bench.vllm_result import vllm_offline_keys
    from fdcli.console import console, err_console
    from fdcli_engine.api import LLM
    from fdcli_engine.sampling_params import SamplingParams

    percentiles = check_options(opts)
    llm = LLM(**engine_args)
    seed = int(engine_args.get("seed") or 0)
    if opts.use_beam_search:
        from fdcli_engine.beam_search import BeamSearchParams

        def make_params(n: int):
            return BeamSearchParams(beam_width=opts.n, max_tokens=n, ignore_eos=True)

        def run(prompts, params):
            return llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)

    else:

        def make_params(n: int):
            return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, n=opts.n)

        def run(prompts, params):
            return llm.generate(prompts, params, use_tqdm=False)

    prompts, params = build_prompts(opts, llm.tokenizer.vocab_size, seed, make_params)
    # throughput warms up on a small batch: a full warmup would double the run for no information.
    num_warm = len(prompts) if opts.kind == "latency" else min(len(prompts), 4)
    warm_params = params[:num_warm] if isinstance(params, list) else params
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err_console) as bar:
        warm = bar.add_task("warmup", total=opts.num_iters_warmup)
        time_iterations(
            run, prompts[:num_warm], warm_params, opts.num_iters_warmup, lambda: bar.advance(warm)
        )
        timed = bar.add_task(opts.kind, total=opts.num_iters)
        before = llm.get_stats()
        times, outputs = time_iterations(run, prompts, params, opts.num_iters, lambda: bar.advance(timed))
    metrics = summarize_offline(opts, times, prompts, outputs, percentiles)
    metrics.update(spec_decode_summary(before, llm.get_stats()))
    console.print(offline_table(opts.kind, metrics))
    if opts.output_json is not None:
        config = {**{k: v for k, v in vars(opts).items() if k != "output_json"}, "engine": engine_args}
        config["percentiles"] = percentiles
        result = build_result(opts.kind, config, metrics)
        result.update(vllm_offline_keys(opts.kind, times, metrics, percentiles))  # vLLM's scripts read these
        save_result(opts.output_json, result)
    return metrics


def vllm_offline_flags(
    kind: str,
    backend: str = "vllm",
    dataset_name: str = "random",
    async_engine=False,
    disable_detokenize=False,
) -> list[str]:
    """Refuse the `vllm bench latency|throughput` choices fd has no counterpart of; notes for the
    flags that are accepted with no effect."""
    if backend != "vllm":
        raise ConfigError(
            f"--backend {backend!r} is not supported: fd bench {kind} runs fd's engine in-process "
            "(vLLM's 'vllm' backend); benchmark a server with fd bench serve"
        )
    if dataset_name != "random":
        raise ConfigError(
            f"--dataset-name {dataset_name!r} is not supported: fd bench {kind} sends random token ids; "
            f"for {dataset_name} prompts run fd bench serve --dataset-name {dataset_name} against fd serve"
        )
    notes = []
    if async_engine:
        notes.append(
            "note: --async-engine has no effect: fd's in-process engine has one mode; "
            "fd bench serve measures the server's async front end"
        )
    if disable_detokenize:
        notes.append(
            "note: --disable-detokenize has no effect: fd's engine always detokenizes, so that time is "
            "included in the measurement"
        )
    return notes
