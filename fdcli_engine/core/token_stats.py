"""The scheduler's token counts behind vLLM's prompt-source counters and its tokens-per-step histogram
(vllm/v1/metrics/stats.py PromptTokenStats, loggers.py iteration_tokens_total), as cumulative numbers
in the engine's stats snapshot: the front end only renders them (entrypoints/openai/vllm_metrics.py).

A prompt is counted once, when the scheduler first admits it (where prompt_tokens_total counts it; a
preempted request is not counted again), split by where its K/V came from:

    local_compute + local_cache_hit + external_kv_transfer - recomputed = prompt tokens
    local_cache_hit + external_kv_transfer - recomputed = cached

`cached`: the prefix cache's hit plus what a KV connector loaded (the request's num_cached_tokens).
`recomputed`: tokens the prefix cache holds that the prefill computes again, because at least one
prompt token must be computed for the logits: the last block of a prompt the cache holds whole
(KVCacheManager.num_recomputed_tokens). They are outside `cached`, so local_compute counts them, and
local_cache_hit counts them too (vLLM's bookkeeping): the sources add up to the prompt once they are
subtracted.
"""

from __future__ import annotations

# vLLM's bounds of vllm:iteration_tokens_total (loggers.py).
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class PromptTokenSources:
    def __init__(self) -> None:
        self.local_compute = 0
        self.local_cache_hit = 0
        self.external_kv_transfer = 0
        self.recomputed = 0

    def record(self, num_prompt: int, num_hit: int, num_loaded: int, num_recomputed: int) -> None:
        """One prompt's first admission: `num_hit` tokens from the prefix cache, `num_loaded` from a KV
        connector, `num_recomputed` of the cached ones computed again."""
        self.local_compute += num_prompt - num_hit - num_loaded
        self.local_cache_hit += num_hit + num_recomputed
        self.external_kv_transfer += num_loaded
        self.recomputed += num_recomputed

    def as_dict(self) -> dict:
        return {
            "prompt_tokens_local_compute": self.local_compute,
            "prompt_tokens_local_cache_hit": self.local_cache_hit,
            "prompt_tokens_external_kv_transfer": self.external_kv_transfer,
            # The module docstring's second identity.
            "prompt_tokens_cached": self.local_cache_hit + self.external_kv_transfer - self.recomputed,
            "prompt_tokens_recomputed": self.recomputed,
        }


class IterationTokens:
    """vLLM's tokens per engine step: the prompt tokens the step counted (prompts it admitted first)
    plus the tokens it generated, observed for each step that counted any, so the histogram's sum is
    prompt_tokens_total + generation_tokens_total. Per-bucket counts (not cumulative; the last is
    +Inf), so that data-parallel ranks' snapshots add up position by position (api/dp_stats.py)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(ITERATION_TOKENS_BUCKETS) + 1)
        self.sum = 0
        self.count = 0

    def observe(self, num_tokens: int) -> None:
        i = next((i for i, b in enumerate(ITERATION_TOKENS_BUCKETS) if num_tokens <= b), -1)
        self.counts[i] += 1
        self.sum += num_tokens
        self.count += 1

    def as_dict(self) -> dict:
        return {
            "iteration_tokens_buckets": list(self.counts),
            "iteration_tokens_sum": self.sum,
            "iteration_tokens_count": self.count,
        }
