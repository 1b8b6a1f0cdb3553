"""What a JSON-schema constraint costs the engine, same load with and without it, one run.

Load: closed loops of chat requests (SmolLM2 by default, greedy, exactly --output-len tokens) at
concurrency 16 and 1, run in alternated pairs (unconstrained, then every request with the same
json_schema), --repeats pairs per concurrency. Prints output tokens/s at 16 and time per output token
at 1 for both, and the ratios (constrained / unconstrained; the issue's bounds: throughput >= 0.9x,
time per token <= 1.1x). The constrained outputs are checked: each whose JSON completed parses and
validates against the schema (jsonschema), else the run fails; how many completed is printed.

Also prints the grammar backend's compile time of a schema seen for the first time and of the same
schema again (a cache hit), from the engine's own backend.

    python benchmarks/bench_structured_outputs.py [--model PATH] [--num-requests 32]
        [--output-len 64] [--repeats 3] [--json out.json]

Run it when nothing else is busy: both loads share the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "hobbies", "city"],
    "additionalProperties": False,
}
PEOPLE = ["a chess teacher", "a retired sailor", "a young painter", "a baker", "a pilot", "a nurse"]


def prompt_ids(llm, i: int) -> list[int]:
    messages = [
        {
            "role": "user",
            "content": f"Describe {PEOPLE[i % len(PEOPLE)]} number {i} as JSON with the keys name, age, "
            "hobbies and city.",
        }
    ]
    text = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return llm.tokenizer.encode(text, add_special_tokens=False)


def closed_loop(llm, prompts, params, concurrency: int) -> tuple[float, int, list[tuple[str, int]]]:
    """(seconds, output tokens, [(text, last token id)] per request) of a closed loop of `concurrency`
    requests over the engine."""
    pending = list(enumerate(prompts))
    texts: dict[str, str] = {}
    last: dict[str, int] = {}
    tokens, inflight = 0, 0
    t0 = time.perf_counter()
    while pending or inflight:
        while pending and inflight < concurrency:
            i, ids = pending.pop(0)
            llm.add_request(f"bench-{time.monotonic_ns()}-{i}", ids, params, index=0)
            inflight += 1
        outs, _ = llm.processor.process_outputs(llm.engine.step())
        for o in outs:
            out = o.outputs[0]
            tokens += len(out.delta_token_ids)
            texts[o.request_id] = texts.get(o.request_id, "") + out.delta_text
            if out.delta_token_ids:
                last[o.request_id] = out.delta_token_ids[-1]
            inflight -= o.finished
    return time.perf_counter() - t0, tokens, [(texts[r], last.get(r, -1)) for r in texts]


def check_outputs(outputs: list[tuple[str, int]], eos_ids: set[int]) -> int:
    """Every constrained output whose grammar completed (it then runs on EOS to --output-len, as
    ignore_eos keeps it going) validates against the schema; returns how many completed."""
    import jsonschema

    done = [text for text, last in outputs if last in eos_ids]
    for text in done:
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except (ValueError, jsonschema.ValidationError) as exc:
            sys.exit(f"a constrained output does not validate: {exc}\n{text!r}")
    return len(done)


def compile_times(llm) -> dict:
    """First and repeated compile of a new schema on the engine's backend (ms)."""
    from fdcli_engine.structured_output import StructuredOutputsParams, get_backend

    backend = get_backend("auto", llm.tokenizer, llm.engine.vocab_size)
    fresh = dict(SCHEMA, title=f"fresh-{time.monotonic_ns()}")
    params = StructuredOutputsParams(json=fresh)
    t0 = time.perf_counter()
    backend.compile(params)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    backend.compile(StructuredOutputsParams(json=fresh))
    again = time.perf_counter() - t0
    return {"compile_first_ms": first * 1e3, "compile_cached_ms": again * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from fdcli_engine import LLM, SamplingParams
    from fdcli_engine.sampling_params import RequestOutputKind
    from fdcli_engine.structured_output import StructuredOutputsParams

    llm = LLM(args.model, max_model_len=1024, max_num_seqs=16)
    prompts = [prompt_ids(llm, i) for i in range(args.num_requests)]
    # ignore_eos: both loads generate exactly --output-len tokens per request, so they do the same
    # forwards; a constrained request whose JSON is complete goes on with EOS tokens (its mask allows
    # nothing else), which is the cheap end of the grammar's cost.
    base = dict(
        temperature=0, max_tokens=args.output_len, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    plain = SamplingParams(**base)
    constrained = SamplingParams(**base, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    closed_loop(llm, prompts[:4], constrained, 4)  # warm-up: kernels, the schema's compilation
    closed_loop(llm, prompts[:4], plain, 4)

    result: dict = {"output_len": args.output_len, "num_requests": args.num_requests}
    for concurrency in (16, 1):
        n = args.num_requests if concurrency > 1 else max(4, args.num_requests // 8)
        ratios, rows, completed = [], [], 0
        for _ in range(args.repeats):
            t_u, n_u, _ = closed_loop(llm, prompts[:n], plain, concurrency)
            t_c, n_c, outputs = closed_loop(llm, prompts[:n], constrained, concurrency)
            completed += check_outputs(outputs, set(llm.tokenizer.eos_token_ids))
            if concurrency > 1:  # throughput: tokens/s
                u, c = n_u / t_u, n_c / t_c
                ratios.append(c / u)
            else:  # time per output token, ms
                u, c = t_u / n_u * 1e3, t_c / n_c * 1e3
                ratios.append(c / u)
            rows.append((u, c))
        key = "c16_tok_s" if concurrency > 1 else "c1_ms_per_token"
        result[key] = {
            "unconstrained": statistics.median(r[0] for r in rows),
            "json_schema": statistics.median(r[1] for r in rows),
            "ratio": statistics.median(ratios),
            "ratios": ratios,
            "json_completed_within_output_len": f"{completed}/{n * args.repeats}",
        }
    result.update(compile_times(llm))

    c16, c1 = result["c16_tok_s"], result["c1_ms_per_token"]
    print(f"{'load':28} {'unconstrained':>14} {'json_schema':>12} {'ratio':>7} {'bound':>7}")
    print(
        f"{'c16 output tok/s':28} {c16['unconstrained']:14.1f} {c16['json_schema']:12.1f} "
        f"{c16['ratio']:7.3f} {'>=0.9':>7}"
    )
    print(
        f"{'c1 ms per output token':28} {c1['unconstrained']:14.2f} {c1['json_schema']:12.2f} "
        f"{c1['ratio']:7.3f} {'<=1.1':>7}"
    )
    print(
        f"constrained outputs whose JSON completed within --output-len (validated): "
        f"c16 {c16['json_completed_within_output_len']}, c1 {c1['json_completed_within_output_len']}"
    )
    print(
        f"schema compile: first {result['compile_first_ms']:.2f} ms, "
        f"repeated (cache hit) {result['compile_cached_ms']:.3f} ms"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
