"""tests/ and tests/ernie on sys.path (tiny_models, ernie_archs), for the speculative decoding tests."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
for path in (_TESTS, _TESTS / "ernie"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
