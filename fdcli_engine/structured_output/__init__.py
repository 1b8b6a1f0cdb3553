"""Structured outputs: the constraint a request carries (`StructuredOutputsParams`) and the grammar
backends that turn it into a token mask (`backend.py`; llguidance in `guidance.py`).

Leaf package: it imports fd's errors and the backend library only, so the serving layer (which
validates a constraint before it reaches the engine) and the runner (which masks the logits) share
one implementation of each rule.
"""

from fdcli_engine.structured_output.backend import (
    BACKEND_NAMES,
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    get_backend,
)
from fdcli_engine.structured_output.params import CONSTRAINT_FIELDS, StructuredOutputsParams

__all__ = [
    "BACKEND_NAMES",
    "CONSTRAINT_FIELDS",
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarMatcher",
    "StructuredOutputsParams",
    "get_backend",
]
