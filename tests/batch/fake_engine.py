"""A model-free EngineClient for run-batch tests that need many lines fast: every request "generates"
the same few tokens at once. Its tokenizer maps each character to one token id."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

from fdcli_engine.outputs import CompletionOutput, RequestOutput


class CharTokenizer:
    vocab_size = 256
    eos_token_ids = [0]

    def encode(self, text, add_special_tokens=True):
        return [min(ord(c), 255) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True, chat_template=None, **kw):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + (
            "<assistant>" if add_generation_prompt else ""
        )


@dataclass
class _ModelConfig:
    served_model_name: str = "tiny"
    max_model_len: int = 1 << 16
    vocab_size: int = 256
    default_sampling_params: dict = field(default_factory=dict)
    max_logprobs: int = 20  # --max-logprobs (fdcli_engine.api.protocol.ModelConfig)


class FakeEngine:
    def __init__(self, reply: str = "ok!", finish_reason: str = "length"):
        self.tokenizer = CharTokenizer()
        self.model_config = _ModelConfig()
        self.config = SimpleNamespace(max_num_seqs=32)
        self.is_ready = self.was_ready = True
        self.is_dead = False
        self.dead_reason = None
        self.ready_event = asyncio.Event()
        self.ready_event.set()
        self.reply = reply
        self.finish_reason = finish_reason
        self.num_requests = 0

    async def generate(self, prompt_token_ids, params, request_id, prompt=None):
        self.num_requests += 1
        ids = self.tokenizer.encode(self.reply)[: params.max_tokens]
        comp = CompletionOutput(
            0,
            self.tokenizer.decode(ids),
            ids,
            finish_reason=self.finish_reason,
            delta_text=self.tokenizer.decode(ids),
            delta_token_ids=ids,
        )
        yield RequestOutput(request_id, prompt, list(prompt_token_ids), [comp], finished=True)

    def abort(self, request_id):
        pass

    async def get_stats(self):
        return {}

    async def start(self):
        pass

    async def shutdown(self, timeout=5.0):
        pass
