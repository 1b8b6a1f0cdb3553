"""Tokenizers, chat templates and incremental detokenization (leaf package: no paddle, no engine)."""

from __future__ import annotations

import os
from typing import Any

from fdcli_engine.tokenizer.detokenizer import IncrementalDetokenizer
from fdcli_engine.tokenizer.tokenizer import Tokenizer


def load_tokenizer(config_or_path: Any = None) -> Tokenizer:
    """Tokenizer for an EngineConfig (its --tokenizer, else its model) or for a path; None: the default model."""
    from fdcli_engine.config import resolve_model_path

    if config_or_path is None or isinstance(config_or_path, (str, os.PathLike)):
        source = config_or_path
    else:
        source = (
            getattr(config_or_path, "tokenizer", None)
            or getattr(config_or_path, "model_path", None)
            or getattr(config_or_path, "model", None)
        )
    return Tokenizer.from_model(resolve_model_path(source))


__all__ = ["IncrementalDetokenizer", "Tokenizer", "load_tokenizer"]
