"""`--speculative-config` on every command that starts an engine (serve, run-batch, bench latency and
throughput), in `--config` YAML (a mapping or a JSON string) and in `LLM(speculative_config=...)`:
good values reach the engine as the same mapping; every bad one is one `Error:` line and exit 2,
before paddle loads. The engine side is patched out (nothing here loads a model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fdcli_engine.api
from fdcli.main import app
from fdcli_engine.errors import ConfigError
from fdcli_engine.speculative_config import SpeculativeConfig, parse_speculative_config

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()

COMMANDS = {
    "serve": ["serve"],
    "run-batch": ["run-batch", "-i", "in.jsonl", "-o", "out.jsonl"],
    "bench latency": ["bench", "latency"],
    "bench throughput": ["bench", "throughput"],
}
# (flag value, what its one error line says)
BAD = [
    (
        '{"method": "medusa"}',
        "method 'medusa' is not supported: use ngram (or ngram_match), mtp, draft_model, eagle or eagle3",
    ),
    (
        '{"method": "eagle"}',
        'method eagle needs "model": the EAGLE head\'s path (e.g. "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"',
    ),
    (
        '{"method": "eagle3"}',
        'method eagle3 needs "model": the EAGLE head\'s path (e.g. "yuhuili/EAGLE3-LLaMA3',
    ),
    ('{"method": "ngram", "k": 3}', "--speculative-config: unknown key(s) k (fd reads method,"),
    ('{"method": "ngram"', "--speculative-config must be a JSON object: Expecting ',' delimiter"),
    ('["ngram"]', "--speculative-config must be a JSON object"),
    ('{"method": "draft_model"}', 'method draft_model needs "model": the draft model\'s path'),
    (
        '{"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
        "prompt_lookup_min 4 is larger than prompt_lookup_max 2",
    ),
    (
        '{"method": "ngram", "num_speculative_tokens": 0}',
        "num_speculative_tokens must be an integer between 1",
    ),
    ('{"method": "mtp", "accept_policy": "lossy"}', "accept_policy 'lossy' is not supported"),
]
NGRAM = {"method": "ngram_match", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


class _Summary:
    status, message = "completed", None

    def lines(self):
        return []


@pytest.fixture
def engines(monkeypatch):
    """Every command's engine replaced by a recorder of the engine options it was given."""
    import fdcli_engine.entrypoints.batch as batch
    from fdcli.bench import offline

    seen: list[dict] = []
    monkeypatch.setattr(
        "fdcli_engine.entrypoints.openai.launcher.run_server",
        lambda config, args, **kw: seen.append(config.speculative_config),
    )
    monkeypatch.setattr(
        batch,
        "run_batch",
        lambda opts, engine_args: seen.append(engine_args["speculative_config"]) or _Summary(),
    )
    monkeypatch.setattr(
        offline, "run_offline", lambda opts, engine_args: seen.append(engine_args["speculative_config"])
    )
    return seen


@pytest.fixture
def batch_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text("")


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("value", "message"), BAD)
def test_bad_value_is_one_line_on_every_command(engines, batch_files, command, value, message):
    r = runner.invoke(app, [*COMMANDS[command], "--speculative-config", value])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr, r.stderr
    assert engines == []  # stopped before any engine was built


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_flag_reaches_the_engine_on_every_command(engines, batch_files, command):
    r = runner.invoke(app, [*COMMANDS[command], "--speculative-config", json.dumps(NGRAM)])
    assert r.exit_code == 0, r.output
    assert engines == [NGRAM]
    assert parse_speculative_config(engines[0]) == SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=4
    )


@pytest.mark.parametrize(
    "yaml_text",
    [
        "speculative_config:\n  method: ngram_match\n  num_speculative_tokens: 3\n  prompt_lookup_max: 4\n",
        f"speculative-config: '{json.dumps(NGRAM)}'\n",  # the flag's JSON text, as FastDeploy's YAML holds it
    ],
    ids=["mapping", "json-string"],
)
@pytest.mark.parametrize("command", ["serve", "bench latency"])
def test_yaml_config_takes_a_mapping_or_json(engines, tmp_path, command, yaml_text):
    cfg = tmp_path / "engine.yaml"
    cfg.write_text(yaml_text)
    r = runner.invoke(app, [*COMMANDS[command], "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert engines == [NGRAM]


def test_flag_overrides_yaml(engines, tmp_path):
    cfg = tmp_path / "engine.yaml"
    cfg.write_text("speculative_config: {method: ngram, num_speculative_tokens: 5}\nmax_num_seqs: 4\n")
    r = runner.invoke(app, ["serve", "--config", str(cfg), "--speculative-config", '{"method": "ngram"}'])
    assert r.exit_code == 0, r.output
    assert engines == [{"method": "ngram"}]


def test_bad_value_in_yaml_names_the_key(engines, tmp_path):
    cfg = tmp_path / "engine.yaml"
    cfg.write_text("speculative_config: {method: ngram, lookahead: 2}\n")
    r = runner.invoke(app, ["bench", "throughput", "--config", str(cfg)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "unknown key(s) lookahead" in r.stderr, r.stderr


def test_llm_takes_the_mapping_and_refuses_a_bad_one():
    with pytest.raises(ConfigError, match="method 'medusa' is not supported"):
        fdcli_engine.api.LLM(speculative_config={"method": "medusa"})
    with pytest.raises(ConfigError, match="must be a mapping"):
        fdcli_engine.api.LLM(speculative_config=3)


def test_resolved_config_carries_the_parsed_config(tiny_model):
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.config_resolver import resolve_config

    resolved = resolve_config(EngineConfig(model=str(tiny_model), speculative_config=NGRAM))
    assert resolved.speculative_config == parse_speculative_config(NGRAM)
    assert resolve_config(EngineConfig(model=str(tiny_model))).speculative_config is None


PROBE = """
import json, sys
from fdcli.main import app
from fdcli_engine.api import LLM
from fdcli_engine.errors import ConfigError
codes = []
for argv in json.loads(sys.argv[1]):
    try:
        app(argv, prog_name="fd")
    except SystemExit as e:
        codes.append(e.code)
try:
    LLM(speculative_config={"method": "ngram", "prompt_lookup_min": 0})
except ConfigError:
    codes.append("ConfigError")
print(json.dumps({"codes": codes, "paddle": "paddle" in sys.modules}))
"""


def test_every_refusal_comes_before_paddle_loads(tmp_path):
    """The real entry point in a fresh interpreter: each command refuses each bad value with exit 2,
    LLM() raises ConfigError, and paddle was never imported."""
    (tmp_path / "in.jsonl").write_text("")
    argvs = [[*argv, "--speculative-config", value] for argv in COMMANDS.values() for value, _ in BAD[:3]]
    p = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argvs)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}"},
    )
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result == {"codes": [2] * len(argvs) + ["ConfigError"], "paddle": False}
    assert p.stderr.count("Error: --speculative-config") == len(argvs) and "Traceback" not in p.stderr
