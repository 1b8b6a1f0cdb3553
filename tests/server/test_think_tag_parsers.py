"""vLLM's mistral ([THINK]…[/THINK]) and seed_oss (<seed:think>…</seed:think>) reasoning parsers on
the outputs of vLLM's tests (tests/reasoning/test_mistral_reasoning_parser.py,
test_seedoss_reasoning_parser.py), whole and streamed at every cut, alone and under a tool parser,
and through the HTTP app with the openai SDK."""

from __future__ import annotations

import pytest
from parser_streams import cuts, streamed, whole
from scripted import scripted_client

from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls, reasoning_markers
from fdcli_engine.entrypoints.openai.tool_parsers import get_tool_parser_cls

# (output, reasoning, content): vLLM's mistral parser (no [THINK]: all content)
MISTRAL = [
    (
        "[THINK]This is a reasoning section[/THINK]This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    ("[THINK]This is a reasoning section[/THINK]", "This is a reasoning section", ""),
    ("[THINK]This\nThat[/THINK]This is the rest\nThat", "This\nThat", "This is the rest\nThat"),
    ("[THINK]This is a reasoning section", "This is a reasoning section", ""),
    ("This is content", None, "This is content"),
    ("", None, ""),
]
# (output, reasoning, content): vLLM's seed_oss parser (text before </seed:think> is reasoning)
SEED_OSS = [
    (
        "This is a reasoning section</seed:think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    ("This is a reasoning section</seed:think>", "This is a reasoning section", ""),
    ("This is content", "This is content", ""),
    ("This\nThat</seed:think>This is the rest\nThat", "This\nThat", "This is the rest\nThat"),
    (
        "<seed:think>This is a reasoning section</seed:think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    ("Some reasoning</seed:think>This is the rest", "Some reasoning", "This is the rest"),
]


@pytest.mark.parametrize(
    "name,text,reasoning,content", [("mistral", *c) for c in MISTRAL] + [("seed_oss", *c) for c in SEED_OSS]
)
def test_vllms_outputs_whole_and_streamed(name, text, reasoning, content):
    cls = get_parser_cls(name)
    out = cls().split(text)
    assert (out.reasoning, out.content) == (reasoning, content)
    for pieces in cuts(text):
        p, r, c = cls(), "", ""
        for i, piece in enumerate(pieces):
            d = p.feed(piece, final=i == len(pieces) - 1)
            r, c = r + d.reasoning, c + d.content
        assert (r, c) == (reasoning or "", content), pieces


def test_seed_oss_streams_vllms_deltas():
    p, r, c = get_parser_cls("seed_oss")(), "", ""
    for delta in ["Some ", "reasoning ", "content", "</seed:think>", "Final ", "answer"]:
        out = p.feed(delta)
        r, c = r + out.reasoning, c + out.content
    assert (r, c + p.feed("", final=True).content) == ("Some reasoning content", "Final answer")


def test_magistral_thinks_then_calls_a_tool():
    # Magistral: [THINK]…[/THINK], then mistral's [TOOL_CALLS] after it; a tag inside the thinking
    # block is not a call.
    text = (
        '[THINK]Maybe [TOOL_CALLS] is needed.[/THINK]Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    )
    want = ("Maybe [TOOL_CALLS] is needed.", "Checking.", [("get_weather", '{"city": "Paris"}')])
    reasoning, tools = get_parser_cls("mistral"), get_tool_parser_cls("mistral")
    assert whole(tools, text, reasoning) == want
    for pieces in cuts(text, 3):
        r, c, calls = streamed(tools, pieces, reasoning)
        assert (r, c or None, calls) == want, pieces


def test_a_partial_tag_is_held_back_under_a_tool_parser():
    text = "<seed:think>Plan</seed:think>Done."
    reasoning, tools = get_parser_cls("seed_oss"), get_tool_parser_cls("hermes")
    for pieces in cuts(text):
        r, c, _ = streamed(tools, pieces, reasoning)
        assert (r, c) == ("Plan", "Done."), pieces


def test_a_constraint_starts_after_the_parsers_own_end_tag():
    def encode(text):
        return [ord(ch) for ch in text]

    seed = reasoning_markers(get_parser_cls("seed_oss"), encode, "", None)
    assert (seed.start, seed.end) == ([], encode("</seed:think>"))  # the model starts inside the block
    mistral = reasoning_markers(get_parser_cls("mistral"), encode, "x[THINK]", None)
    assert (mistral.start, mistral.end) == ([], encode("[/THINK]"))  # the prompt opened it
    opens = reasoning_markers(get_parser_cls("mistral"), encode, "x", "...[/THINK]...")
    assert (opens.start, opens.end) == (encode("[THINK]"), encode("[/THINK]"))  # the model opens it
    assert reasoning_markers(get_parser_cls("mistral"), encode, "[THINK]a[/THINK]", None) is None


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tiny_models import write_tiny_tokenizer

    from fdcli_engine.tokenizer import Tokenizer

    return Tokenizer.from_model(write_tiny_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.mark.parametrize("parser,skipped", [("mistral", False), ("seed_oss", True), ("qwen3", True)])
def test_mistral_reasoning_keeps_its_special_tags_in_the_text(tokenizer, parser, skipped):
    """[THINK] and [/THINK] are special tokens in Mistral's tokenizers: skipping special tokens would
    erase the tags the parser splits at."""
    pieces = ["[THINK]", "Sunny ", "in Paris.", "[/THINK]", "It is sunny."]
    client, _, engine = scripted_client(tokenizer, pieces, reasoning_parser=parser)
    resp = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "Weather?"}])
    assert engine.calls[-1].params.skip_special_tokens is skipped
    if parser == "mistral":
        message = resp.choices[0].message
        assert (message.reasoning_content, message.content) == ("Sunny in Paris.", "It is sunny.")
