"""FastDeploy's launch lines run as `fd serve` (the module prefix replaced), and bad option values fail
in one line before paddle loads.

The lines come verbatim from FastDeploy's docs pages (fixtures/fastdeploy_launch_lines.txt): ERNIE-4.5
and MiniCPM4 best practices, online serving, early stopping, online quantization, disaggregation. Each
must parse: it either resolves into exactly the EngineConfig written below, or stops with the one line
that says why fd cannot run it here (tensor parallelism, a GPU-only quantization, a prefill/decode role,
a feature fd lacks); adapted to one device, every other flag on it passes.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fdcli.commands import serve as serve_cmd
from fdcli.main import app
from fdcli_engine.config import EngineConfig
from fdcli_engine.entrypoints.openai.serving_options import check_serving_options, image_limit
from fdcli_engine.fastdeploy_compat import (
    COMPAT_FIELDS,
    FASTDEPLOY_ONLY_QUANTIZATIONS,
    SCHEDULER_TUNING,
    fastdeploy_notes,
)
from fdcli_engine.multimodal.image_limit import limit_notes

FIXTURE = Path(__file__).parent / "fixtures" / "fastdeploy_launch_lines.txt"
MODULE = ["python", "-m", "fastdeploy.entrypoints.openai.api_server"]
REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@dataclass
class Entry:
    argv: list[str]  # after `fd`
    env: dict[str, str] = field(default_factory=dict)


def _command(lines: list[str]) -> Entry:
    """A page's shell block: `export K=V` and `K=V` lines, then the command (variables expanded)."""
    script = "\n".join(line for line in lines if not line.startswith("#")).replace("\\\n", "")
    env, names, command = {}, {}, None
    for line in script.splitlines():
        line = line.strip()
        if m := re.fullmatch(r"(export )?(\w+)=(.*)", line):
            value = shlex.split(m.group(3))[0]
            (env if m.group(1) else names)[m.group(2)] = value
        elif line.startswith(" ".join(MODULE)):
            command = line.removesuffix("\\")
    assert command is not None, lines
    for name, value in names.items():  # the pages use ${quant_type}, unquoted
        command = command.replace(f"${{{name}}}", value)
    argv = shlex.split(command)
    assert argv[:3] == MODULE
    return Entry(["serve", *argv[3:]], env)


def load_entries() -> dict[str, Entry]:
    blocks: list[tuple[str, list[str]]] = []
    for line in FIXTURE.read_text().splitlines():
        if line.startswith("## "):
            blocks.append((line[3:].strip(), []))
        elif blocks and line.strip():
            blocks[-1][1].append(line)
    entries: dict[str, Entry] = {}
    for header, lines in blocks:
        name, _, base = header.partition(" add to ")
        if base:  # "add the following lines to the startup parameters"
            added = shlex.split(" ".join(line for line in lines if not line.startswith("#")))
            entries[name] = Entry(entries[base].argv + added, entries[base].env)
        else:
            entries[name] = _command(lines)
    return entries


ENTRIES = load_entries()

_03B = dict(
    model="baidu/ERNIE-4.5-0.3B-Paddle",
    tensor_parallel_size=1,
    quantization="wint4",
    max_model_len=32768,
    max_num_seqs=128,
    load_choices="default_v1",
)
_21B = dict(_03B, model="baidu/ERNIE-4.5-21B-A3B-Paddle", load_choices=None)
_THINKING = dict(
    model="baidu/ERNIE-4.5-21B-A3B-Thinking",
    tensor_parallel_size=1,
    max_model_len=131072,
    quantization="wint8",
    max_num_seqs=32,
)
_MTP = {"method": "mtp", "num_speculative_tokens": 1, "model": "${path_to_mtp_model}"}
_PREFIX = dict(enable_prefix_caching=True, swap_space=50.0)
_TP8 = "8 engine rank(s) on this node (--tensor-parallel-size 8"
_TP4 = "4 engine rank(s) on this node (--tensor-parallel-size 4"
_FP8 = "--quantization block_wise_fp8 is a FastDeploy GPU method fd has no kernels for"
_EARLY_STOP = (
    "early stopping (--enable-early-stop, or enable_early_stop in --early-stop-config) is not supported"
)
_SCHEDULER = "--scheduler-name splitwise is not supported: fd has one local scheduler per server"
_MINICPM = dict(model="openbmb/MiniCPM4.1-8B", tensor_parallel_size=1, max_model_len=32768)
_EARLY = dict(
    model="baidu/ERNIE-4.5-0.3B-Paddle", engine_worker_queue_port="8182", max_model_len=32768, max_num_seqs=32
)

# The EngineConfig each line resolves into (every other field at its default), or its one-line error.
EXPECTED: dict[str, dict | str] = {
    "0.3b": _03B,
    "0.3b-prefix-caching": dict(_03B, **_PREFIX),
    "0.3b-chunked-prefill": dict(_03B, enable_chunked_prefill=True),
    "0.3b-cudagraph": dict(_03B, use_cudagraph=True),
    "21b": _21B,
    "21b-prefix-caching": dict(_21B, **_PREFIX),
    "21b-chunked-prefill": dict(_21B, enable_chunked_prefill=True),
    "21b-mtp": dict(_21B, speculative_config=_MTP),
    "21b-prefill": _FP8,
    "21b-decode": _FP8,
    "21b-thinking": _THINKING,
    "21b-thinking-prefix-caching": dict(_THINKING, **_PREFIX),
    "21b-thinking-chunked-prefill": dict(_THINKING, enable_chunked_prefill=True),
    "21b-thinking-cudagraph": dict(_THINKING, use_cudagraph=True),
    **{name: _TP8 for name in ENTRIES if name.startswith(("300b", "turbo-x1"))},
    **{f"{m}-{role}": _TP4 for m in ("300b", "turbo-x1") for role in ("prefill", "decode")},
    "serving": _TP8,
    "serving-logprob": _TP8,
    "early-stop": _EARLY_STOP,
    "early-stop-config": _EARLY_STOP,
    "quant-wint8": _TP8,
    "quant-block-fp8": _FP8,
    "minicpm4-wint4": dict(_MINICPM, quantization="wint4", max_num_seqs=128),
    "minicpm4-bf16": dict(_MINICPM, max_num_seqs=64),
    "splitwise-prefill": _TP4,
    "vl-28b": dict(
        model="baidu/ERNIE-4.5-VL-28B-A3B-Paddle",
        engine_worker_queue_port="8182",
        tensor_parallel_size=1,
        max_model_len=32768,
        max_num_seqs=256,
        gpu_memory_utilization=0.9,
        max_num_batched_tokens=384,
        quantization="wint4",
    ),
}
# A refused line adapted to one device (tp 1, wint8) still stops for what fd lacks: this line says so.
ON_ONE_DEVICE = {"early-stop": _EARLY_STOP, "early-stop-config": _EARLY_STOP, "splitwise-prefill": _SCHEDULER}


def test_every_entry_has_an_expectation():
    assert set(ENTRIES) == set(EXPECTED) and len(ENTRIES) == 40


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_launch_line_parses_and_resolves(captured, name):
    entry, expected = ENTRIES[name], EXPECTED[name]
    r = runner.invoke(app, entry.argv, env=entry.env)
    assert "No such option" not in r.output and "Usage:" not in r.output, r.output
    if isinstance(expected, str):
        assert r.exit_code == 2 and not captured
        assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and expected in r.stderr, r.stderr
        return
    assert r.exit_code == 0, r.output
    ((config, args),) = captured
    assert config == EngineConfig(**expected)
    if name.startswith("21b-thinking"):
        assert (args.serving.reasoning_parser, args.serving.tool_call_parser) == ("ernie-x1", "ernie-x1")
    check_serving_options(args.serving)  # what fd serve checks next, before the model loads
    if name == "vl-28b":  # images only: the video count is named as without effect
        assert image_limit(args.serving) == 100 and limit_notes(args.serving.limit_mm_per_prompt)


def _on_one_device(argv: list[str]) -> list[str]:
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--tensor-parallel-size":
            out[i + 1] = "1"
        if arg == "--quantization" and out[i + 1] == "block_wise_fp8":
            out[i + 1] = "wint8"
    return out


@pytest.mark.parametrize("name", sorted(n for n, e in EXPECTED.items() if isinstance(e, str)))
def test_refused_lines_pass_on_one_device_but_for_the_prefill_decode_role(captured, name):
    entry = ENTRIES[name]
    r = runner.invoke(app, _on_one_device(entry.argv), env=entry.env)
    role = next((entry.argv[i + 1] for i, a in enumerate(entry.argv) if a == "--splitwise-role"), None)
    if name in ON_ONE_DEVICE:
        assert r.exit_code == 2 and not captured and r.stderr.count("\n") == 1, r.output
        assert r.stderr.startswith("Error: ") and ON_ONE_DEVICE[name] in r.stderr
        assert "--router HOST:PORT" in r.stderr or role is None  # the splitwise line: use `fd router`
    elif role is None:
        assert r.exit_code == 0, r.output
        ((config, _),) = captured
        assert config.tensor_parallel_size == 1 and config.model.startswith(("baidu/ERNIE-4.5-", "ERNIE-4.5"))
    else:
        # fd pairs prefill and decode instances through `fd router`: the line says to add --router,
        # and with it the line starts that role.
        assert r.exit_code == 2 and not captured
        assert "--router HOST:PORT" in r.stderr and r.stderr.count("\n") == 1
        r = runner.invoke(app, [*_on_one_device(entry.argv), "--router", "127.0.0.1:9000"], env=entry.env)
        assert r.exit_code == 0, r.output
        assert captured[-1][0].splitwise_role == role


def test_pd_line_options_keep_fastdeploy_types(captured):
    """The decode line with its role made `mixed`: every other option arrives typed as FastDeploy's."""
    argv = _on_one_device(ENTRIES["21b-decode"].argv)
    argv[argv.index("--splitwise-role") + 1] = "mixed"
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, r.output
    ((config, args),) = captured
    assert (config.gpu_memory_utilization, config.kv_cache_ratio) == (0.85, 0.1)
    assert (config.engine_worker_queue_port, config.cache_queue_port, config.innode_prefill_ports) == (
        "8013",
        "8015",
        "7013",
    )
    assert (args.port, args.metrics_port, config.splitwise_role) == (9012, 8014, "mixed")
    r = runner.invoke(app, _on_one_device(ENTRIES["21b-prefill"].argv)[:-2])  # without --splitwise-role
    assert r.exit_code == 0, r.output
    assert captured[-1][0].num_kv_blocks == 40000  # --num-gpu-blocks-override


# A value of each compatibility option that fd accepts; the refused ones (None here) are tested below.
_ACCEPTED: dict[str, object] = {
    "workers": 2,
    "controller_port": 9000,
    "enable_mm_output": True,
    "timeout": 30,
    "model_config_name": "config.json",  # what fd reads: silent
    "task": "generate",
    "use_warmup": 0,
    "max_encoder_cache": 0,
    "max_processor_cache": 0.5,
    "enable_mm": True,
    "load_strategy": "normal",
    "rsync_config": {"a": 1},
    "guided_decoding_disable_any_whitespace": "true",
    "enable_logprob": True,
    "logprobs_mode": "raw_logprobs",  # what fd returns: silent
    "early_stop_config": {"window_size": 1000},
    "lm_head_fp32": True,
    "logits_processors": ["fastdeploy.model_executor.logits_processor:LogitBiasLogitsProcessor"],
    "model_impl": "auto",
    "use_cudagraph": True,
    "graph_optimization_config": {"use_cudagraph": True},
    "enable_custom_all_reduce": True,
    "disable_custom_all_reduce": True,
    "enable_flashinfer_allreduce_fusion": True,
    "use_internode_ll_two_stage": True,
    "disable_sequence_parallel_moe": True,
    "gpu_memory_utilization": 0.9,
    "local_data_parallel_id": 0,
    "enable_eplb": True,
    "eplb_config": {"redundant_experts_num": 0},
    "enable_chunked_moe": True,
    "chunked_moe_size": 256,
    "shutdown_comm_group_if_worker_idle": False,
    "load_choices": "default_v1",
    "kv_cache_ratio": 0.75,
    "prealloc_dec_block_slot_num_threshold": 12,
    "cache_queue_port": 8183,
    "static_decode_blocks": 2,
    "write_policy": "write_through",
    "engine_worker_queue_port": "8182",
    "enable_output_caching": False,
    "max_num_partial_prefills": 1,
    "max_long_partial_prefills": 1,
    "long_prefill_token_threshold": 0,
    "disable_chunked_mm_input": True,
    "innode_prefill_ports": "8182",
    "rdma_comm_ports": "7671,7672",
    "scheduler_name": "local",  # fd's one scheduler: silent
    "enable_overlap_schedule": True,
    **dict.fromkeys(SCHEDULER_TUNING, 1),
    "scheduler_host": "127.0.0.1",
    "scheduler_min_load_score": 3.0,
}
_SILENT = {"model_config_name", "logprobs_mode", "scheduler_name"}


def test_each_option_without_effect_says_so_in_one_line():
    config = EngineConfig(
        **{k: v for k, v in _ACCEPTED.items() if k not in SCHEDULER_TUNING},
        swap_space=50,
        speculative_config=_MTP,
        splitwise_role="mixed",
        data_parallel_size=1,
    ).validate()
    notes = fastdeploy_notes(config)
    flags = [re.match(r"--[a-z0-9-]+", n).group(0) for n in notes]
    expected = {
        "--" + f.replace("_", "-") for f in _ACCEPTED if f not in _SILENT and f not in SCHEDULER_TUNING
    }
    expected = {"--no-enable-output-caching" if f == "--enable-output-caching" else f for f in expected}
    assert sorted(flags) == sorted(expected) and len(flags) == len(set(flags))
    assert "--use-cudagraph has no effect on CPU (there are no CUDA graphs to capture)" in notes
    assert any("logprobs are always available in fd" in n for n in notes)
    assert not any(n.startswith("--swap-space") for n in notes)  # a real option now (kv-offload.md)
    assert all("\n" not in n for n in notes)
    no_op = EngineConfig(use_cudagraph=False, swap_space=0, splitwise_role="mixed", data_parallel_size=1)
    assert fastdeploy_notes(no_op.validate()) == []
    assert fastdeploy_notes(EngineConfig(enable_output_caching=True).validate()) == []  # what fd does


def test_scheduler_tuning_flags_share_one_line():
    config = EngineConfig(**{n: _ACCEPTED[n] for n in SCHEDULER_TUNING}).validate()
    (note,) = fastdeploy_notes(config)
    assert note.startswith(", ".join("--" + n.replace("_", "-") for n in SCHEDULER_TUNING) + ": no effect")


def test_every_compat_field_is_accepted_or_refused_here():
    refused = set(_REFUSED)
    assert set(COMPAT_FIELDS) == (set(_ACCEPTED) | refused) and not set(_ACCEPTED) & refused


# The flags of the probe that found them missing, as FastDeploy users write them: each parses.
@pytest.mark.parametrize(
    "argv,note",
    [
        (["--enable-logprob"], "--enable-logprob has no effect: logprobs are always available in fd"),
        (["--use-warmup", "0"], "--use-warmup has no effect"),
        (["--workers", "4"], "--workers has no effect"),
        (
            ["--guided-decoding-disable-any-whitespace", "True"],
            "--guided-decoding-disable-any-whitespace True: fd's JSON",
        ),
        (["--early-stop-config", '{"window_size": 1000}'], "--early-stop-config has no effect"),
        (["--max-processor-cache", "0"], "--max-processor-cache has no effect"),
        (["--lm_head-fp32"], "--lm-head-fp32 has no effect"),
        (["--no-enable-output-caching"], "--no-enable-output-caching has no effect"),
        (["--scheduler-name", "local", "--scheduler-ttl", "900"], "--scheduler-ttl: no effect"),
    ],
)
def test_fastdeploy_flags_parse_and_say_they_do_nothing(captured, argv, note):
    r = runner.invoke(app, ["serve", *argv])
    assert r.exit_code == 0, r.output
    ((config, _),) = captured
    notes = fastdeploy_notes(config)
    assert len(notes) == 1 and notes[0].startswith(note), notes


def test_mm_processor_kwargs_reach_the_engine(captured):
    # FastDeploy's ERNIE-4.5-VL launch line: the image processor's setting for every request
    # (multimodal/processor_overrides.py; a video key is named at start as having no effect).
    r = runner.invoke(
        app, ["serve", "--mm-processor-kwargs", '{"image_max_pixels": 12845056, "video_fps": 2}']
    )
    assert r.exit_code == 0, r.output
    ((config, _),) = captured
    assert config.mm_processor_kwargs == {"image_max_pixels": 12845056, "video_fps": 2}
    assert fastdeploy_notes(config) == []


_REFUSED = {
    "tokenizer_base_url": (["--tokenizer-base-url", "http://t:8000"], "use --tokenizer PATH"),
    "tool_parser_plugin": (["--tool-parser-plugin", "my.py"], "use --tool-call-parser"),
    "dynamic_load_weight": (["--dynamic-load-weight"], "fd loads the weights once at start"),
    "plas_attention_config": (["--plas-attention-config", "{}"], "fd computes full attention"),
    "enable_keep_sampling_mask": (["--enable-keep-sampling-mask"], "fd does not return the sampling mask"),
    "enable_early_stop": (["--enable-early-stop"], "use stop or max_tokens in the request"),
    "enable_entropy": (["--enable-entropy"], "fd does not return the entropy of each token"),
    "routing_replay_config": (["--routing-replay-config", "{}"], "fd does not record MoE routing"),
    "kvcache_storage_backend": (["--kvcache-storage-backend", "file"], "--kv-offload-dir DIR"),
}
_BAD_VALUES = [
    (["--scheduler-name", "global"], "--scheduler-name global is not supported:", "`fd router`"),
    (
        ["--logits-processors", "my.mod:Proc"],
        "--logits-processors my.mod:Proc is not supported",
        "logit_bias",
    ),
    (
        ["--logprobs-mode", "processed_logprobs"],
        "--logprobs-mode 'processed_logprobs' is not",
        "raw_logprobs",
    ),
    (["--logprobs-mode", "x"], "--logprobs-mode 'x': use one of raw_logprobs", "raw_logits"),
    (["--task", "embedding"], "--task 'embedding' is not supported", "--runner pooling"),
    (["--model-impl", "x"], "--model-impl 'x': use auto", "paddleformers"),
    (["--model-config-name", "c.json"], "--model-config-name 'c.json' is not supported", "config.json"),
    (["--local-data-parallel-id", "1"], "--local-data-parallel-id 1 is not supported", "start one server"),
    (["--guided-decoding-disable-any-whitespace", "maybe"], "whitespace 'maybe': use true or false", ""),
    (["--write-policy", "write_back"], "--write-policy 'write_back': use write_through", ""),
    (["--rdma-comm-ports", "x"], "--rdma-comm-ports must be a port", ""),
    (["--early-stop-config", "[1]"], "--early-stop-config must be a JSON object", ""),
]


@pytest.mark.parametrize(
    "argv,needle,instead", [(a, "is not supported", i) for a, i in _REFUSED.values()] + _BAD_VALUES
)
def test_missing_features_and_bad_values_are_refused_in_one_line(captured, argv, needle, instead):
    r = runner.invoke(app, ["serve", *argv])
    assert r.exit_code == 2 and not captured, r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert needle in r.stderr and instead in r.stderr, r.stderr


def test_the_0_3b_line_resolves_on_a_tiny_ernie(captured, tmp_path, caplog):
    import tiny_models

    from fdcli_engine.config_resolver import resolve_config

    folder = tiny_models.make_tiny_checkpoint(
        "Ernie4_5ForCausalLM", tmp_path / "ernie", head_dim=16, max_position_embeddings=131072
    )
    tiny_models.write_tiny_tokenizer(folder)
    argv = list(ENTRIES["0.3b-cudagraph"].argv)
    argv[argv.index("--model") + 1] = str(folder)
    assert runner.invoke(app, argv).exit_code == 0
    with caplog.at_level("WARNING", logger="fd.config"):
        resolved = resolve_config(captured[0][0])
    assert (resolved.quantization, resolved.max_model_len, resolved.max_num_seqs) == ("wint4", 32768, 128)
    assert (resolved.layout, resolved.runner, resolved.model_path) == ("hf", "generate", folder)
    assert not any(hasattr(resolved, f) for f in COMPAT_FIELDS)  # no process acts on them
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "--load-choices default_v1: fd has one weight loader (HF, Paddle and GGUF checkpoints); the option has "
        "no effect",
        "--use-cudagraph has no effect on CPU (there are no CUDA graphs to capture)",
    ]


_PROBE = (
    "import atexit, runpy, sys; "
    "atexit.register(lambda: print('paddle imported:', 'paddle' in sys.modules)); "
    "sys.argv = ['fd', *sys.argv[1:]]; runpy.run_module('fdcli.main', run_name='__main__')"
)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--quantization", "wint2"], "--quantization wint2 is a FastDeploy GPU method"),
        (["-tp", "0"], "--tensor-parallel-size must be at least 1, got 0"),
        (["--runner", "foo"], "--runner 'foo': use auto, generate or pooling"),
        (["--kv-cache-dtype", "bad"], "--kv-cache-dtype 'bad' is not supported"),
        (["--data-parallel-size", "4096"], "4096 engine rank(s) on this node"),
        (["--splitwise-role", "decode"], "--splitwise-role decode needs --router HOST:PORT"),
        (["--splitwise-role", "x"], "--splitwise-role 'x': use mixed, prefill or decode"),
    ],
)
def test_bad_values_fail_before_paddle_loads(argv, needle):
    p = subprocess.run(
        [sys.executable, "-c", _PROBE, "serve", *argv], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("Error: ") and needle in p.stderr, p.stderr
    assert p.stdout.strip() == "paddle imported: False"


@pytest.mark.parametrize("name", FASTDEPLOY_ONLY_QUANTIZATIONS)
def test_fastdeploy_quantizations_name_the_ones_fd_has(captured, name):
    r = runner.invoke(app, ["serve", "--quantization", name])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"--quantization {name} is a FastDeploy GPU method" in r.stderr
    assert "use auto, wint8, wint4, gguf or none" in r.stderr


def _wrong_value(tp) -> object:
    """A YAML value the annotation `tp` does not take."""
    members = typing.get_args(tp) or (tp,)
    if any(typing.get_origin(m) is list for m in members):  # served_model_name: a name or a list
        return {"a": 1}
    return (
        ["a", "list"]
        if str in members or any(typing.get_origin(m) is dict or m is dict for m in members)
        else "lots"
    )


_ENGINE_KEYS = typing.get_type_hints(EngineConfig)


@pytest.mark.parametrize("key", sorted(_ENGINE_KEYS) + sorted(serve_cmd._TYPES))
def test_every_typed_yaml_key_reports_its_type_in_one_line(captured, tmp_path, key):
    if key in _ENGINE_KEYS:
        value = _wrong_value(_ENGINE_KEYS[key])
    else:
        value = 3 if serve_cmd._TYPES[key] in (str, list, bool) else "lots"
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"{key.replace('_', '-')}: {value!r}\n".replace("'", '"'))
    r = runner.invoke(app, ["serve", "--config", str(cfg)])
    assert r.exit_code == 2 and not captured, r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.output
    assert key.replace("_", "-") in r.stderr and "Traceback" not in r.output
    assert "lots" not in r.stderr or "must be" in r.stderr


def test_max_num_seqs_lots_names_the_key_and_type(captured, tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text('max-num-seqs: "lots"\n')
    r = runner.invoke(app, ["serve", "--config", str(cfg)])
    assert r.exit_code == 2
    assert r.stderr == f"Error: --config {cfg}: max-num-seqs must be an integer, got 'lots'\n"


def test_fastdeploy_options_as_yaml_keys(captured, tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        "load_choices: default_v1\nuse-cudagraph: true\nswap-space: 50\nmetrics-port: 9100\n"
        "graph-optimization-config: {use_cudagraph: false}\nengine-worker-queue-port: 8182\n"
        "num-gpu-blocks-override: 64\n"
    )
    r = runner.invoke(app, ["serve", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    ((config, args),) = captured
    assert (config.load_choices, config.use_cudagraph, config.swap_space) == ("default_v1", True, 50)
    assert (config.graph_optimization_config, config.engine_worker_queue_port) == (
        {"use_cudagraph": False},
        8182,
    )
    assert (config.num_kv_blocks, args.metrics_port) == (64, 9100)


def test_underscore_spellings_parse_as_fastdeploys_parser_takes_them(captured):
    r = runner.invoke(
        app, ["serve", "--load_choices=default", "--max_num_seqs", "4", "--served-model-name", "a_b"]
    )
    assert r.exit_code == 0, r.output
    ((config, _),) = captured
    assert (config.load_choices, config.max_num_seqs, config.served_model_name) == ("default", 4, "a_b")


@pytest.mark.parametrize(
    "argv", [["--metrics-port", "0"], ["--metrics-port", "70000"], ["--metrics-port", "8000"]]
)
def test_metrics_port_must_be_a_port_other_than_the_api_port(captured, argv):
    r = runner.invoke(app, ["serve", "--port", "8000", *argv])
    assert r.exit_code == 2 and not captured
    assert r.stderr.startswith("Error: --metrics-port must be between 1 and 65535 and differ from --port")
