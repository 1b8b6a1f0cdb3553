"""Run one offline engine in a fresh process and print its completions as JSON (the tensor-parallel
tests' TP=2 runs: each engine's collective group lives in its own process).

    python tests/parallel/tp_generate.py '{"model": ..., "options": {...}, "prompts": [[ids]], "params": {...}}'
prints {"outputs": [{"token_ids": [...], "logprobs": [{token: logprob}, ...] | null}], "stats": {...}}."""

from __future__ import annotations

import json
import sys


def main(spec: dict) -> dict:
    from fdcli_engine import LLM, SamplingParams

    llm = LLM(spec["model"], **spec["options"])
    try:
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in spec["prompts"]], SamplingParams(**spec["params"])
        )
        stats = llm.engine.get_stats()
    finally:
        llm.engine.shutdown()
    result = []
    for o in outs:
        c = o.outputs[0]
        lps = [{str(t): lp.logprob for t, lp in d.items()} for d in c.logprobs] if c.logprobs else None
        result.append({"token_ids": list(c.token_ids), "logprobs": lps})
    return {"outputs": result, "stats": stats}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
