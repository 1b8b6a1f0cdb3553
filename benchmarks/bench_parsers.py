"""Output parsers on adversarial text: time per call at 10 KB and 100 KB of each hostile input, and the
ratio between the two (linear: about 10; quadratic: about 100). Pure Python, no model, one thread.

    python benchmarks/bench_parsers.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

from fdcli_engine.entrypoints.openai.reasoning import DeepSeekR1Parser, ThinkParser
from fdcli_engine.entrypoints.openai.reasoning_ernie import ErnieX1ReasoningParser
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter
from fdcli_engine.entrypoints.openai.tool_parsers import ErnieX1ToolParser

# name -> a unit repeated to the target size
UNITS = {
    "unclosed <tool_call>": "<tool_call>",
    "unclosed <tool_call>{": "<tool_call>{",
    "closing tags only": "</tool_call>",
    "open+close, bad JSON": "<tool_call>{x</tool_call>",
    "partial tags": "<tool_cal</thin<respons",
    "nested brackets": "[",
}

PARSERS = {
    "ernie-x1 tools+reasoning": lambda t: OutputSplitter(ErnieX1ReasoningParser, ErnieX1ToolParser).split(t),
    "ernie-x1 tools only": lambda t: OutputSplitter(None, ErnieX1ToolParser).split(t),
    "think (qwen3) stream": lambda t: _stream(ThinkParser(), t),
    "deepseek_r1 stream": lambda t: _stream(DeepSeekR1Parser(), t),
}


def _stream(parser, text: str, piece: int = 4096) -> None:
    for i in range(0, len(text), piece):
        parser.feed(text[i : i + piece])
    parser.feed("", final=True)


def _best_ms(fn, text: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(text)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"{'parser':28} {'input':24} {'10 KB ms':>9} {'100 KB ms':>10} {'ratio':>6}")
    for pname, fn in PARSERS.items():
        for uname, unit in UNITS.items():
            small = unit * (10_000 // len(unit))
            large = unit * (100_000 // len(unit))
            t_small, t_large = _best_ms(fn, small, args.repeats), _best_ms(fn, large, args.repeats)
            print(f"{pname:28} {uname:24} {t_small:9.3f} {t_large:10.3f} {t_large / max(t_small, 1e-6):6.1f}")


if __name__ == "__main__":
    main()
