"""The reasoning parser (whole and streamed) and the framework-free serving layer, driven by a scripted
engine client in-process (no HTTP, no model): what the model "says" is fixed, so the split is exact."""

from __future__ import annotations

import asyncio

import openai
import pytest
from scripted import ScriptedEngine

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput
from fdcli_engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from fdcli_engine.entrypoints.openai.reasoning import DeepSeekR1Parser, ThinkParser, get_parser_cls
from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from fdcli_engine.entrypoints.openai.serving_completion import OpenAIServingCompletion
from fdcli_engine.errors import ConfigError

SPLITS = [
    # (parser, text, reasoning, content)
    (ThinkParser, "<think>let me think</think>\n\nThe answer is 42", "let me think", "The answer is 42"),
    (ThinkParser, "The answer is 42", None, "The answer is 42"),
    (ThinkParser, "<think>still thinking", "still thinking", ""),
    (ThinkParser, "\n<think>a</think>b", "a", "b"),
    (ThinkParser, "<think></think>b</think>", "", "b</think>"),
    (DeepSeekR1Parser, "reasoning here</think>answer", "reasoning here", "answer"),
    (DeepSeekR1Parser, "<think>r</think>\nanswer", "r", "answer"),
    (DeepSeekR1Parser, "no end tag", "no end tag", ""),
]


@pytest.mark.parametrize("cls,text,reasoning,content", SPLITS)
def test_split_whole(cls, text, reasoning, content):
    assert cls().split(text) == ParsedOutput(reasoning, content)


def _stream(cls, pieces):
    p = cls()
    r, c = "", ""
    for i, piece in enumerate(pieces):
        out = p.feed(piece, final=i == len(pieces) - 1)
        dr, dc = out.reasoning, out.content
        r, c = r + dr, c + dc
    return r, c


@pytest.mark.parametrize("cls,text,reasoning,content", SPLITS)
def test_streamed_split_equals_whole_at_every_cut(cls, text, reasoning, content):
    # Every way of cutting the text in three pieces (tags split anywhere) gives the whole-text answer.
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            got = _stream(cls, [text[:i], text[i:j], text[j:]])
            assert got == (reasoning or "", content), (i, j)


def test_unknown_parser_is_a_config_error():
    with pytest.raises(
        ConfigError,
        match="deepseek_r1, ernie-45-vl, ernie-x1, mimo, minimax_m2, mistral, qwen3, seed_oss, step3, think",
    ):  # every parser is named
        get_parser_cls("nope")
    assert get_parser_cls("Qwen3") is ThinkParser and get_parser_cls("deepseek-r1") is DeepSeekR1Parser
    assert get_parser_cls("ernie-x1").__name__ == "ErnieX1ReasoningParser"


PIECES = ["<th", "ink>let me ", "think</th", "ink>\n\nThe answer", " is 42"]


def _chat(engine, **kw):
    return OpenAIServingChat(engine, ["fake"], reasoning_parser_cls=ThinkParser, **kw)


def test_chat_reasoning_split_non_streaming(tokenizer):
    engine = ScriptedEngine(tokenizer, PIECES)
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "q"}])
    resp = asyncio.run(_chat(engine).create_chat_completion(req))
    msg = resp.choices[0].message
    assert (msg.reasoning_content, msg.content) == ("let me think", "The answer is 42")
    assert resp.usage.completion_tokens == len(PIECES)


def test_chat_reasoning_split_streaming(tokenizer):
    import json

    engine = ScriptedEngine(tokenizer, PIECES)
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "q"}], stream=True)

    async def collect():
        it = await _chat(engine).create_chat_completion(req)
        return [chunk async for chunk in it]

    chunks = asyncio.run(collect())
    assert chunks[-1] == "data: [DONE]\n\n"
    deltas = [json.loads(c[6:])["choices"][0]["delta"] for c in chunks[:-1]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "let me think"
    assert "".join(d.get("content") or "" for d in deltas) == "The answer is 42"
    assert all("<" not in (d.get("content") or "") + (d.get("reasoning_content") or "") for d in deltas)


def test_chat_template_kwargs_reach_the_template(tokenizer):
    template = (
        "{{ 'THINK' if enable_thinking else 'NOTHINK' }}{% for m in messages %}|{{ m.content }}{% endfor %}"
    )
    chat = _chat(ScriptedEngine(tokenizer, PIECES), chat_template=template)
    on = ChatCompletionRequest(
        messages=[{"role": "user", "content": "q"}], chat_template_kwargs={"enable_thinking": True}
    )
    off = ChatCompletionRequest(
        messages=[{"role": "user", "content": "q"}], chat_template_kwargs={"enable_thinking": False}
    )
    assert chat.render(on)[0] == "THINK|q" and chat.render(off)[0] == "NOTHINK|q"


def test_reasoning_effort_reaches_the_template(tokenizer):
    """vLLM's chat build_chat_params: reasoning_effort is the template's `reasoning_effort` (over
    chat_template_kwargs'), and sets `enable_thinking` (false for "none") unless chat_template_kwargs
    does."""
    template = (
        "{{ reasoning_effort | default('unset') }}/{{ enable_thinking | default('unset') }}"
        "{% for m in messages %}|{{ m.content }}{% endfor %}"
    )
    chat = _chat(ScriptedEngine(tokenizer, PIECES), chat_template=template)

    def rendered(**body):
        return chat.render(ChatCompletionRequest(messages=[{"role": "user", "content": "q"}], **body))[0]

    assert rendered() == "unset/unset|q"
    assert rendered(reasoning_effort="low") == "low/True|q"
    assert rendered(reasoning_effort="none") == "none/False|q"
    kwargs = {"enable_thinking": True, "reasoning_effort": "high"}
    assert rendered(reasoning_effort="none", chat_template_kwargs=kwargs) == "none/True|q"
    assert rendered(chat_template_kwargs=kwargs) == "high/True|q"


def test_bad_reasoning_effort_is_a_400_naming_it(tokenizer):
    from scripted import scripted_client

    client, _, engine = scripted_client(tokenizer, PIECES)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "q"}], reasoning_effort="extreme"
        )
    assert e.value.body["param"] == "reasoning_effort" and not engine.calls


def test_template_sandbox_blocks_attribute_escape(tokenizer):
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    chat = _chat(ScriptedEngine(tokenizer, PIECES), chat_template=evil)
    from fdcli_engine.entrypoints.openai.errors import APIError

    with pytest.raises(APIError) as e:
        chat.render(ChatCompletionRequest(messages=[{"role": "user", "content": "q"}]))
    assert e.value.status == 400 and e.value.param == "messages"


def test_n_fans_out_with_child_ids_and_seeds(tokenizer):
    engine = ScriptedEngine(tokenizer, ["a", "b"])
    serving = OpenAIServingCompletion(engine, ["fake"])
    req = CompletionRequest(prompt="hello", n=3, seed=10, max_tokens=4)
    resp = asyncio.run(serving.create_completion(req, request_id="r"))
    assert sorted((c.request_id, c.params.seed) for c in engine.calls) == [
        ("r-0", 10),
        ("r-1", 11),
        ("r-2", 12),
    ]
    assert [c.index for c in resp.choices] == [0, 1, 2] and all(c.text == "ab" for c in resp.choices)
    assert (
        resp.usage.prompt_tokens == len(engine.calls[0].prompt_token_ids)
        and resp.usage.completion_tokens == 6
    )


def _count_off_loop_hops(module, monkeypatch) -> list[str]:
    """The names of the functions `module` sends to a prepare worker (its off_loop), as they are sent."""
    hops = []
    real = module.off_loop

    async def counting_off_loop(fn, *args, **kwargs):
        hops.append(fn.__name__)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(module, "off_loop", counting_off_loop)
    return hops


def test_text_prompts_tokenize_on_the_loop_only_when_short(tokenizer, monkeypatch):
    """One text up to LOOP_ENCODE_CHARS (and token ids) is tokenized on the event loop; a longer text
    or a list of texts goes to a prepare worker. Either way the engine gets the tokenizer's ids."""
    from fdcli_engine.entrypoints.openai import loop_prompts
    from fdcli_engine.entrypoints.openai import serving_completion as sc

    hops = _count_off_loop_hops(sc, monkeypatch)
    monkeypatch.setattr(
        loop_prompts, "LOOP_ENCODE_CHARS", 60
    )  # the tiny model's context holds no 8K-char text
    short = "hello world " * 5
    long = "hello world " * 6
    cases = [  # prompt -> (goes to a worker, the texts it holds)
        (short, False, [short]),
        ([5, 6, 7], False, None),
        (long, True, [long]),
        ([short, "hi"], True, [short, "hi"]),
    ]
    for prompt, worker, texts in cases:
        engine = ScriptedEngine(tokenizer, ["a"])
        hops.clear()
        asyncio.run(
            OpenAIServingCompletion(engine, ["fake"]).create_completion(CompletionRequest(prompt=prompt))
        )
        assert hops == (["_prompts"] if worker else []), prompt if isinstance(prompt, list) else len(prompt)
        want = [tokenizer.encode(t) for t in texts] if texts else [prompt]
        assert [c.prompt_token_ids for c in engine.calls] == want


def test_chat_prompts_render_on_the_loop_only_when_small_and_plain(tokenizer, monkeypatch):
    """The server's template over a few short text messages (or the request's own token ids) is made
    on the event loop; a request template, template arguments, many messages or long ones go to a
    prepare worker (tools too: loop_prompts.chat_on_loop).
    Either way the engine gets the same prompt ids as the template's render."""
    from fdcli_engine.entrypoints.openai import loop_prompts
    from fdcli_engine.entrypoints.openai import serving_chat as sch

    hops = _count_off_loop_hops(sch, monkeypatch)
    monkeypatch.setattr(loop_prompts, "LOOP_ENCODE_CHARS", 40)
    monkeypatch.setattr(loop_prompts, "LOOP_CHAT_MESSAGES", 3)
    msg = [{"role": "user", "content": "hello world"}]
    cases = [  # request fields -> goes to a worker
        ({"messages": msg}, False),
        ({"messages": msg, "prompt_token_ids": [5, 6, 7]}, False),
        ({"messages": [{"role": "user", "content": "hello world " * 4}]}, True),
        ({"messages": msg * 4}, True),
        ({"messages": msg, "chat_template": "{{ messages[0].content }}"}, True),
        ({"messages": msg, "chat_template_kwargs": {"enable_thinking": False}}, True),
    ]
    for fields, worker in cases:
        engine = ScriptedEngine(tokenizer, ["a"])
        hops.clear()
        serving = OpenAIServingChat(engine, ["fake"], allow_request_chat_template=True)
        req = ChatCompletionRequest(**fields)
        asyncio.run(serving.create_chat_completion(req))
        assert hops == (["_prompt"] if worker else []), fields
        want = fields.get("prompt_token_ids") or serving.render(req)[1]
        assert engine.calls[0].prompt_token_ids == want, fields


def test_chat_on_loop_sends_tools_images_and_tool_calls_to_a_worker():
    from fdcli_engine.entrypoints.openai.loop_prompts import chat_on_loop

    msg = {"role": "user", "content": "hi"}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    parts = [{"type": "text", "text": "hi"}]
    assert chat_on_loop(ChatCompletionRequest(messages=[msg]), [])
    assert not chat_on_loop(ChatCompletionRequest(messages=[msg]), ["an image"])
    assert not chat_on_loop(ChatCompletionRequest(messages=[msg], tools=[tool]), [])
    assert not chat_on_loop(ChatCompletionRequest(messages=[msg], documents=[{"text": "d"}]), [])
    assert not chat_on_loop(ChatCompletionRequest(messages=[{"role": "user", "content": parts}]), [])
    assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
    assert not chat_on_loop(ChatCompletionRequest(messages=[msg, assistant]), [])
    thinking = {"role": "assistant", "content": "x", "reasoning_content": "because"}
    assert not chat_on_loop(ChatCompletionRequest(messages=[msg, thinking]), [])
