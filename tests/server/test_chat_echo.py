"""vLLM's chat `echo` through the openai SDK: an answer continuing the last message's role starts with
that message's text (streamed: right after the role delta); an answer in a new turn is unchanged."""

from __future__ import annotations

OPEN = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the quick"}]
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


def _chat(server, messages, stream=False, **body):
    return server.client().chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, temperature=0, stream=stream, extra_body=body
    )


def test_echo_prefixes_the_continued_message(server):
    plain = _chat(server, OPEN, **CONTINUE).choices[0].message.content
    echoed = _chat(server, OPEN, echo=True, **CONTINUE).choices[0].message.content
    assert echoed == "the quick" + plain


def test_echo_streams_the_message_first(server):
    full = _chat(server, OPEN, echo=True, **CONTINUE).choices[0].message.content
    deltas = [
        c.choices[0].delta.content
        for c in _chat(server, OPEN, stream=True, echo=True, **CONTINUE)
        if c.choices
    ]
    assert deltas[1] == "the quick" and "".join(d or "" for d in deltas) == full


def test_echo_of_a_new_turn_adds_nothing(server):
    messages = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert (
        _chat(server, messages, echo=True).choices[0].message.content
        == _chat(server, messages).choices[0].message.content
    )


def test_echo_joins_text_parts(server):
    parts = [{"type": "text", "text": "the"}, {"type": "text", "text": "quick"}]
    messages = [OPEN[0], {"role": "assistant", "content": parts}]
    plain = _chat(server, messages, **CONTINUE).choices[0].message.content
    assert _chat(server, messages, echo=True, **CONTINUE).choices[0].message.content == "the\nquick" + plain
