"""Tensor parallel's configuration, without an engine: each rank's CPUs (with and without data
parallel) and what a model must allow (parallel_config.check_tensor_parallel_model)."""

from __future__ import annotations

import pytest

from fdcli_engine.api.dp_rank import rank_configs
from fdcli_engine.errors import ConfigError
from fdcli_engine.parallel_config import check_tensor_parallel_model, tp_cpu_sets
from fdcli_engine.resolved_config import ResolvedConfig

DENSE = dict(num_attention_heads=8, num_key_value_heads=4, intermediate_size=1536)
MOE = dict(DENSE, moe_num_experts=6, moe_intermediate_size=96, moe_num_shared_experts=1)


def test_dp_ranks_carry_their_tp_ranks_cpus(monkeypatch):
    monkeypatch.setenv("FD_CPU_OMP_THREADS_BIND", "0|1|1|0")  # one list per rank: DP-major, TP-minor
    configs = rank_configs(ResolvedConfig(data_parallel_size=2, tensor_parallel_size=2))
    assert [c.tp_rank_cpus for c in configs] == [[[0], [1]], [[1], [0]]]
    assert [(c.data_parallel_rank, c.cpus, c.num_threads) for c in configs] == [(0, [0], 1), (1, [1], 1)]


def test_tp_ranks_split_the_engines_cpus():
    assert tp_cpu_sets(ResolvedConfig(tensor_parallel_size=2, cpus=[4, 5, 6, 7])) == [[4, 5], [6, 7]]


@pytest.mark.parametrize(
    ("hf", "tp", "ep", "message"),
    [
        (dict(DENSE, num_key_value_heads=3), 2, False, "3 KV heads do not divide by tensor-parallel size 2"),
        (dict(DENSE, num_attention_heads=12), 8, False, "4 KV heads do not divide by tensor-parallel size 8"),
        (dict(DENSE, intermediate_size=1002), 4, False, "intermediate_size 1002 does not divide"),
        (MOE, 4, True, "6 experts do not divide by tensor-parallel size 4"),
        (dict(MOE, moe_intermediate_size=90), 4, False, "moe_intermediate_size 90 does not divide"),
    ],
)
def test_model_that_does_not_split_is_refused(hf, tp, ep, message):
    config = ResolvedConfig(tensor_parallel_size=tp, enable_expert_parallel=ep)
    with pytest.raises(ConfigError, match=message):
        check_tensor_parallel_model(hf, config)


@pytest.mark.parametrize(("hf", "ep"), [(DENSE, False), (MOE, False), (dict(MOE, moe_num_experts=8), True)])
def test_models_that_split_pass(hf, ep):
    check_tensor_parallel_model(hf, ResolvedConfig(tensor_parallel_size=2, enable_expert_parallel=ep))


def test_pooling_model_refused_with_tensor_parallel(tmp_path):
    import tiny_models

    from fdcli_engine.config import EngineConfig
    from fdcli_engine.config_resolver import resolve_config

    folder = tiny_models.make_tiny_bert(tmp_path)
    with pytest.raises(ConfigError, match="^--tensor-parallel-size 2 runs generative models only"):
        resolve_config(EngineConfig(model=str(folder), tensor_parallel_size=2))
