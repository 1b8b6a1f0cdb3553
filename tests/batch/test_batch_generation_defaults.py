"""fd run-batch lines take the model's sampling defaults (--generation-config) for what they leave out,
through the same serving layer as the server; a line's own max_tokens wins (model-free engine)."""

from __future__ import annotations

from batch_helpers import chat_line, read_jsonl, write_jsonl
from fake_engine import FakeEngine

from fdcli_engine.entrypoints.batch import BatchOptions, run_batch


class RecordingEngine(FakeEngine):
    def __init__(self):
        super().__init__(reply="hello world")
        self.model_config.default_sampling_params = {"max_tokens": 2, "top_k": 1}
        self.params = {}

    async def generate(self, prompt_token_ids, params, request_id, prompt=None):
        self.params[request_id] = params
        async for out in super().generate(prompt_token_ids, params, request_id, prompt):
            yield out


def test_lines_take_the_defaults_and_their_own_values_win(tmp_path):
    bare = chat_line("bare", "x")
    del bare["body"]["max_tokens"], bare["body"]["temperature"]
    src = write_jsonl(tmp_path / "in.jsonl", [bare, chat_line("own", "y", max_tokens=5, top_k=3)])
    engine = RecordingEngine()
    out = tmp_path / "out.jsonl"
    summary = run_batch(BatchOptions(src, out, progress=False), {}, lambda _: engine)
    assert summary.succeeded == 2, read_jsonl(out)
    texts = {
        r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in read_jsonl(out)
    }
    assert texts == {"bare": "he", "own": "hello"}
    params = sorted(engine.params.values(), key=lambda p: p.max_tokens)
    assert [(p.max_tokens, p.top_k, p.temperature) for p in params] == [(2, 1, 1.0), (5, 3, 0)]
