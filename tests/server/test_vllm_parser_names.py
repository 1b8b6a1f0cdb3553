"""vLLM's parser names (vllm/tool_parsers/__init__.py and vllm/reasoning/__init__.py registries):
each is either a working fd parser for the same format, checked on vLLM's own test strings, whole
and streamed, or a one-line refusal naming the closest fd parser."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from parser_streams import cuts as _cuts
from parser_streams import streamed as _streamed
from parser_streams import whole as _whole

from fdcli_engine.entrypoints.openai.reasoning import (
    DeepSeekR1Parser,
    MistralReasoningParser,
    SeedOssReasoningParser,
    ThinkParser,
    get_parser_cls,
)
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter
from fdcli_engine.entrypoints.openai.tool_parsers import (
    PARSER_NAMES,
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    Glm4MoeToolParser,
    GraniteToolParser,
    HermesToolParser,
    InternLM2ToolParser,
    JambaToolParser,
    KimiK2ToolParser,
    Llama3JsonToolParser,
    LongcatToolParser,
    MinimaxM2ToolParser,
    Phi4MiniJsonToolParser,
    PythonicToolParser,
    Qwen3CoderToolParser,
    SeedOssToolParser,
    XLamToolParser,
    get_tool_parser_cls,
)
from fdcli_engine.errors import ConfigError

# Every name in vLLM's registries (plus "minimax", an earlier vLLM tool parser name).
VLLM_TOOL_PARSERS = """apertus cohere_command3 cohere_command4 deepseek_v3 deepseek_v31 deepseek_v32
deepseek_v4 ernie45 functiongemma gemma4 gigachat3 glm45 glm47 granite granite-20b-fc granite4 hermes
hunyuan_a13b hy_v3 inkling internlm jamba kimi_k2 kimi_k3 lfm2 llama3_json llama4_json llama4_pythonic
longcat mimo minicpm5 minimax minimax_m2 minimax_m3 mistral olmo3 openai phi4_mini_json poolside_v1
pythonic qwen3_coder qwen3_xml seed_oss solar_open2 step3 step3p5 xlam""".split()
VLLM_REASONING_PARSERS = """cohere_command3 cohere_command4 deepseek_r1 deepseek_v3 deepseek_v4 ernie45
gemma4 glm45 glm47 granite holo2 hunyuan_a13b hy_v3 inkling kimi_k2 kimi_k3 mimo minimax_m2
minimax_m2_append_think minimax_m3 mistral nemotron_v3 olmo3 openai_gptoss poolside_v1 qwen3 seed_oss
solar_open2 step3 step3p5""".split()

TOOL_ALIASES = {
    "granite": GraniteToolParser,
    "jamba": JambaToolParser,
    "hunyuan_a13b": JambaToolParser,
    "phi4_mini_json": Phi4MiniJsonToolParser,
    "hermes": HermesToolParser,
    "granite4": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,
    "pythonic": PythonicToolParser,
    "llama4_pythonic": PythonicToolParser,
    "qwen3_coder": Qwen3CoderToolParser,  # tests in test_qwen3_coder_parser.py
    "qwen3_xml": Qwen3CoderToolParser,
    "kimi_k2": KimiK2ToolParser,  # tests in test_kimi_k2_parser.py
    "deepseek_v3": DeepSeekV3ToolParser,  # tests in test_deepseek_tool_parsers.py
    "deepseek_v31": DeepSeekV31ToolParser,
    "glm45": Glm4MoeToolParser,  # tests in test_glm4_moe_parser.py
    "glm47": Glm4MoeToolParser,
    "xlam": XLamToolParser,  # tests in test_xlam_parser.py
    "internlm": InternLM2ToolParser,  # tests in test_internlm2_parser.py
    "seed_oss": SeedOssToolParser,  # tests in test_qwen3_coder_parser.py
    "minimax_m2": MinimaxM2ToolParser,  # tests in test_minimax_m2_parser.py
    "longcat": LongcatToolParser,  # tests in test_longcat_parser.py
}
REASONING_ALIASES = {
    "deepseek_r1": DeepSeekR1Parser,
    "step3": DeepSeekR1Parser,
    "minimax_m2": DeepSeekR1Parser,
    "qwen3": ThinkParser,
    "mimo": ThinkParser,
    "mistral": MistralReasoningParser,  # tests in test_think_tag_parsers.py
    "seed_oss": SeedOssReasoningParser,
}
FD_TOOL = set(PARSER_NAMES)
FD_REASONING = {
    "qwen3",
    "think",
    "deepseek_r1",
    "ernie-45-vl",
    "ernie-x1",
    "mimo",
    "step3",
    "minimax_m2",
    "mistral",
    "seed_oss",
}


@pytest.mark.parametrize("name", VLLM_TOOL_PARSERS)
def test_every_vllm_tool_parser_name_works_or_is_a_one_line_refusal(name):
    if name in TOOL_ALIASES or name == "mistral":
        assert get_tool_parser_cls(name) is not None
        if name in TOOL_ALIASES:
            assert get_tool_parser_cls(name) is TOOL_ALIASES[name]
        return
    with pytest.raises(ConfigError) as e:
        get_tool_parser_cls(name)
    msg = str(e.value)
    assert "\n" not in msg and f"vLLM's {name} format is not supported by fd" in msg, msg
    closest = msg.split("the closest fd parser is ")[1].split(" ")[0]
    assert closest in FD_TOOL, msg
    assert all(n in msg for n in PARSER_NAMES), msg


@pytest.mark.parametrize("name", VLLM_REASONING_PARSERS)
def test_every_vllm_reasoning_parser_name_works_or_is_a_one_line_refusal(name):
    if name in REASONING_ALIASES:
        assert get_parser_cls(name) is REASONING_ALIASES[name]
        return
    with pytest.raises(ConfigError) as e:
        get_parser_cls(name)
    msg = str(e.value)
    assert "\n" not in msg and f"vLLM's {name} format is not supported by fd" in msg, msg
    closest = msg.split("the closest fd parser is ")[1].split(" ")[0]
    assert closest in FD_REASONING, msg


def test_a_name_nobody_has_lists_the_choices():
    with pytest.raises(
        ConfigError,
        match=r"^--tool-call-parser 'nope': choose one of deepseek_v3, deepseek_v31, ernie-x1, glm45, ",
    ):
        get_tool_parser_cls("nope")
    with pytest.raises(ConfigError, match=r"^--reasoning-parser 'nope': choose one of deepseek_r1, "):
        get_parser_cls("nope")


# tests/tool_parsers/test_llama4_pythonic_tool_parser.py: (output, [(name, arguments as vLLM gives)])
LLAMA4_PYTHONIC = [
    ("[get_weather(city='LA', metric='C')]", [("get_weather", '{"city": "LA", "metric": "C"}')]),
    (
        "[register_user(name='Doe', age=9, address={'city': 'LA', 'state': 'CA'}, role=None, "
        "passed_test=True, aliases=['John', 'Johnny'])]",
        [
            (
                "register_user",
                '{"name": "Doe", "age": 9, "address": {"city": "LA", "state": "CA"}, "role": null, '
                '"passed_test": true, "aliases": ["John", "Johnny"]}',
            )
        ],
    ),
    ("[get_weather()]", [("get_weather", "{}")]),
    ("[do_something_cool(additional_data={})]", [("do_something_cool", '{"additional_data": {}}')]),
    ("[do_something_cool(steps=[])]", [("do_something_cool", '{"steps": []}')]),
    (
        r"[get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')]",
        [("get_weather", '{"city": "Martha\'s Vineyard", "metric": "\\"cool units\\""}')],
    ),
    (
        "<|python_start|>[get_weather(city='LA', metric='C')]<|python_end|>",
        [("get_weather", '{"city": "LA", "metric": "C"}')],
    ),
    (
        "<|python_start|>[get_weather(city='LA', metric='C'),register_user(name='Doe', age=9)]",
        [("get_weather", '{"city": "LA", "metric": "C"}'), ("register_user", '{"name": "Doe", "age": 9}')],
    ),
    (
        "<|python_start|>[get_weather(city='LA', metric='C'), get_weather(), "
        "do_something_cool(steps=[])]<|python_end|>",
        [
            ("get_weather", '{"city": "LA", "metric": "C"}'),
            ("get_weather", "{}"),
            ("do_something_cool", '{"steps": []}'),
        ],
    ),
]


def _as_json(calls):
    return [(name, json.loads(args)) for name, args in calls]


@pytest.mark.parametrize("text,calls", LLAMA4_PYTHONIC)
def test_llama4_pythonic_on_vllms_test_strings(text, calls):
    cls = get_tool_parser_cls("llama4_pythonic")
    reasoning, content, got = _whole(cls, text)
    assert (content, _as_json(got)) == (None, _as_json(calls))
    for pieces in _cuts(text, 7):
        r, c, streamed = _streamed(cls, pieces)
        assert (c, _as_json(streamed)) == ("", _as_json(calls)), pieces


def test_llama4_pythonic_plain_text_is_content():
    text = "How can I help you today?"  # vLLM's test_no_tool_call
    assert _whole(get_tool_parser_cls("llama4_pythonic"), text)[1:] == (text, [])


# tests/tool_parsers/test_granite4_tool_parser.py: string arguments (granite's habit) read as objects
COORD = {"coordinates": [[23.54, 43.1], [-12.2, 54.3], [4, 5]], "coordinate_type": "latlong"}
STOCK = {"symbol": "AAPL", "start_date": "2021-01-01", "end_date": "2021-12-31"}
GRANITE4 = "Here goes the bbox call: \n" + " Now the stock price call: \n ".join(
    [
        "<tool_call> " + json.dumps({"name": "find_bbox", "arguments": json.dumps(COORD)}) + " </tool_call>",
        "<tool_call> " + json.dumps({"name": "get_stock_price", "arguments": STOCK}) + " </tool_call>",
    ]
)


def test_granite4_on_vllms_test_string():
    cls = get_tool_parser_cls("granite4")
    want = [("find_bbox", COORD), ("get_stock_price", STOCK)]
    _, content, calls = _whole(cls, GRANITE4)
    # Text before the first call is content; text between calls is dropped (hermes' rule; vLLM's
    # granite4 keeps it as content).
    assert (content, _as_json(calls)) == ("Here goes the bbox call:", want)
    for pieces in _cuts(GRANITE4, 11):
        _, c, streamed = _streamed(cls, pieces)
        assert (c, _as_json(streamed)) == ("Here goes the bbox call:", want), pieces


# tests/tool_parsers/test_llama3_json_tool_parser.py (llama4_json is vLLM's same class)
def test_llama4_json_on_vllms_test_string():
    text = (
        '{"name": "searchTool", "parameters": {"query": "test1"}}; '
        '{"name": "getOpenIncidentsTool", "parameters": {}}; '
        '{"name": "searchTool", "parameters": {"query": "test2"}}'
    )
    want = [
        ("searchTool", {"query": "test1"}),
        ("getOpenIncidentsTool", {}),
        ("searchTool", {"query": "test2"}),
    ]
    cls = get_tool_parser_cls("llama4_json")
    assert _as_json(_whole(cls, text)[2]) == want
    for pieces in _cuts(text, 13):
        assert _as_json(_streamed(cls, pieces)[2]) == want, pieces


# tests/reasoning/test_minimax_m2_reasoning_parser.py: (output, reasoning, content) as vLLM gives them
MINIMAX_M2 = [
    (
        "This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    ("This is a reasoning section</think>", "This is a reasoning section", None),
    ("This is reasoning in progress", "This is reasoning in progress", None),
    (
        "First line\nSecond line</think>Response first line\nResponse second",
        "First line\nSecond line",
        "Response first line\nResponse second",
    ),
    ("</think>This is the response", "", "This is the response"),
    ("Let me think... 1+1=2, right?</think>Yes, 1+1=2.", "Let me think... 1+1=2, right?", "Yes, 1+1=2."),
    (
        "```python\nprint('hello')\n```</think>Here is the code.",
        "```python\nprint('hello')\n```",
        "Here is the code.",
    ),
]


@pytest.mark.parametrize("name", ["minimax_m2", "step3"])
@pytest.mark.parametrize("text,reasoning,content", MINIMAX_M2)
def test_implicit_start_reasoning_on_vllms_test_strings(name, text, reasoning, content):
    cls = get_parser_cls(name)
    out = cls().split(text)
    assert (out.reasoning, out.content or None) == (reasoning, content)
    for pieces in _cuts(text):
        p, r, c = cls(), "", ""
        for i, piece in enumerate(pieces):
            d = p.feed(piece, final=i == len(pieces) - 1)
            r, c = r + d.reasoning, c + d.content
        assert (r, c or None) == (reasoning, content), pieces


TOKYO = ("get_weather", {"city": "Tokyo"})
TIME = ("get_time", {"timezone": "Asia/Tokyo"})
TYPES = {
    "string_field": "hello",
    "int_field": 42,
    "float_field": 3.14,
    "bool_field": True,
    "null_field": None,
    "array_field": ["a", "b", "c"],
    "object_field": {"nested": "value"},
    "empty_array": [],
    "empty_object": {},
}
TYPES_JSON = """{
  "name": "test_function",
  "arguments": {
    "string_field": "hello",
    "int_field": 42,
    "float_field": 3.14,
    "bool_field": true,
    "null_field": null,
    "array_field": ["a", "b", "c"],
    "object_field": {"nested": "value"},
    "empty_array": [],
    "empty_object": {}
  }
}"""
ESCAPED = {
    "quoted": 'He said "hello"',
    "path": "C:\\Users\\file.txt",
    "newline": "line1\nline2",
    "unicode": "emoji: 🎉",
}
ESCAPED_JSON = """{
  "name": "test_function",
  "arguments": {
    "quoted": "He said \\"hello\\"",
    "path": "C:\\\\Users\\\\file.txt",
    "newline": "line1\\nline2",
    "unicode": "emoji: 🎉"
  }
}"""
DALLAS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
ORLANDO = {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}
SF = {"city": "San Francisco", "metric": "celsius"}
USER = {
    "name": "John Doe",
    "age": 37,
    "address": {"city": "San Francisco", "state": "CA"},
    "role": None,
    "passed_test": True,
    "aliases": ["John", "Johnny"],
}

# (parser name, output, content, calls): the outputs and calls of vLLM's tests
# (tests/tool_parsers/test_{jamba,hunyuan_a13b,granite,phi4mini}_tool_parser.py)
ARRAY_CASES = [
    ("jamba", "This is a test", "This is a test", []),
    (
        "jamba",
        ' <tool_calls>[\n    {"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}}\n]</tool_calls>',
        None,
        [("get_current_weather", DALLAS)],
    ),
    (
        "jamba",
        ' Sure! let me call the tool for you.<tool_calls>[\n    {"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}}\n]</tool_calls>',
        " Sure! let me call the tool for you.",
        [("get_current_weather", DALLAS)],
    ),
    (
        "jamba",
        ' <tool_calls>[\n    {"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}},\n    {"name": "get_current_weather", "arguments": {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}}\n]</tool_calls>',
        None,
        [("get_current_weather", DALLAS), ("get_current_weather", ORLANDO)],
    ),
    ("hunyuan_a13b", "How can I help you today?", "How can I help you today?", []),
    (
        "hunyuan_a13b",
        '<tool_calls>[{"name": "get_weather", "arguments": {"city": "San Francisco", "metric": "celsius"}}]</tool_calls>',
        None,
        [("get_weather", SF)],
    ),
    (
        "hunyuan_a13b",
        '<tool_calls>[{"name": "get_weather", "arguments": {"city": "San Francisco", "metric": "celsius"}}, {"name": "register_user", "arguments": {"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"}, "role": null, "passed_test": true, "aliases": ["John", "Johnny"]}}]</tool_calls>',
        None,
        [("get_weather", SF), ("register_user", USER)],
    ),
    # vLLM keeps the space before the tag ("I will call the tool now. "); fd's content is rstripped.
    (
        "hunyuan_a13b",
        'I will call the tool now. <tool_calls>[{"name": "get_weather", "arguments": {"city": "Boston"}}]</tool_calls>',
        "I will call the tool now.",
        [("get_weather", {"city": "Boston"})],
    ),
    (
        "hunyuan_a13b",
        '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Seattle"}}]</tool_calls>\nThank you!',
        None,
        [("get_weather", {"city": "Seattle"})],
    ),
    (
        "hunyuan_a13b",
        '<tool_calls>[{"name": "complex_tool", "arguments": {"level1": {"level2": {"level3": {"value": 123}}}}}]</tool_calls>',
        None,
        [("complex_tool", {"level1": {"level2": {"level3": {"value": 123}}}})],
    ),
    (
        "hunyuan_a13b",
        '<tool_calls>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 42}}]</tool_calls>',
        None,
        [("a", {}), ("b", {"x": 42})],
    ),
    (
        "hunyuan_a13b",
        '<tool_calls>[{"name": "get_weather", "arguments": {"city": "北京"}}]</tool_calls>',
        None,
        [("get_weather", {"city": "北京"})],
    ),
    (
        "granite",
        "This is a regular response without any tool calls.",
        "This is a regular response without any tool calls.",
        [],
    ),
    ("granite", '<|tool_call|> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]', None, [TOKYO]),
    ("granite", '<tool_call> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]', None, [TOKYO]),
    (
        "granite",
        '<|tool_call|> [\n  {"name": "get_weather", "arguments": {"city": "Tokyo"}},\n  {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n]',
        None,
        [TOKYO, TIME],
    ),
    ("granite", f"<tool_call> [{TYPES_JSON}]", None, [("test_function", TYPES)]),
    ("granite", '<|tool_call|> [{"name": "refresh", "arguments": {}}]', None, [("refresh", {})]),
    ("granite", f"<tool_call> [{ESCAPED_JSON}]", None, [("test_function", ESCAPED)]),
    (
        "granite",
        '<|tool_call|> [{"arguments": {"city": "Tokyo"}, "name": "get_weather"}, {"arguments": {"timezone": "Asia/Tokyo"}, "name": "get_time"}]',
        None,
        [TOKYO, TIME],
    ),
    (
        "granite",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"x": 42}}, {"name": "b", "arguments": {"y": 7}}]',
        None,
        [("get_weather", {"x": 42}), ("b", {"y": 7})],
    ),
    (
        "phi4_mini_json",
        "This is a regular response without any tool calls.",
        "This is a regular response without any tool calls.",
        [],
    ),
    ("phi4_mini_json", 'functools[{"name": "get_weather", "arguments": {"city": "Tokyo"}}]', None, [TOKYO]),
    (
        "phi4_mini_json",
        'functools[\n  {"name": "get_weather", "arguments": {"city": "Tokyo"}},\n  {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n]',
        None,
        [TOKYO, TIME],
    ),
    # vLLM's regex stops at the first "]" and misses this one (its test marks it xfail).
    ("phi4_mini_json", f"functools[{TYPES_JSON}]", None, [("test_function", TYPES)]),
    ("phi4_mini_json", 'functools[{"name": "refresh", "arguments": {}}]', None, [("refresh", {})]),
    ("phi4_mini_json", f"functools[{ESCAPED_JSON}]", None, [("test_function", ESCAPED)]),
    # vLLM drops the text before the call too; fd keeps it as content, as every fd parser does.
    (
        "phi4_mini_json",
        'Let me check the weather for you.\nfunctools[{"name": "get_weather", "arguments": {"city": "Tokyo"}}]\nWould you like to know more?',
        "Let me check the weather for you.",
        [TOKYO],
    ),
]

# vLLM's malformed inputs: each stays content whole (granite's surrounding-text output is one: the
# array must be the whole answer, as in vLLM's granite parser).
ARRAY_MALFORMED = [
    ("granite", '<|tool_call|> [{"name": "func", "arguments": {'),
    ("granite", '<|tool_call|> {"name": "func", "arguments": {}}'),
    ("granite", '[{"name": "func", "arguments": "not a dict"}]'),
    ("granite", 'Some text [{"name": "func"}]'),
    (
        "granite",
        'Let me check the weather for you.\n<|tool_call|> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]\nI\'ll get that information.',
    ),
    ("phi4_mini_json", 'functools[{"name": "func", "arguments": {'),
    ("phi4_mini_json", 'functools[{"name": "func", "arguments": "not a dict"}]'),
    ("phi4_mini_json", 'functools{"name": "func"}'),
    ("phi4_mini_json", "functools[] This is just text"),
    ("phi4_mini_json", "functools[ This is just text ]"),
    ("jamba", '<tool_calls>[{"name": "f", "arguments": [1]}]</tool_calls>'),
]


@pytest.mark.parametrize("name,text,content,calls", ARRAY_CASES)
def test_json_array_formats_on_vllms_test_strings(name, text, content, calls):
    cls = get_tool_parser_cls(name)
    _, got_content, got = _whole(cls, text)
    assert (got_content, _as_json(got)) == (content, calls)
    for pieces in _cuts(text, 5):
        _, c, streamed = _streamed(cls, pieces)
        assert (c or None, _as_json(streamed)) == (content, calls), pieces
        assert [a for _, a in streamed] == [a for _, a in got], pieces  # the same argument text


@pytest.mark.parametrize("name,text", ARRAY_MALFORMED)
def test_json_array_formats_leave_malformed_outputs_as_content(name, text):
    cls = get_tool_parser_cls(name)
    assert _whole(cls, text)[1:] == (text, [])
    for pieces in _cuts(text, 7):
        # Parts of a call announced before the output turned out malformed stay sent (see
        # docs/tool-calling.md, Streaming); the text still follows as content.
        assert _streamed(cls, pieces)[1] == text, pieces


def test_streamed_arrays_send_arguments_before_the_array_closes():
    # vLLM's hunyuan_a13b streaming deltas: the arguments go out as they are generated.
    pieces = [
        '<tool_calls>[{"name":',
        ' "get_weather",',
        ' "arguments":',
        ' {"city": "Boston"}',
        "}]",
        "</tool_calls>",
    ]
    splitter = OutputSplitter(None, get_tool_parser_cls("hunyuan_a13b"))
    sent = [splitter.feed(p, final=i == len(pieces) - 1).call_deltas for i, p in enumerate(pieces)]
    assert sent[0] == [] and sent[1][0].function["name"] == "get_weather"
    assert "".join(d.function["arguments"] for d in sent[3]) == '{"city": "Boston"}'


@pytest.mark.parametrize("flag", ["--tool-call-parser", "--reasoning-parser"])
def test_fd_serve_refuses_a_parser_before_reading_the_model(flag, tmp_path):
    """A bad parser name is an option value: refused before the model is looked for or read (reading a
    GGUF's metadata alone takes seconds), as README says of every value."""
    with socket.socket() as s:  # a free port, in case the port were bound first
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fdcli.main",
            "serve",
            str(tmp_path / "no-such-model"),
            flag,
            "ernie45",
            "--port",
            port,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"Error: {flag} 'ernie45'"), r.stderr
