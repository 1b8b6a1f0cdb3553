"""KV blocks that leave one engine's pool and come back: the connector interface (`base.py`) and its
implementations (an offload tier; the prefill → decode transfer)."""
