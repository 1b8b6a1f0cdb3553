"""Structured outputs on the command line: FastDeploy's --guided-decoding-backend and vLLM's
--structured-outputs-config set EngineConfig.guided_decoding_backend, checked before any engine
import; `fd chat` / `fd complete --json-schema FILE` send OpenAI's response_format json_schema."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fdcli.main import app
from fdcli.options import engine_config_from_cli
from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ConfigError

runner = CliRunner()


@pytest.mark.parametrize("backend", ["auto", "guidance", "off"])
def test_guided_decoding_backend_sets_the_engine_field(backend):
    merged = engine_config_from_cli(None, guided_decoding_backend=backend)
    assert EngineConfig.from_dict(merged).guided_decoding_backend == backend


def test_structured_outputs_config_is_vllms_form_of_the_same_field(tmp_path):
    merged = engine_config_from_cli(
        None, structured_outputs_config='{"backend": "off", "disable_fallback": true}'
    )
    assert merged == {"guided_decoding_backend": "off"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("structured-outputs-config:\n  backend: guidance\n")
    assert EngineConfig.from_dict(engine_config_from_cli(cfg)).guided_decoding_backend == "guidance"
    assert EngineConfig().guided_decoding_backend == "auto"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"guided_decoding_backend": "outlines"}, "not known"),
        ({"guided_decoding_backend": "xgrammar"}, "not available"),
        (
            {"structured_outputs_config": '{"backend": "guidance", "enable_in_reasoning": true}'},
            "enable_in_reasoning",
        ),
        ({"structured_outputs_config": "not json"}, "JSON object"),
        ({"structured_outputs_config": '{"backend": "xgrammar"}'}, "not available"),
        (
            {"structured_outputs_config": '{"backend": "off"}', "guided_decoding_backend": "auto"},
            "contradicts",
        ),
    ],
)
def test_bad_backend_options_are_config_errors(flags, says):
    with pytest.raises(ConfigError, match=says):
        engine_config_from_cli(None, **flags)


def test_serve_refuses_a_bad_backend_in_one_line_before_loading():
    # Exits before any engine import: no paddle, no model (the default model is not needed).
    result = runner.invoke(app, ["serve", "--guided-decoding-backend", "xgrammar"])
    assert result.exit_code != 0
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and "xgrammar" in err[0] and "Traceback" not in result.output


class FakeClient:
    bodies: list = []

    def __init__(self, url, api_key):
        pass

    def first_model(self):
        return "m"

    def stream(self, path, body):
        FakeClient.bodies.append((path, body))
        yield {"choices": [{"index": 0, "delta": {"content": '{"a": 1}'}, "text": '{"a": 1}'}]}


@pytest.mark.parametrize("command", ["chat", "complete"])
def test_json_schema_file_is_sent_as_response_format(tmp_path, monkeypatch, command):
    import fdcli.commands.chat as chat_cmd
    import fdcli.commands.complete as complete_cmd

    monkeypatch.setattr(chat_cmd, "ApiClient", FakeClient)
    monkeypatch.setattr(complete_cmd, "ApiClient", FakeClient)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    path = tmp_path / "answer.schema.json"
    path.write_text(json.dumps(schema))
    args = ["chat", "-q", "hi"] if command == "chat" else ["complete", "hi"]
    result = runner.invoke(app, [*args, "--json-schema", str(path)])
    assert result.exit_code == 0, result.output
    assert '{"a": 1}' in result.stdout
    _, body = FakeClient.bodies[-1]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer_schema", "schema": schema, "strict": True},
    }


@pytest.mark.parametrize(
    ("content", "says"),
    [(None, "cannot read"), ("{not json", "not valid JSON"), ("[1, 2]", "JSON schema object")],
)
@pytest.mark.parametrize("command", ["chat", "complete"])
def test_a_bad_json_schema_file_is_one_line_and_nonzero(tmp_path, command, content, says):
    path = tmp_path / "s.json"
    if content is not None:
        path.write_text(content)
    args = ["chat", "-q", "hi"] if command == "chat" else ["complete", "hi"]
    # An unreachable URL: the file is read before any request.
    result = runner.invoke(app, [*args, "--url", "http://127.0.0.1:9/v1", "--json-schema", str(path)])
    assert result.exit_code != 0
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "Traceback" not in result.output, result.output


def test_vllms_dotted_structured_outputs_config_flags(captured):
    """vLLM's docs launch structured outputs with `--structured-outputs-config.backend NAME`: its
    argument parser folds dotted keys into the option's JSON; fd serve takes the same line."""
    argv = ["--structured-outputs-config.backend", "off", "--structured_outputs_config.disable_fallback=true"]
    result = runner.invoke(app, ["serve", *argv])
    assert result.exit_code == 0, result.output
    ((config, _),) = captured
    assert config.guided_decoding_backend == "off"
    bad = runner.invoke(app, ["serve", "--structured-outputs-config.reasoning_parser", "x"])
    assert bad.exit_code != 0 and "reasoning_parser" in bad.stderr and len(captured) == 1
