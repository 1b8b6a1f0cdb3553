"""The OpenMP defaults of fd's engine processes (threads.set_engine_process_env): in the engine-core
process (core_proc.build_core) waiting threads sleep at once (KMP_BLOCKTIME=1) so they leave the cores to
the front end, and the threads are bound to CPUs (FD_CPU_OMP_THREADS_BIND=auto), unless the environment
says otherwise; a rank with its own CPU set (data or tensor parallel) is confined to it whatever the
environment says. A tensor-parallel rank (tp_worker) gets the same, but no default binding."""

from __future__ import annotations

import json
import os

import pytest

from fdcli_engine.api.core_proc import build_core
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner import tp_worker
from fdcli_engine.threads import set_omp_defaults

VARIABLES = ("KMP_BLOCKTIME", "FD_CPU_OMP_THREADS_BIND", "GLOG_minloglevel", "OMP_NUM_THREADS")


class StubCore:
    def __init__(self, config):
        self.config = config


@pytest.fixture
def env(monkeypatch):
    """A copy of os.environ without the variables under test, so nothing set here outlives the test (an
    in-process engine of a later test would read FD_CPU_OMP_THREADS_BIND and pin this process's threads),
    and a recorder in place of sched_setaffinity (pinning would confine pytest itself)."""
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in VARIABLES})
    pinned: list[tuple[int, set[int]]] = []
    monkeypatch.setattr(
        os, "sched_setaffinity", lambda pid, cpus: pinned.append((pid, set(cpus))), raising=False
    )
    return pinned


def test_core_sets_kmp_blocktime_unless_given(env):
    core, config = build_core(json.dumps({"max_model_len": 64, "num_threads": 3}), f"{__name__}:StubCore")
    assert isinstance(core, StubCore) and config.max_model_len == 64
    assert os.environ["KMP_BLOCKTIME"] == "1"
    assert os.environ["FD_CPU_OMP_THREADS_BIND"] == "auto"
    assert os.environ["GLOG_minloglevel"] == "1"
    assert os.environ["OMP_NUM_THREADS"] == "3"
    assert env == []  # no CPU set of its own: the process keeps the CPUs it was given
    os.environ.update(KMP_BLOCKTIME="50", FD_CPU_OMP_THREADS_BIND="nobind", GLOG_minloglevel="0")
    os.environ["OMP_NUM_THREADS"] = "7"
    build_core(json.dumps({"num_threads": 3}), f"{__name__}:StubCore")
    assert os.environ["KMP_BLOCKTIME"] == "50"
    assert os.environ["FD_CPU_OMP_THREADS_BIND"] == "nobind"
    assert os.environ["GLOG_minloglevel"] == "0"
    assert os.environ["OMP_NUM_THREADS"] == "7"


def _assert_pinned(env, cpus: list[int]) -> None:
    assert env == [(0, set(cpus))]
    assert os.environ["FD_CPU_OMP_THREADS_BIND"] == ",".join(map(str, cpus))
    assert os.environ["OMP_NUM_THREADS"] == str(len(cpus))
    assert os.environ["KMP_BLOCKTIME"] == "50"  # the environment's: only the CPU set is the rank's own
    assert os.environ["GLOG_minloglevel"] == "1"


def test_core_of_a_data_parallel_rank_is_pinned_to_its_cpus(env):
    # The front end's variables name every rank's CPUs and the whole machine's threads: the rank's win.
    os.environ.update(FD_CPU_OMP_THREADS_BIND="3|5", OMP_NUM_THREADS="64", KMP_BLOCKTIME="50")
    build_core(json.dumps({"cpus": [5], "num_threads": 1}), f"{__name__}:StubCore")
    _assert_pinned(env, [5])


def test_tensor_parallel_rank_is_pinned_to_its_cpus(env):
    os.environ.update(FD_CPU_OMP_THREADS_BIND="auto", OMP_NUM_THREADS="64", KMP_BLOCKTIME="50")
    tp_worker._pin(ResolvedConfig.from_json(json.dumps({"cpus": [2, 7], "num_threads": 2})))
    _assert_pinned(env, [2, 7])


def test_tensor_parallel_rank_without_cpus_is_not_bound_by_default(env):
    tp_worker._pin(ResolvedConfig.from_json(json.dumps({"num_threads": 2})))
    assert env == [] and "FD_CPU_OMP_THREADS_BIND" not in os.environ
    assert os.environ["KMP_BLOCKTIME"] == "1"
    assert os.environ["GLOG_minloglevel"] == "1"


@pytest.mark.parametrize("bind", [True, False])
def test_omp_defaults_of_an_in_process_engine(env, bind):
    """What the benchmarks give their in-process engine: the core's OpenMP settings and nothing else."""
    before = dict(os.environ)
    set_omp_defaults(bind=bind)
    added = {k: v for k, v in os.environ.items() if k not in before}
    assert added == {"KMP_BLOCKTIME": "1", **({"FD_CPU_OMP_THREADS_BIND": "auto"} if bind else {})}
    os.environ.update(KMP_BLOCKTIME="200", FD_CPU_OMP_THREADS_BIND="nobind")
    set_omp_defaults(bind=bind)
    assert os.environ["KMP_BLOCKTIME"] == "200" and os.environ["FD_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env == []
