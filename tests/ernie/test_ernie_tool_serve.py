"""Tool calling through a real `fd serve` of a tiny ERNIE-4.5 (random weights) with
`--tool-call-parser ernie-x1 --reasoning-parser ernie-x1`: tools and tool messages reach the chat
template (seen through /tokenize and the prompt token counts), a request with tools runs (the random
model writes no call, so there must be none, streamed or not), the 400s, and the flags' start-up
errors. The parse of real calls is pinned down with a scripted engine in test_ernie_tool_calls.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from ernie_archs import DENSE
from server.fd_server import REPO, free_port, start_server
from test_ernie_tool_calls import HISTORY, TEMPLATE, TOOLS, USER
from typer.testing import CliRunner

from fdcli.main import app
from fdcli_engine.entrypoints.openai.tool_parsers import PARSER_NAMES


@pytest.fixture(scope="module")
def server(ernie_checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tool-serve")
    template = tmp / "tools.jinja"
    template.write_text(TEMPLATE)
    srv = start_server(
        ernie_checkpoint(DENSE),
        tmp,
        "--served-model-name",
        "ernie",
        "--tool-call-parser",
        "ernie-x1",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "ernie-x1",
        "--chat-template",
        str(template),
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def _rendered(server, **body) -> str:
    with server.http() as h:
        r = h.post("/tokenize", json={"model": "ernie", **body})
        assert r.status_code == 200, r.text
        ids = r.json()["tokens"]
        return h.post("/detokenize", json={"model": "ernie", "tokens": ids}).json()["prompt"]


def test_tools_and_tool_messages_reach_the_template(server):
    schema = json.dumps(TOOLS[0]["function"]["parameters"])
    assert _rendered(server, messages=USER, tools=TOOLS) == (
        f"<tools>get_weather={schema};</tools>[user]Weather in Beijing?[assistant]<think>"
    )
    assert _rendered(server, messages=HISTORY, tools=TOOLS).endswith(
        '[assistant]<tool_call>get_weather{"location": "Beijing"}</tool_call>'
        "[tool]<tool_response call_1>sunny, 25C</tool_response>[assistant]<think>"
    )


def test_chat_with_tools_runs_streamed_and_not(server):
    client = server.client()
    kw = dict(model="ernie", messages=HISTORY, tools=TOOLS, temperature=0, max_tokens=12)
    resp = client.chat.completions.create(**kw)
    bare = client.chat.completions.create(model="ernie", messages=HISTORY, temperature=0, max_tokens=1)
    schema_tokens = len(_tokens(server, messages=HISTORY, tools=TOOLS)) - len(
        _tokens(server, messages=HISTORY)
    )
    assert schema_tokens > 0 and resp.usage.prompt_tokens == bare.usage.prompt_tokens + schema_tokens
    choice = resp.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "length"
    content, reasoning, finishes = "", "", []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            assert not ch.delta.tool_calls
            content += ch.delta.content or ""
            reasoning += getattr(ch.delta, "reasoning_content", None) or ""
            finishes += [ch.finish_reason] if ch.finish_reason else []
    assert finishes == ["length"]
    assert (content, reasoning) == (
        choice.message.content or "",
        choice.message.model_extra["reasoning_content"] or "",
    )


def _tokens(server, **body) -> list[int]:
    with server.http() as h:
        return h.post("/tokenize", json={"model": "ernie", **body}).json()["tokens"]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": HISTORY[1]["tool_calls"]}]},
            "messages[0].tool_calls",
        ),
    ],
)
def test_bad_tool_requests_on_the_real_server(server, body, param):
    with server.http() as h:
        r = h.post("/v1/chat/completions", json={"model": "ernie", "messages": USER, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
        # The list is the registry's (tests/server/test_vllm_parser_names.py checks its names).
        (
            ["--tool-call-parser", "qwen"],
            "--tool-call-parser 'qwen': choose one of " + ", ".join(PARSER_NAMES),
        ),
    ],
)
def test_bad_tool_flags_fail_in_one_line(ernie_checkpoint, flags, words):
    cmd = [
        sys.executable,
        "-m",
        "fdcli.main",
        "serve",
        "--model",
        str(ernie_checkpoint(DENSE)),
        "--port",
        str(free_port()),
    ]
    r = subprocess.run(cmd + flags, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_tool_flags_from_the_yaml_file(launched_args, tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("tool-call-parser: ernie-x1\nenable_auto_tool_choice: true\n")
    r = CliRunner().invoke(app, ["serve", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert (launched_args[0].serving.tool_call_parser, launched_args[0].serving.enable_auto_tool_choice) == (
        "ernie-x1",
        True,
    )
