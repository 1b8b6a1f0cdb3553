"""The engine-core process's OpenMP defaults (core_proc.build_core): waiting threads sleep at once
(KMP_BLOCKTIME=1) so they leave the cores to the front end, and the threads are bound to CPUs
(FD_CPU_OMP_THREADS_BIND=auto), unless the environment says otherwise."""

from __future__ import annotations

import json
import os

from fdcli_engine.api.core_proc import build_core


class StubCore:
    def __init__(self, config):
        self.config = config


def test_core_sets_kmp_blocktime_unless_given(monkeypatch):
    # build_core writes os.environ: give it a copy, so nothing it sets outlives the test (an in-process
    # engine of a later test would read FD_CPU_OMP_THREADS_BIND and pin this process's threads).
    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ.pop("KMP_BLOCKTIME", None)
    os.environ.pop("FD_CPU_OMP_THREADS_BIND", None)
    core, config = build_core(json.dumps({"max_model_len": 64}), f"{__name__}:StubCore")
    assert isinstance(core, StubCore) and config.max_model_len == 64
    assert os.environ["KMP_BLOCKTIME"] == "1"
    assert os.environ["FD_CPU_OMP_THREADS_BIND"] == "auto"
    os.environ.update(KMP_BLOCKTIME="50", FD_CPU_OMP_THREADS_BIND="nobind")
    build_core(json.dumps({}), f"{__name__}:StubCore")
    assert os.environ["KMP_BLOCKTIME"] == "50"
    assert os.environ["FD_CPU_OMP_THREADS_BIND"] == "nobind"
