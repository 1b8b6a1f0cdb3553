"""vLLM's return_tokens_as_token_ids through the official openai SDK against a real `fd serve` (tiny
random Llama) started with --return-tokens-as-token-ids: logprobs name every token "token_id:N" (the
sampled ones, the alternatives and, with echo, the prompt's), the same ids the choice's token_ids
list; a request's return_tokens_as_token_ids false gives the decoded text back."""

from __future__ import annotations

import pytest

MSGS = [{"role": "user", "content": "the quick brown fox"}]


@pytest.fixture(scope="module")
def srv(tiny_model, tmp_path_factory):
    from server.fd_server import start_server

    s = start_server(
        tiny_model,
        tmp_path_factory.mktemp("ids"),
        "--served-model-name",
        "tiny",
        "--return-tokens-as-token-ids",
    )
    yield s
    assert s.stop() == 0, s.log.read_text()[-3000:]


def _id(text: str) -> int:
    assert text.startswith("token_id:"), text
    return int(text.removeprefix("token_id:"))


def test_chat_logprobs_name_tokens_by_id(srv):
    client = srv.client()
    kw = dict(model="tiny", messages=MSGS, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    raw = client.chat.completions.with_raw_response.create(**kw, extra_body={"return_token_ids": True})
    assert "fd-ignored-fields" not in raw.headers
    choice = raw.parse().choices[0]
    content = choice.logprobs.content
    assert [_id(t.token) for t in content] == choice.model_extra["token_ids"]
    for t in content:
        assert t.bytes == list(t.token.encode()) and len(t.top_logprobs) == 2
        assert all(_id(top.token) >= 0 for top in t.top_logprobs)
    streamed = [
        t.token
        for chunk in client.chat.completions.create(**kw, stream=True)
        for c in chunk.choices
        for t in (c.logprobs.content if c.logprobs else [])
    ]
    assert streamed == [t.token for t in content]
    text = client.chat.completions.create(**kw, extra_body={"return_tokens_as_token_ids": False})
    tokens = [t.token for t in text.choices[0].logprobs.content]
    assert "".join(tokens) == text.choices[0].message.content and not any(
        t.startswith("token_id:") for t in tokens
    )


def test_completion_logprobs_name_prompt_and_output_tokens_by_id(srv):
    client = srv.client()
    with srv.http() as h:
        prompt_ids = h.post("/tokenize", json={"prompt": "hello world"}).json()["tokens"]
    r = client.completions.create(
        model="tiny", prompt="hello world", max_tokens=4, temperature=0, logprobs=1, echo=True,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = r.choices[0]
    lp = choice.logprobs
    assert [_id(t) for t in lp.tokens] == prompt_ids + choice.model_extra["token_ids"]
    assert lp.top_logprobs[0] is None and all(_id(k) >= 0 for d in lp.top_logprobs[1:] for k in d)
    # vLLM's offsets: each token counts as the length of its "token_id:N" text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    text = client.completions.create(
        model="tiny", prompt="hello world", max_tokens=4, temperature=0, logprobs=1,
        extra_body={"return_tokens_as_token_ids": False},
    )  # fmt: skip
    assert "".join(text.choices[0].logprobs.tokens) == text.choices[0].text


def test_request_asks_where_the_server_does_not(server):
    r = server.client().completions.create(
        model="tiny", prompt="hello", max_tokens=3, temperature=0, logprobs=0,
        extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True},
    )  # fmt: skip
    assert [_id(t) for t in r.choices[0].logprobs.tokens] == r.choices[0].model_extra["token_ids"]
    plain = server.client().completions.create(model="tiny", prompt="hello", max_tokens=3, logprobs=0)
    assert not any(t.startswith("token_id:") for t in plain.choices[0].logprobs.tokens)
