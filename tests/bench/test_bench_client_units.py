"""Stream handling and counting rules of one request, without a server; tokenizer loading fallbacks."""

import pytest
from bench_support import train_bpe

from fdcli.bench.client import (
    BackendConfig,
    StreamError,
    _StreamState,
    build_payload,
    finalize_counts,
    handle_event,
)
from fdcli.bench.datasets import SampleRequest
from fdcli.bench.metrics import RequestRecord
from fdcli.bench.results import compare_rows
from fdcli.bench.tokenize import default_tokenizer_path, load_tokenizer


def _feed(events, chat=False):
    state, record = _StreamState(), RequestRecord(index=0)
    for t, data in enumerate(events):
        handle_event(data, state, record, float(t), chat)
    return state, record


def test_chat_reasoning_and_content_both_count_role_only_chunk_does_not():
    events = [
        '{"choices": [{"delta": {"role": "assistant"}}]}',
        '{"choices": [{"delta": {"reasoning_content": "think "}}]}',
        '{"choices": [{"delta": {"content": "answer", "reasoning_content": null}}]}',
        '{"choices": [{"delta": {"content": null}, "finish_reason": "stop"}]}',
    ]
    state, record = _feed(events, chat=True)
    assert state.texts == ["think ", "answer"] and record.chunk_times == [1.0, 2.0]
    assert state.finished and not state.done


def test_a_token_whose_text_is_held_back_is_an_arrival():
    """A chunk with empty text and no finish reason is a token the server holds the text of (part of a
    character): it arrives at its step, as vLLM's client counts it; skipping it made the next gap span
    two steps. An empty chunk that ends the choice, or opens it with the role, is no token."""
    events = [
        '{"choices": [{"text": "a"}]}',
        '{"choices": [{"text": ""}]}',
        '{"choices": [{"text": "\u00e9b"}]}',
        '{"choices": [{"text": "", "finish_reason": "length"}]}',
        '{"choices": [], "usage": {"completion_tokens": 3}}',
    ]
    state, record = _feed(events)
    assert record.chunk_times == [0.0, 1.0, 2.0] and state.texts == ["a", "", "\u00e9b"]
    finalize_counts(record, state, SampleRequest("p", 5, 3), None)
    assert record.chunk_tokens == [1, 1, 1]  # one token a chunk: exact per-token ITL
    chat = [
        '{"choices": [{"delta": {"role": "assistant", "content": ""}}]}',
        '{"choices": [{"delta": {"content": "a"}}]}',
        '{"choices": [{"delta": {"content": ""}}]}',
        '{"choices": [{"delta": {}, "finish_reason": "stop"}]}',
    ]
    state, record = _feed(chat, chat=True)
    assert record.chunk_times == [1.0, 2.0] and state.texts == ["a", ""]


def test_error_object_and_non_object_json_are_stream_errors():
    with pytest.raises(StreamError, match="error in stream: bad"):
        _feed(['{"error": {"message": "bad"}}'])
    with pytest.raises(StreamError, match="expected a JSON object"):
        _feed(["[1, 2]"])


def test_counts_prefer_usage_then_tokenizer_then_chunks(word_tokenizer):
    state, record = _feed(['{"choices": [{"text": "a b"}]}', '{"choices": [{"text": "c"}]}'])
    req = SampleRequest("p", 5, 3)
    state.usage = {"completion_tokens": 3, "prompt_tokens": 9}
    finalize_counts(record, state, req, word_tokenizer)
    assert (record.output_tokens, record.output_tokens_source, record.prompt_len) == (3, "usage", 9)
    assert record.chunk_tokens == [2, 1]
    # Usage says 4 but the chunks tokenize to 3: per-chunk counts are not exact, so none are claimed.
    state.usage = {"completion_tokens": 4}
    finalize_counts(record, state, req, word_tokenizer)
    assert record.chunk_tokens is None and record.prompt_len == 5
    state.usage = None
    finalize_counts(record, state, req, None)
    assert (record.output_tokens, record.output_tokens_source, record.chunk_tokens) == (2, "chunks", [1, 1])


def test_payload_only_sends_optional_fields_when_set():
    cfg = BackendConfig(base_url="http://x", model="m")
    body = build_payload(cfg, SampleRequest("hi", None, 7))
    assert body == {
        "model": "m", "prompt": "hi", "max_tokens": 7, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip  # no temperature unless given: the server's default applies, as in vLLM
    cfg.temperature = 0.0
    assert build_payload(cfg, SampleRequest("hi", None, 7))["temperature"] == 0.0
    cfg.include_usage = False
    assert "stream_options" not in build_payload(cfg, SampleRequest("hi", None, 7))
    assert BackendConfig(base_url="http://x/", backend="openai-chat").url == "http://x/v1/chat/completions"


def test_tokenizer_loading_fallbacks(tmp_path):
    tok = train_bpe()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded, note = load_tokenizer(str(tmp_path))
    assert loaded is not None and loaded.encode("the quick fox") == tok.encode("the quick fox").ids
    assert loaded.vocab_size == tok.get_vocab_size()
    assert load_tokenizer("no/such/path")[0] is None
    (tmp_path / "empty").mkdir()
    missing, note = load_tokenizer(str(tmp_path / "empty"))
    assert missing is None and "could not load a tokenizer" in note


def test_a_hugging_face_id_loads_from_the_local_cache(tmp_path, monkeypatch):
    """`fd bench serve --model org/name` (vLLM's line): the tokenizer of the id's cached snapshot."""
    import huggingface_hub.constants

    tok = train_bpe()
    snapshot = tmp_path / "models--org--tok" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    tok.save(str(snapshot / "tokenizer.json"))
    (tmp_path / "models--org--tok" / "refs").mkdir()
    (tmp_path / "models--org--tok" / "refs" / "main").write_text("abc")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    loaded, note = load_tokenizer("org/tok")
    assert loaded is not None and loaded.encode("the quick fox") == tok.encode("the quick fox").ids, note
    assert default_tokenizer_path("org/tok") == "org/tok"
    missing, note = load_tokenizer("org/absent")
    assert missing is None and "neither a local path nor in the Hugging Face cache" in note
    assert default_tokenizer_path("org/absent") != "org/absent"


def test_compare_rows_ratios_handle_missing_and_zero_baselines():
    a = {"metrics": {"x": 2.0, "y": 0.0, "g": {"p50_ms": 10.0}}}
    b = {"metrics": {"x": 3.0, "y": 1.0, "z": 5.0, "g": {"p50_ms": 5.0}}}
    rows = {name: (values, ratios) for name, values, ratios in compare_rows([a, b])}
    assert rows["x"] == ([2.0, 3.0], [1.0, 1.5])
    assert rows["y"] == ([0.0, 1.0], [None, None])  # no ratio against a zero baseline
    assert rows["z"] == ([None, 5.0], [None, None])
    assert rows["g.p50_ms"] == ([10.0, 5.0], [1.0, 0.5])
