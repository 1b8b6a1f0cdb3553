"""vLLM's --hf-overrides on fd serve: the JSON form and the dotted form give the same overrides, bad JSON
is a one-line usage error, and a served model's config takes them (/v1/models reports the context limit
an overridden max_position_embeddings gives)."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from fdcli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    "argv",
    [
        ["--hf-overrides", '{"max_position_embeddings": 96, "text_config": {"rope_theta": 1e6}}'],
        ["--hf-overrides.max_position_embeddings", "96", "--hf-overrides.text_config.rope_theta", "1e6"],
        [
            "--hf_overrides.max_position_embeddings=96",
            "--hf-overrides",
            '{"text_config": {"rope_theta": 1e6}}',
        ],
    ],
)
def test_json_and_dotted_forms_give_one_object(captured, argv):
    result = runner.invoke(app, ["serve", *argv])
    assert result.exit_code == 0, result.output
    ((config, _),) = captured
    assert config.hf_overrides == {"max_position_embeddings": 96, "text_config": {"rope_theta": 1e6}}


@pytest.mark.parametrize(
    "value, message",
    [
        ("{bad", "--hf-overrides must be a JSON object: Expecting property name"),
        ("[1, 2]", "--hf-overrides must be a JSON object"),
    ],
)
def test_bad_json_is_a_one_line_usage_error(captured, value, message):
    result = runner.invoke(app, ["serve", "--hf-overrides", value])
    assert result.exit_code == 2 and not captured, result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.output


def test_served_model_takes_the_overrides(tiny_model, tmp_path):
    from server.fd_server import start_server

    srv = start_server(tiny_model, tmp_path, "--hf-overrides.max_position_embeddings", "96")
    try:
        body = httpx.get(srv.url + "/v1/models", headers=srv.headers).json()
        assert [m["max_model_len"] for m in body["data"]] == [96]  # the checkpoint says 256
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]
