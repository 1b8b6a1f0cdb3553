"""The image-input flags of `fd serve` / `fd run-batch`: --allowed-local-media-path,
--allowed-media-domains, --limit-mm-per-prompt (vLLM's names and JSON form), parsed into ServingOptions
and checked before the model loads."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fdcli.main import app
from fdcli_engine.entrypoints.openai.serving_options import (
    ServingOptions,
    check_serving_options,
    image_limit,
    media_policy,
)
from fdcli_engine.errors import ConfigError
from fdcli_engine.multimodal.image_limit import limit_notes

runner = CliRunner()


def test_flags_reach_the_serving_options(launched_args, tmp_path):
    args = [
        "serve",
        "--allowed-local-media-path",
        str(tmp_path),
        "--allowed-media-domains",
        "upload.wikimedia.org",
        "--allowed-media-domains",
        "Images.Example.com,cdn.example.org",
        "--limit-mm-per-prompt",
        '{"image": 4}',
    ]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    serving = launched_args[-1].serving
    assert serving.allowed_local_media_path == str(tmp_path)
    assert image_limit(serving) == 4
    policy = media_policy(serving)
    assert policy.allowed_domains == ("upload.wikimedia.org", "images.example.com", "cdn.example.org")
    assert policy.allowed_local_path == str(tmp_path.resolve())
    assert not policy.allow_loopback_first_hop  # no flag sets the test allowance


def test_yaml_takes_the_mapping_form(launched_args, tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("limit-mm-per-prompt: {image: 3}\nallowed-media-domains: [a.example.com]\n")
    r = runner.invoke(app, ["serve", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    serving = launched_args[-1].serving
    assert image_limit(serving) == 3 and media_policy(serving).allowed_domains == ("a.example.com",)


def test_defaults_fetch_nothing():
    options = ServingOptions()
    policy = media_policy(options)
    assert (policy.allowed_local_path, policy.allowed_domains, image_limit(options)) == (None, (), 16)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"limit_mm_per_prompt": "image"}, "must be JSON"),
        ({"limit_mm_per_prompt": "image=four"}, "must be JSON"),
        ({"limit_mm_per_prompt": "image=-1"}, "a count of 0 or more"),
        ({"limit_mm_per_prompt": "video=-1"}, "a count of 0 or more"),
        ({"limit_mm_per_prompt": '{"image": {"count": 2, "fps": 3}}'}, "'image' takes count, width, height"),
        ({"limit_mm_per_prompt": '{"image": {"width": 64}}'}, "a count of 0 or more"),
        ({"limit_mm_per_prompt": "[4]"}, "JSON object"),
        ({"limit_mm_per_prompt": '{"image": -1}'}, "a count of 0 or more"),
        ({"limit_mm_per_prompt": '{"image": true}'}, "a count of 0 or more"),
        ({"limit_mm_per_prompt": '{"video": "many"}'}, "'video' needs a count of 0 or more"),
        ({"allowed_local_media_path": "/no/such/folder"}, "is not a folder"),
        ({"allowed_media_domains": ["https://example.com"]}, "host names"),
        ({"allowed_media_domains": ["example.com:8080"]}, "host names"),
    ],
)
def test_bad_flags_fail_before_the_model_loads(options, words):
    with pytest.raises(ConfigError, match=words):
        check_serving_options(ServingOptions(**options))


@pytest.mark.parametrize(
    "value",
    [
        "image=3",  # vLLM 0.9 and before
        "Image=3, video=0",
        '{"image": {"count": 3, "width": 512, "height": 512}}',  # vLLM's configurable form
        {"image": {"count": 3}},  # the YAML / LLM mapping
    ],
)
def test_vllm_limit_forms(value):
    assert image_limit(ServingOptions(limit_mm_per_prompt=value)) == 3


def test_other_modalities_counts_are_named_as_without_effect():
    # FastDeploy's ERNIE-4.5-VL launch lines: --limit-mm-per-prompt '{"image": 100, "video": 100}'.
    fastdeploy = '{"image": 100, "video": 100}'
    assert image_limit(ServingOptions(limit_mm_per_prompt=fastdeploy)) == 100
    (line,) = limit_notes(fastdeploy)
    assert line.startswith("--limit-mm-per-prompt video 100: no effect (fd reads images only")
    assert limit_notes("image=5,video=0") == [] and limit_notes(None) == []


def test_zero_images_and_ipv6_hosts_are_fine():
    options = ServingOptions(limit_mm_per_prompt='{"image": 0, "video": 0}', allowed_media_domains=["[::1]"])
    check_serving_options(options)
    assert image_limit(options) == 0


def test_run_batch_takes_the_same_flags():
    r = runner.invoke(app, ["run-batch", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for flag in ("--allowed-local-media-path", "--allowed-media-domains", "--limit-mm-per-prompt"):
        assert flag in r.output


def test_fd_serve_refuses_a_bad_flag_in_one_line(tiny_model):
    import subprocess
    import sys

    from server.fd_server import REPO, free_port

    for flag, value, words in (
        ("--limit-mm-per-prompt", '{"image": -1}', "'image' needs a count of 0 or more"),
        ("--allowed-local-media-path", "/no/such/folder", "is not a folder"),
    ):
        cmd = [
            sys.executable,
            "-m",
            "fdcli.main",
            "serve",
            "--model",
            str(tiny_model),
            "--port",
            str(free_port()),
        ]
        proc = subprocess.run([*cmd, flag, value], cwd=REPO, capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1 and words in lines[0], proc.stderr
