"""vLLM's launch lines run as `fd serve` unchanged: the positional MODEL, several served model names,
vLLM's flags (each with its effect, or one log line saying why it has none), vLLM's dtype spellings and
human-readable sizes. Parsing only: run_server is patched out, no engine starts."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fdcli.main import app
from fdcli.options import VLLM_FLAGS, engine_argv
from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ConfigError, InvalidRequestError
from fdcli_engine.request_limits import check_logprobs
from fdcli_engine.vllm_compat import (
    ACCESS_LOG_NOTE,
    NOTE,
    REFUSE,
    VLLM_FIELDS,
    VLLM_FLAG_TABLE,
    check_load_format,
    parse_human_int,
    vllm_notes,
)

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_launch_lines.txt"
runner = CliRunner()


def _lines() -> list[str]:
    return [ln for ln in FIXTURE.read_text().splitlines() if ln.startswith("fd serve ")]


@pytest.mark.parametrize("line", _lines())
def test_vllm_launch_line_parses(captured, tmp_path, line):
    files = {"KEYS": "k1\n", "KEY": "pem", "CERT": "pem", "LOGCONF": '{"version": 1}'}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    names = {"MODEL": str(tmp_path), **{name: str(tmp_path / name) for name in files}}
    argv = [names.get(a, a) for a in shlex.split(line)[1:]]
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, r.output
    ((config, _),) = captured
    assert config.model == str(tmp_path)


def test_positional_model_is_model(captured):
    assert runner.invoke(app, ["serve", "/m.gguf", "--port", "18123"]).exit_code == 0
    assert runner.invoke(app, ["serve", "/m.gguf", "--model", "/m.gguf"]).exit_code == 0
    (config, args), (same, _) = captured
    assert config.model == same.model == "/m.gguf" and args.port == 18123


def test_positional_model_and_another_model_flag_is_an_error(captured):
    r = runner.invoke(app, ["serve", "/a.gguf", "--model", "/b.gguf"])
    assert r.exit_code == 2 and not captured
    assert r.stderr == "Error: the model is given twice, as '/a.gguf' and --model '/b.gguf': give one\n"


def test_positional_model_beats_the_config_file(captured, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: /from-file.gguf\nmax-num-seqs: 3\nport: 9001\n")
    r = runner.invoke(app, ["serve", "/flag.gguf", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    ((config, args),) = captured
    assert (config.model, config.max_num_seqs, args.port) == ("/flag.gguf", 3, 9001)


def test_several_served_model_names(captured, tmp_path):
    r = runner.invoke(app, ["serve", "M", "--served-model-name", "a", "b", "--port", "9000"])
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "c.yaml"
    cfg.write_text("served-model-name: [c, d]\n")
    assert runner.invoke(app, ["serve", "--config", str(cfg)]).exit_code == 0
    assert runner.invoke(app, ["serve", "--served-model-name", "only"]).exit_code == 0
    (c1, a1), (c2, a2), (c3, a3) = captured
    assert (c1.served_model_name, a1.serving.served_model_names, a1.port) == (["a", "b"], ["a", "b"], 9000)
    assert a2.serving.served_model_names == ["c", "d"]
    assert (c3.served_model_name, a3.serving.served_model_names) == ("only", ["only"])


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--served-model-name"], "Option '--served-model-name' requires an argument."),
        (["--served-model-name", "--port", "1"], "Option '--served-model-name' requires an argument."),
        (["--served-model-name", "a", "a"], "--served-model-name takes distinct non-empty names"),
    ],
)
def test_bad_served_model_names(captured, argv, needle):
    r = runner.invoke(app, ["serve", *argv])
    assert r.exit_code == 2 and not captured and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr


def test_multi_value_rewrite_keeps_everything_else():
    assert engine_argv(["M", "--served-model-name", "a", "b", "--max_num_seqs", "4", "--", "-x"]) == [
        "M", "--served-model-name", "a", "--served-model-name", "b", "--max-num-seqs", "4", "--", "-x"
    ]  # fmt: skip
    assert engine_argv(["--served-model-name=a", "b"]) == ["--served-model-name=a", "b"]  # argparse: one


@pytest.mark.parametrize(
    "text,value",
    [
        ("32768", 32768),
        ("32k", 32000),
        ("32K", 32768),
        ("1m", 10**6),
        ("1M", 2**20),
        ("25.6k", 25600),
        (" 2g", 2 * 10**9),
    ],
)
def test_human_readable_sizes_as_vllm(text, value):
    assert parse_human_int("max_model_len", text) == value


@pytest.mark.parametrize("text", ["auto", "AUTO", "-1", " auto "])
def test_max_model_len_auto_as_vllm(text):
    # vllm/utils/argparse_utils.py, human_readable_int_or_auto: -1 or 'auto' -> -1 (the model's maximum).
    assert parse_human_int("max_model_len", text) == -1
    with pytest.raises(ConfigError, match="--max-num-batched-tokens"):
        parse_human_int("max_num_batched_tokens", "auto")


@pytest.mark.parametrize("text", ["1.5K", "32x", "k", "", "1e3"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ConfigError, match="--max-model-len"):
        parse_human_int("max_model_len", text)


def test_sizes_on_the_command_line_and_in_yaml(captured, tmp_path):
    assert (
        runner.invoke(app, ["serve", "--max-model-len", "32k", "--max-num-batched-tokens", "4K"]).exit_code
        == 0
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max-model-len: 8K\n")
    assert runner.invoke(app, ["serve", "--config", str(cfg)]).exit_code == 0
    (c1, _), (c2, _) = captured
    assert (c1.max_model_len, c1.max_num_batched_tokens, c2.max_model_len) == (32000, 4096, 8192)
    r = runner.invoke(app, ["serve", "--max-model-len", "1.5K"])
    assert r.exit_code == 2 and r.stderr.startswith("Error: --max-model-len 1.5K: decimals go only with k")
    assert runner.invoke(app, ["serve", "--max-model-len", "auto"]).exit_code == 0
    assert captured[-1][0].max_model_len == -1  # the resolver makes it the model's limit
    r = runner.invoke(app, ["serve", "--max-model-len", "-2"])
    assert r.exit_code == 2 and "--max-model-len must be positive, or -1 / auto" in r.stderr


@pytest.mark.parametrize("dtype", ["auto", "float", "float32"])
def test_vllm_dtypes_fd_runs(dtype):
    assert EngineConfig(dtype=dtype).validate().dtype == "float32"


@pytest.mark.parametrize("dtype", ["half", "float16", "bfloat16", "fp8"])
def test_vllm_dtypes_fd_refuses_name_what_to_use(captured, dtype):
    r = runner.invoke(app, ["serve", "--dtype", dtype])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"--dtype {dtype!r} is not supported" in r.stderr and "use float32, float or auto" in r.stderr


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["-pp", "2"], "--pipeline-parallel-size 2 is not supported: fd has no pipeline parallelism"),
        (
            ["--pipeline-parallel-size", "4"],
            "--tensor-parallel-size, or run copies with --data-parallel-size",
        ),
        (
            ["--load-format", "pt"],
            "--load-format 'pt' is not supported: fd loads safetensors folders and GGUF",
        ),
        (["--tokenizer-mode", "mistral"], "--tokenizer-mode 'mistral' is not supported"),
        (
            ["--chat-template-content-format", "x"],
            "--chat-template-content-format 'x': use auto, string or openai",
        ),
        (["--max-logprobs", "21"], "--max-logprobs must be between 0 and 20"),
        (["--mm-encoder-tp-mode", "pipeline"], "--mm-encoder-tp-mode 'pipeline': use weights or data"),
        (["--enable-mm-embeds"], "--enable-mm-embeds is not supported: fd reads pictures"),
        (["--max-logprobs", "-1"], "--max-logprobs must be between 0 and 20"),
    ],
)
def test_unsupported_vllm_values_say_what_to_use(captured, argv, needle):
    r = runner.invoke(app, ["serve", *argv])
    assert r.exit_code == 2 and not captured
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr


def test_each_vllm_option_without_effect_says_so_in_one_line():
    config = EngineConfig(
        trust_remote_code=True,
        enforce_eager=True,
        revision="main",
        download_dir="/tmp/hf",
        load_format="gguf",
        tokenizer_mode="hf",
        pipeline_parallel_size=1,
        chat_template_content_format="openai",
        enable_log_requests=True,
        disable_log_requests=True,
        disable_log_stats=True,
        mm_processor_cache_gb=4.0,
        disable_mm_preprocessor_cache=True,
        skip_mm_profiling=True,
        mm_encoder_tp_mode="data",
        cpu_offload_gb=4,
        data_parallel_address="127.0.0.1",
        data_parallel_rpc_port=13345,
    ).validate()
    notes = vllm_notes(config)
    flags = sorted(re.match(r"--[a-z-]+", n).group(0) for n in notes)
    # 1 / 0 / mp are what fd does; embeds are refused; the request-log flags and the KV connector
    # options act (log_requests; tests/cli/test_vllm_kv_parallel_flags.py)
    silent = {
        "--pipeline-parallel-size",
        "--enable-mm-embeds",
        "--enable-log-requests",
        "--disable-log-requests",
    }
    silent |= {"--data-parallel-size-local", "--data-parallel-start-rank", "--external-data-parallel-rank"}
    silent |= {"--data-parallel-external-lb", "--data-parallel-hybrid-lb"}
    silent |= {
        "--headless",
        "--kv-cache-memory-bytes",
        "--data-parallel-backend",
        "--kv-transfer-config",
        "--kv-offloading-size",
        "--kv-offloading-backend",
    }
    assert flags == sorted(
        "--" + f.replace("_", "-") for f in VLLM_FIELDS if "--" + f.replace("_", "-") not in silent
    )
    assert "--revision main has no effect: the model is a local file or folder" in " ".join(notes)
    assert all("\n" not in n for n in notes)
    assert vllm_notes(EngineConfig(load_format="auto", tokenizer_mode="auto", pipeline_parallel_size=1)) == []
    assert "no effect" in ACCESS_LOG_NOTE


def test_every_vllm_flag_is_a_field_and_stays_out_of_the_resolved_config():
    from fdcli_engine.resolved_config import ResolvedConfig

    assert set(VLLM_FLAGS) <= EngineConfig.field_names()
    assert not set(VLLM_FIELDS) & set(ResolvedConfig.__struct_fields__)
    assert "max_logprobs" in ResolvedConfig.__struct_fields__


def test_load_format_must_match_the_model():
    check_load_format("gguf", "gguf")
    check_load_format("safetensors", "hf")
    check_load_format(None, "gguf")
    with pytest.raises(ConfigError, match="--load-format safetensors does not match the model, a GGUF file"):
        check_load_format("safetensors", "gguf")


def test_max_logprobs_caps_requests():
    check_logprobs(5, 5, 5)
    check_logprobs(None, None, 0)
    with pytest.raises(
        InvalidRequestError, match="top_logprobs 6 is more than this server's --max-logprobs 5"
    ) as e:
        check_logprobs(6, None, 5, chat=True)
    assert e.value.param == "top_logprobs"
    with pytest.raises(InvalidRequestError) as e:
        check_logprobs(0, 1, 0)
    assert e.value.param == "prompt_logprobs"


def test_server_flags_reach_the_server_args(captured):
    r = runner.invoke(
        app, ["serve", "--root-path", "/llm", "--enable-request-id-headers", "--disable-uvicorn-access-log"]
    )
    assert r.exit_code == 0, r.output
    ((_, args),) = captured
    assert (args.root_path, args.enable_request_id_headers, args.disable_uvicorn_access_log) == (
        "/llm",
        True,
        True,
    )


def test_run_batch_takes_the_vllm_flags(monkeypatch, tmp_path):
    seen = {}

    def fake_run(opts, engine_args):
        seen.update(opts=opts, engine_args=engine_args)
        raise SystemExit(0)

    monkeypatch.setattr("fdcli_engine.entrypoints.batch.run_batch", fake_run)
    src = tmp_path / "in.jsonl"
    src.write_text("")
    r = runner.invoke(
        app,
        ["run-batch", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--served-model-name", "a", "b",
         "--max-model-len", "2k", "--trust-remote-code"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert seen["opts"].serving.served_model_names == ["a", "b"]
    assert seen["engine_args"]["max_model_len"] == 2000


def test_dotted_keys_fold_into_the_options_json():
    """vLLM's FlexibleArgumentParser: `--opt.a.b V` / `--opt.a.b=V` nest, V is JSON when it parses,
    `key+ x,y` is a list, and one option's dotted keys make one object."""
    argv = engine_argv(
        ["M", "--speculative_config.method", "ngram", "--port", "1",
         "--speculative-config.num_speculative_tokens=3", "--speculative-config.x.y+", "a,b",
         "--speculative-config.x.z", "text", "--", "--a.b", "1"]
    )  # fmt: skip
    assert argv[:3] == ["M", "--speculative-config", argv[2]] and argv[3:] == [
        "--port",
        "1",
        "--",
        "--a.b",
        "1",
    ]
    assert json.loads(argv[2]) == {
        "method": "ngram", "num_speculative_tokens": 3, "x": {"y": ["a", "b"], "z": "text"}
    }  # fmt: skip


# ---- every flag of `vllm serve`: a working option, a no-effect note, or a refusal ------------------------
FLAGS_FIXTURE = Path(__file__).parent / "fixtures" / "vllm_serve_flags.txt"


def _serve_option_names() -> set[str]:
    import typer.main

    command = typer.main.get_command(app).commands["serve"]
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)}


def test_every_vllm_serve_flag_is_an_fd_serve_option():
    wanted = [ln for ln in FLAGS_FIXTURE.read_text().splitlines() if ln and not ln.startswith("#")]
    missing = sorted(set(wanted) - _serve_option_names())
    assert len(wanted) > 200 and not missing, missing


def _value_of(name: str) -> list[str]:
    """A value of vLLM's type for a table flag, never one of its silent values."""
    row = VLLM_FLAG_TABLE[name]
    flag = "--" + name.replace("_", "-")
    if row.type is bool and True in row.silent:
        return ["--no-" + name.replace("_", "-")]
    return {bool: [flag], int: [flag, "2"], float: [flag, "0.5"], dict: [flag, '{"a": 1}']}.get(
        row.type, [flag, "x"]
    )


@pytest.mark.parametrize("name", [n for n, row in VLLM_FLAG_TABLE.items() if row.kind == REFUSE])
def test_each_refused_vllm_flag_says_what_to_use(captured, name):
    r = runner.invoke(app, ["serve", *_value_of(name)])
    assert r.exit_code == 2 and not captured, r.output
    flag = "--" + name.replace("_", "-")
    assert r.stderr.startswith(f"Error: {flag}") and r.stderr.count("\n") == 1, r.stderr
    assert f"is not supported: {VLLM_FLAG_TABLE[name].why}" in r.stderr


def test_refused_flags_given_as_fd_does_are_accepted(captured):
    argv = ["serve", "--no-enable-lora", "--scheduling-policy", "fcfs", "--config-format", "hf"]
    assert runner.invoke(app, argv).exit_code == 0
    assert vllm_notes(captured[0][0]) == []


def test_each_vllm_flag_without_effect_logs_one_line(captured):
    notes_of = [n for n, row in VLLM_FLAG_TABLE.items() if row.kind == NOTE]
    argv = ["serve"] + [word for n in notes_of for word in _value_of(n)]
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, r.output
    notes = vllm_notes(captured[0][0])
    assert [re.match(r"--[a-z0-9-]+", n).group(0) for n in notes] == [
        "--" + n.replace("_", "-") for n in notes_of
    ]
    assert all(" has no effect: " in n and "\n" not in n for n in notes)


def test_the_table_flags_stay_out_of_the_resolved_config():
    from fdcli_engine.resolved_config import ResolvedConfig

    assert not set(VLLM_FLAG_TABLE) & set(ResolvedConfig.__struct_fields__)


@pytest.mark.parametrize(
    "argv,want",
    [
        (["--limit-mm-per-prompt.image", "2", "--limit_mm_per_prompt.video=0"],
         ["--limit-mm-per-prompt", '{"image": 2, "video": 0}']),
        (["--speculative-config", '{"method": "ngram"}', "--speculative-config.num_speculative_tokens", "3"],
         ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']),
        (["--compilation-config.pass_config.fuse", "true", "--compilation-config.sizes+", "1,2"],
         ["--compilation-config", '{"pass_config": {"fuse": true}, "sizes": ["1", "2"]}']),
        (["--structured-outputs-config.backend", "guidance", "--port", "1"],
         ["--structured-outputs-config", '{"backend": "guidance"}', "--port", "1"]),
        (["-O3", "-O", "2", "-O=1", "-O.level", "0"],
         ["--optimization-level", "3", "--optimization-level", "2", "--optimization-level", "1",
          "--compilation-config", '{"level": 0}']),
        (["--hf-token", "--port", "1"], ["--hf-token", "true", "--port", "1"]),
        (["--", "--limit-mm-per-prompt.image", "2"], ["--", "--limit-mm-per-prompt.image", "2"]),
    ],
)  # fmt: skip
def test_vllm_dotted_and_short_forms(argv, want):
    # vLLM's FlexibleArgumentParser.parse_args (vllm/utils/argparse_utils.py): `--a.b v` -> --a '{"b": v}'
    # (v as JSON, else text; `+` a comma list; repeats merge); -O3 / -O 3 / -O=3 -> --optimization-level.
    assert engine_argv(argv) == want


def test_dotted_json_reaches_the_engine_and_the_server(captured):
    r = runner.invoke(
        app,
        ["serve", "M", "--limit-mm-per-prompt.image", "2", "--speculative-config.method", "ngram",
         "--speculative-config.num_speculative_tokens", "3", "--structured-outputs-config.backend", "guidance",
         "--compilation-config.level", "3", "-O3"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    ((config, args),) = captured
    assert json.loads(args.serving.limit_mm_per_prompt) == {"image": 2}
    assert config.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    assert config.guided_decoding_backend == "guidance"
    assert config.compilation_config == {"level": 3} and config.optimization_level == "3"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--structured-outputs-config.backend"], "requires an argument"),
        (["--structured-outputs-config..backend", "x"], "name a key after each dot"),
        (["--max-model-len.x", "1"], "--max-model-len does not take a JSON object"),
        (["--limit-mm-per-prompt.image"], "Option '--limit-mm-per-prompt.image' requires an argument."),
    ],
)
def test_bad_dotted_and_size_forms_are_one_line(captured, argv, needle):
    r = runner.invoke(app, ["serve", *argv])
    assert r.exit_code == 2 and not captured and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr


def test_vllm_server_flags_reach_the_server_args(captured, tmp_path):
    cert, key, conf = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "log.json"
    for f in (cert, key, conf):
        f.write_text("{}")
    r = runner.invoke(
        app,
        ["serve", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--ssl-ca-certs", str(cert),
         "--ssl-cert-reqs", "2", "--ssl-ciphers", "ECDHE-RSA-AES256-GCM-SHA384", "--disable-fastapi-docs",
         "--enable-force-include-usage", "--enable-server-load-tracking", "--log-config-file", str(conf),
         "--uvicorn-log-level", "debug"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    ((_, args),) = captured
    assert (args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs) == (str(cert), str(key), str(cert))
    assert (args.ssl_cert_reqs, args.ssl_ciphers) == (2, "ECDHE-RSA-AES256-GCM-SHA384")
    assert (
        args.disable_fastapi_docs
        and args.enable_server_load_tracking
        and args.serving.enable_force_include_usage
    )
    assert (args.log_config_file, args.uvicorn_log_level) == (str(conf), "debug")


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--ssl-certfile", "/no/such.pem"], "--ssl-certfile '/no/such.pem' is not a file"),
        (["--ssl-keyfile", "FILE"], "--ssl-keyfile and --ssl-ca-certs need --ssl-certfile"),
        (["--ssl-certfile", "FILE", "--ssl-cert-reqs", "3"], "--ssl-cert-reqs must be 0 (none), 1"),
        (["--ssl-certfile", "FILE", "--ssl-cert-reqs", "2"], "--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs"),
        (["--log-config-file", "/no/such.json"], "--log-config-file '/no/such.json': No such file"),
        (["--log-config-file", "LIST"], "must hold a JSON object (logging.config.dictConfig)"),
        (["--uvicorn-log-level", "loud"], "--uvicorn-log-level 'loud': use critical, error, warning"),
    ],
)
def test_bad_server_flags_are_one_line(captured, tmp_path, argv, needle):
    (tmp_path / "f").write_text("x")
    (tmp_path / "l").write_text("[]")
    argv = [{"FILE": str(tmp_path / "f"), "LIST": str(tmp_path / "l")}.get(a, a) for a in argv]
    r = runner.invoke(app, ["serve", *argv])
    assert r.exit_code == 2 and not captured and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
