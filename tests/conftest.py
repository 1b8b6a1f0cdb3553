"""Shared test set-up: tests/ on sys.path (for tiny_models), threads claimed before paddle loads."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
sys.path.insert(0, str(Path(__file__).resolve().parent))
