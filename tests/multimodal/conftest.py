"""tests/ on sys.path so `tiny_models` and `tiny_vl` import; a tiny Qwen2.5-VL checkpoint built once."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_qwen_vl(tmp_path_factory) -> Path:
    import tiny_vl  # noqa: PLC0415

    return tiny_vl.make_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"))
