"""vLLM's KV connector and multi-node data-parallel flags on `fd serve`: what fd has under another name
runs as that (vLLM's CPU offload is fd's --swap-space), the rest is one line naming fd's equivalent.
Connector names and rules: vllm/config/kv_transfer.py, vllm/distributed/kv_transfer/kv_connector/
factory.py, VllmConfig._post_init_kv_transfer_config (--kv-offloading-size/-backend)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fdcli.main import app
from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ConfigError
from fdcli_engine.vllm_compat import vllm_notes

runner = CliRunner()


def _serve(*argv: str):
    return runner.invoke(app, ["serve", *argv])


def _kv(connector: str, role: str | None = "kv_both", **extra) -> str:
    value = {"kv_connector": connector, **({"kv_role": role} if role else {}), **extra}
    return json.dumps(value)


def _refused(r, needle: str) -> None:
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert needle in r.stderr, r.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--kv-offloading-size", "4"],
        ["--kv-offloading-size", "4", "--kv-offloading-backend", "native"],
        ["--kv-offloading-size", "4", "--swap-space", "4"],
        [
            "--kv-transfer-config",
            _kv("OffloadingConnector", kv_connector_extra_config={"cpu_bytes_to_use": 4 << 30}),
        ],
    ],
)
def test_vllm_cpu_offload_is_the_memory_tier(captured, argv):
    r = _serve(*argv)
    assert r.exit_code == 0, r.output
    ((config, _),) = captured
    assert config.validate().swap_space == 4.0


def test_offload_from_python_as_vllm_keywords():
    assert EngineConfig(kv_offloading_size=2.5).validate().swap_space == 2.5
    config = EngineConfig(
        kv_transfer_config={
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30},
        }
    )
    assert config.validate().swap_space == 1.0
    assert EngineConfig(kv_transfer_config={"kv_role": "kv_both"}).validate().swap_space == 0.0


@pytest.mark.parametrize(
    "role,needle",
    [
        ("kv_producer", "--splitwise-role prefill --router HOST:PORT"),
        ("kv_consumer", "--splitwise-role decode --router HOST:PORT"),
        ("kv_both", "--splitwise-role prefill|decode --router HOST:PORT"),
    ],
)
@pytest.mark.parametrize("connector", ["NixlConnector", "P2pNcclConnector", "MooncakeConnector"])
def test_prefill_decode_connectors_name_fds_router(captured, connector, role, needle):
    r = _serve("--kv-transfer-config", _kv(connector, role))
    _refused(r, f"--kv-transfer-config kv_connector {connector} is not supported: use `fd router`")
    assert needle in r.stderr and not captured


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--kv-transfer-config", _kv("LMCacheConnectorV1")], "use fd's own KV tiers, --swap-space GB"),
        (["--kv-transfer-config", _kv("SharedStorageConnector")], "--kv-offload-dir DIR"),
        (["--kv-transfer-config", _kv("MultiConnector")], "one KV connector per instance"),
        (["--kv-transfer-config", _kv("MyConnector")], "fd loads no connector code"),
        (["--kv-transfer-config", _kv("NixlConnector", role=None)], "NixlConnector needs kv_role"),
        (["--kv-transfer-config", _kv("NixlConnector", role="kv_sender")], "kv_role 'kv_sender': use"),
        (["--kv-transfer-config", "[1]"], "--kv-transfer-config must be a JSON object"),
        (
            [
                "--kv-transfer-config",
                _kv("OffloadingConnector", kv_connector_extra_config={"num_cpu_blocks": 8}),
            ],
            "give kv_connector_extra_config.cpu_bytes_to_use (bytes), or fd's --swap-space GB",
        ),
        (["--kv-offloading-backend", "lmcache", "--kv-offloading-size", "4"], "lmcache is not supported"),
        (["--kv-offloading-backend", "native"], "needs --kv-offloading-size GB"),
        (["--kv-offloading-size", "4", "--swap-space", "2"], "ask for different memory tiers: give one"),
        (["--kv-offloading-size", "-1"], "--kv-offloading-size must be at least 0"),
        (
            ["--kv-offloading-size", "4", "--splitwise-role", "decode", "--router", "127.0.0.1:18399"],
            "--splitwise-role decode does not combine with --swap-space",
        ),
    ],
)
def test_kv_options_fd_does_not_run_are_one_line(captured, argv, needle):
    _refused(_serve(*argv), needle)
    assert not captured


def test_single_machine_data_parallel_lines_run(captured):
    argv = ["-dp", "2", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "0"]
    argv += ["--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", "18301", "-dpb", "mp"]
    r = _serve(*argv)
    assert r.exit_code == 0, r.output
    ((config, _),) = captured
    assert config.validate().data_parallel_size == 2
    notes = vllm_notes(config)
    assert any(n.startswith("--data-parallel-address has no effect") for n in notes)
    assert any(n.startswith("--data-parallel-rpc-port has no effect") for n in notes)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (
            ["-dp", "2", "--data-parallel-size-local", "1"],
            "--data-parallel-size-local 1 with --data-parallel-size 2",
        ),
        (["-dp", "2", "-dpl", "1", "-dpr", "1"], "--data-parallel-size-local 1"),
        (["--data-parallel-start-rank", "2"], "--data-parallel-start-rank 2 is not supported"),
        (["--data-parallel-backend", "ray"], "--distributed-executor-backend ray"),
        (["-dp", "2", "--headless"], "--headless is not supported"),
        (
            ["-dp", "2", "--data-parallel-rank", "1"],
            "--data-parallel-rank 1: not supported: fd serve balances",
        ),
        (["-dp", "2", "--data-parallel-external-lb"], "--data-parallel-external-lb: not supported"),
        (["-dp", "2", "-dpl", "2", "--data-parallel-hybrid-lb"], "--data-parallel-hybrid-lb: not supported"),
    ],
)
def test_multi_node_data_parallel_is_refused_naming_the_router(captured, argv, needle):
    r = _serve(*argv)
    _refused(r, needle)
    assert not captured


def test_cpu_offload_gb_is_a_note():
    assert any(
        n.startswith("--cpu-offload-gb 8 has no effect") for n in vllm_notes(EngineConfig(cpu_offload_gb=8))
    )
    assert not any("cpu-offload" in n for n in vllm_notes(EngineConfig(cpu_offload_gb=0)))
    with pytest.raises(ConfigError, match="--data-parallel-size-local"):
        EngineConfig(data_parallel_size=2, data_parallel_size_local=1).validate()


def test_vllm_executor_backends(captured):
    # vLLM's choices: mp, uni (one process), ray, external_launcher (vllm/config/parallel.py).
    assert _serve("--distributed-executor-backend", "uni").exit_code == 0
    ((config, _),) = captured
    assert config.validate().distributed_executor_backend == "uni"
    _refused(_serve("-tp", "2", "--distributed-executor-backend", "uni"), "uni runs one process")
    _refused(
        _serve("--distributed-executor-backend", "external_launcher"), "external_launcher is not supported"
    )
    _refused(_serve("--distributed-executor-backend", "spark"), "'spark': use mp, uni or ray")


@pytest.mark.parametrize("text,gib", [("4G", 4.0), ("536870912", 0.5), ("2048M", 2.0)])
def test_kv_cache_memory_bytes_is_the_cache_size(captured, text, gib):
    # vLLM reads --kv-cache-memory-bytes as a human-readable integer (G = 2**30, vllm/engine/arg_utils.py).
    assert _serve("--kv-cache-memory-bytes", text).exit_code == 0
    ((config, _),) = captured
    assert config.validate().kv_cache_memory_gb == gib
    assert EngineConfig(kv_cache_memory_bytes=1 << 30).validate().kv_cache_memory_gb == 1.0


def test_kv_cache_memory_bytes_must_be_positive(captured):
    _refused(_serve("--kv-cache-memory-bytes", "0"), "--kv-cache-memory-bytes must be positive")
    _refused(_serve("--kv-cache-memory-bytes", "lots"), "--kv-cache-memory-bytes must be an integer")
