"""Run one offline engine in a fresh process and print its completions as JSON (the tensor-parallel
tests' TP=2 runs: each engine's collective group lives in its own process).

    python tests/parallel/tp_generate.py '{"model": ..., "options": {...}, "prompts": [[ids]], "params": {...}}'
prints {"outputs": [{"token_ids", "logprobs": [{token: logprob}] | null, "prompt_logprobs"}], "stats"}.
"params" is one SamplingParams dict or one per prompt; "structured_outputs" in it is a
StructuredOutputsParams dict."""

from __future__ import annotations

import json
import sys


def _params(d: dict):
    from fdcli_engine import SamplingParams
    from fdcli_engine.structured_output import StructuredOutputsParams

    d = dict(d)
    if d.get("structured_outputs") is not None:
        d["structured_outputs"] = StructuredOutputsParams(**d["structured_outputs"])
    return SamplingParams(**d)


def _prompt_logprobs(o):
    if o.prompt_logprobs is None:
        return None
    return [None if d is None else {str(t): lp.logprob for t, lp in d.items()} for d in o.prompt_logprobs]


def main(spec: dict) -> dict:
    from fdcli_engine import LLM

    llm = LLM(spec["model"], **spec["options"])
    raw = spec["params"]
    params = [_params(p) for p in raw] if isinstance(raw, list) else _params(raw)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]], params)
        stats = llm.engine.get_stats()
    finally:
        llm.engine.shutdown()
    result = []
    for o in outs:
        c = o.outputs[0]
        lps = [{str(t): lp.logprob for t, lp in d.items()} for d in c.logprobs] if c.logprobs else None
        result.append(
            {"token_ids": list(c.token_ids), "logprobs": lps, "prompt_logprobs": _prompt_logprobs(o)}
        )
    return {"outputs": result, "stats": stats}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
