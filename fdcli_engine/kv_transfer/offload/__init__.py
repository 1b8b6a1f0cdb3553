"""The KV offload tiers: blocks the pool evicts or a preemption frees wait in memory (`--swap-space`,
optionally int8-compressed) and in files (`--kv-offload-dir`) and come back on a prefix hit or a resume
(see connector.py for what goes where, docs/kv-offload.md for the flags and metrics)."""
